//! Starts real `ferroplasma store` processes on temporary sockets.
#![allow(dead_code)]

use ferroplasma_client::Client;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A store process that is killed (and its directory removed) on drop.
pub struct TestStore {
    pub child: Option<Child>,
    pub dir: PathBuf,
    pub socket: PathBuf,
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_ferroplasma")
}

/// Runs `ferroplasma store --memory 8MiB --socket SOCKET EXTRA...` to
/// completion (for starts that must fail).
pub fn run_store_once(socket: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(bin())
        .args(["store", "--memory", "8MiB", "--socket"])
        .arg(socket)
        .args(extra)
        .output()
        .expect("run ferroplasma store")
}

pub fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "fp-test-{tag}-{}-{}",
        std::process::id(),
        &ferroplasma_client::ObjectId::random().to_hex()[..8]
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

impl TestStore {
    pub fn start(memory: &str) -> Self {
        Self::start_with(memory, &[])
    }

    pub fn start_with(memory: &str, extra: &[&str]) -> Self {
        Self::start_in(None, memory, extra)
    }

    /// Starts the store inside network namespace `netns` (with `ip netns
    /// exec`, which execs the store: the child is the store itself).
    pub fn start_in(netns: Option<&str>, memory: &str, extra: &[&str]) -> Self {
        let dir = temp_dir("store");
        let socket = dir.join("store.sock");
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, bin()]);
                c
            }
            None => Command::new(bin()),
        };
        let child = cmd
            .args(["store", "--memory", memory, "--socket"])
            .arg(&socket)
            .args(extra)
            .env("FERROPLASMA_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn ferroplasma store");
        let s = Self {
            child: Some(child),
            dir,
            socket,
        };
        s.wait_ready();
        s
    }

    pub fn wait_ready(&self) {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(20) {
            if Client::connect(Some(&self.socket)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("store did not come up on {}", self.socket.display());
    }

    pub fn client(&self) -> Client {
        Client::connect(Some(&self.socket)).expect("connect")
    }

    pub fn path(&self) -> &Path {
        &self.socket
    }

    /// The store process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.as_mut().unwrap().try_wait(), Ok(None))
    }

    /// Waits until `f` holds (the store processes disconnects asynchronously).
    pub fn eventually(&self, what: &str, mut f: impl FnMut() -> bool) {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if f() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("timed out waiting for: {what}");
    }
}

impl Drop for TestStore {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Bytes derived from the id (xorshift), so a reader can check what it got.
pub fn content(id: ferroplasma_client::ObjectId, len: usize) -> Vec<u8> {
    let mut x = u64::from_le_bytes(id.0[..8].try_into().unwrap()) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
