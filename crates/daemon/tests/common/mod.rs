//! Starts real `ferroplasma store` processes on temporary sockets.
#![allow(dead_code)]

pub mod attacker;
pub mod cluster;

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

/// The store binary: this build's, or `$FP_TEST_STORE_BIN` (to run a test
/// against another build, e.g. main's, to see it fail there).
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("FP_TEST_STORE_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_ferroplasma").into())
    })
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
            .env(
                "FERROPLASMA_LOG",
                std::env::var("FP_TEST_STORE_LOG").unwrap_or_else(|_| "warn".into()),
            )
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

    /// Sends the store process a signal (`kill` with `sig`, e.g. "-STOP").
    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().unwrap().id().to_string();
        assert!(Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success());
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

/// Three network namespaces on one bridge (removed on drop), when this
/// machine allows it (root, iproute2); `None` otherwise.
pub struct Namespaces {
    pub names: Vec<String>,
    bridge: String,
}

impl Namespaces {
    pub fn create(n: usize) -> Option<Self> {
        let tag = std::process::id() % 100_000;
        let bridge = format!("fpbr{tag}");
        let names: Vec<String> = (0..n).map(|i| format!("fp-t{tag}-{i}")).collect();
        let net = Namespaces { names, bridge };
        let subnet = 10 + tag % 200;
        let mut script = format!(
            "ip link add {b} type bridge && ip link set {b} up",
            b = net.bridge
        );
        for (i, ns) in net.names.iter().enumerate() {
            script += &format!(
                " && ip netns add {ns} && ip link add fpv{tag}{i} type veth peer name fpi{tag}{i} \
                 && ip link set fpi{tag}{i} netns {ns} && ip link set fpv{tag}{i} master {b} \
                 && ip link set fpv{tag}{i} up && ip -n {ns} addr add 10.233.{subnet}.{h}/24 dev fpi{tag}{i} \
                 && ip -n {ns} link set fpi{tag}{i} up && ip -n {ns} link set lo up",
                b = net.bridge,
                h = i + 1
            );
        }
        let ok = Command::new("sh")
            .args(["-c", &script])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return None; // net's Drop cleans up what was made
        }
        Some(net)
    }

    /// Member `i`'s address (port 7400 in its namespace).
    pub fn addr(&self, i: usize) -> String {
        let tag = std::process::id() % 100_000;
        format!("10.233.{}.{}:7400", 10 + tag % 200, i + 1)
    }
}

impl Namespaces {
    /// Cuts (`up` false) or heals member `i`'s link to the bridge.
    pub fn link(&self, i: usize, up: bool) {
        let tag = std::process::id() % 100_000;
        let state = if up { "up" } else { "down" };
        let ok = Command::new("ip")
            .args(["link", "set", &format!("fpv{tag}{i}"), state])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip link set {state}");
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        let mut script = format!("ip link del {} 2>/dev/null;", self.bridge);
        for ns in &self.names {
            script += &format!(" ip netns del {ns} 2>/dev/null;");
        }
        let _ = Command::new("sh").args(["-c", &script]).status();
    }
}
