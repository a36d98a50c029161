//! Compiles the peer protocol (proto/ferroplasma/cluster/v1/cluster.proto)
//! into tonic client and server code. protox parses the schema in pure Rust,
//! so no `protoc` needs to be installed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let file = root.join("ferroplasma/cluster/v1/cluster.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let fds = protox::compile([&file], [&root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
