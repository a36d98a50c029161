//! Compiles proto/ferroplasma/store/v1/store.proto with protox (pure Rust, so
//! no `protoc` needs to be installed) and generates the prost types.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let file = root.join("ferroplasma/store/v1/store.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let fds = protox::compile([&file], [&root])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
