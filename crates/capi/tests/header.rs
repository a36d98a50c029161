//! include/ferroplasma.h is what cbindgen makes of this crate now. `make
//! header` (FP_WRITE_HEADER=1) rewrites it; `make lint` runs this test.

#[test]
fn the_committed_header_matches_the_code() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).unwrap();
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(config)
        .generate()
        .expect("cbindgen could not read the crate")
        .write(&mut out);
    let path = dir.join("include/ferroplasma.h");
    if std::env::var_os("FP_WRITE_HEADER").is_some() {
        std::fs::write(&path, &out).unwrap();
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == out,
        "include/ferroplasma.h is out of date with crates/capi: run `make header` and commit it"
    );
}
