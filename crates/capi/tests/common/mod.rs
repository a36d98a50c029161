//! A real store in this process, and C/C++ programs built against
//! libferroplasma, for the tests of the C library.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Held while a store starts in this process and while a compiler runs:
/// the store sets the process's umask to 0177 for the instant it binds its
/// socket, and a compiler forked in that instant would write a program
/// nobody may execute ("Permission denied", seen in CI).
static UMASK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A store running on a thread of this process until the process exits.
pub struct Store {
    pub socket: PathBuf,
}

impl Store {
    pub fn start(tag: &str, memory: u64) -> Self {
        let _umask = UMASK.lock().unwrap_or_else(|e| e.into_inner());
        let dir = std::env::temp_dir().join(format!("fp-capi-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("store.sock");
        let _ = std::fs::remove_file(&socket);
        let mut cfg = ferroplasma_daemon::config::StoreConfig::new();
        cfg.memory = Some(memory);
        cfg.socket = Some(socket.clone());
        std::thread::spawn(move || {
            if let Err(e) = ferroplasma_daemon::server::run(cfg) {
                panic!("the test store failed: {e}");
            }
        });
        let t = Instant::now();
        while ferroplasma_client::Client::connect(Some(&socket)).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "the store did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Store { socket }
    }

    pub fn client(&self) -> ferroplasma_client::Client {
        ferroplasma_client::Client::connect(Some(&self.socket)).unwrap()
    }
}

/// Where cargo put libferroplasma.so for this test run.
pub fn lib_dir() -> PathBuf {
    let deps = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    for dir in [deps.clone(), deps.parent().unwrap().to_path_buf()] {
        if dir.join("libferroplasma.so").exists() {
            return dir;
        }
    }
    panic!("libferroplasma.so is not beside {}", deps.display());
}

pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Compiles `sources` with `compiler` against the library and its header;
/// returns the program's path.
pub fn build(compiler: &str, name: &str, sources: &[&Path], extra: &[&str]) -> PathBuf {
    // Tests run in parallel: each build gets its own file, so none runs a
    // program another is still writing ("Text file busy").
    static BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = std::env::temp_dir().join(format!("fp-capi-{}-{n}-{name}", std::process::id()));
    let lib = lib_dir();
    let include = crate_dir().join("include");
    let mut cmd = Command::new(compiler);
    cmd.args(sources)
        .arg(format!("-I{}", include.display()))
        .args(["-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&out)
        .args(extra)
        .arg(format!("-L{}", lib.display()))
        .arg("-lferroplasma")
        .arg(format!("-Wl,-rpath,{}", lib.display()));
    let o = {
        let _umask = UMASK.lock().unwrap_or_else(|e| e.into_inner());
        cmd.output()
            .unwrap_or_else(|e| panic!("running {compiler}: {e}"))
    };
    assert!(
        o.status.success(),
        "{compiler} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}
