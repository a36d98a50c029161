//! The store tried as an attacker would (docs/security.md): other users on
//! the host, files under the store's feet, hostile sizes. Each test runs
//! real store processes; those that need a second user are named `root_`
//! and run when `make test` runs as root.

mod common;

use common::{bin, content, temp_dir};
use ferroplasma_client::{Client, ClientError, ObjectId};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A store whose log goes to a file the test reads.
struct LoggedStore {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
    log: PathBuf,
}

impl LoggedStore {
    fn start(memory: &str, extra: &[&str]) -> Self {
        let dir = temp_dir("trust");
        let (socket, log) = (dir.join("store.sock"), dir.join("store.log"));
        let child = Command::new(bin())
            .args(["store", "--memory", memory, "--socket"])
            .arg(&socket)
            .args(extra)
            .env("FERROPLASMA_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn ferroplasma store");
        let t = Instant::now();
        while Client::connect(Some(&socket)).is_err() {
            assert!(t.elapsed() < Duration::from_secs(20), "store did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        Self {
            child,
            dir,
            socket,
            log,
        }
    }

    fn client(&self) -> Client {
        Client::connect(Some(&self.socket)).expect("connect")
    }

    fn log_lines(&self, containing: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(containing))
            .count()
    }

    /// CPU seconds the store process has used (user + system).
    fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        let after = stat.rsplit_once(')').unwrap().1;
        let f: Vec<&str> = after.split_whitespace().collect();
        let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        ticks as f64
            / nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
                .unwrap()
                .unwrap() as f64
    }
}

impl Drop for LoggedStore {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn only_subdir(parent: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(parent)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs[0].clone()
}

// ------------------------------------------------------------ spill directory

#[test]
fn the_spill_directory_is_private_and_not_named_by_pid() {
    use std::os::unix::fs::PermissionsExt;
    let parent = temp_dir("spill-private");
    let store = LoggedStore::start("1MiB", &["--spill-dir", parent.to_str().unwrap()]);
    let c = store.client();
    for _ in 0..6 {
        let id = ObjectId::random();
        c.put(id, &content(id, 300_000), b"").unwrap();
    }
    let dir = only_subdir(&parent);
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    assert_ne!(
        name,
        format!("ferroplasma-spill-{}", store.child.id()),
        "predictable"
    );
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "spill directory mode {mode:o}");
    let mut segments = 0;
    for f in std::fs::read_dir(&dir).unwrap().flatten() {
        let mode = f.metadata().unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{} has mode {mode:o}", f.path().display());
        segments += 1;
    }
    assert!(segments > 0, "nothing was spilled");
    drop(store);
    let _ = std::fs::remove_dir_all(&parent);
}

#[test]
fn a_spill_directory_removed_under_load_is_an_error_at_once_not_a_spin() {
    let parent = temp_dir("spill-gone");
    let store = LoggedStore::start("1MiB", &["--spill-dir", parent.to_str().unwrap()]);
    let c = store.client();
    let mut ids = Vec::new();
    for _ in 0..8 {
        let id = ObjectId::random();
        c.put(id, &content(id, 200_000), b"").unwrap();
        ids.push(id);
    }
    let spilled = c.stats().unwrap().spilled_objects;
    assert!(spilled >= 3, "{spilled} spilled");
    // The whole directory goes, its parent with it: no new one can be made.
    std::fs::remove_dir_all(&parent).unwrap();
    let cpu_before = store.cpu_seconds();
    let t = Instant::now();
    let mut refusals = 0;
    while t.elapsed() < Duration::from_secs(2) {
        for size in [200_000, 100] {
            let id = ObjectId::random();
            let asked = Instant::now();
            match c.put(id, &content(id, size), b"") {
                Ok(()) => {}
                Err(e) => {
                    assert!(matches!(e, ClientError::StoreFull(_)), "{e}");
                    assert!(e.to_string().contains("spill"), "{e}");
                    refusals += 1;
                }
            }
            let took = asked.elapsed();
            assert!(took < Duration::from_secs(1), "a put took {took:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(refusals > 10, "{refusals} refusals");
    let cpu = store.cpu_seconds() - cpu_before;
    assert!(cpu < 1.0, "the store used {cpu:.2} s of CPU in 2 s");
    assert!(
        store.log_lines("spill") < 10,
        "{} log lines about spilling:\n{}",
        store.log_lines("spill"),
        std::fs::read_to_string(&store.log).unwrap()
    );
    // The spilled objects are reported lost: absent, never present but
    // unreadable; the objects in memory read back exactly.
    let present = c.contains(&ids).unwrap();
    assert_eq!(
        present.iter().filter(|p| !**p).count() as u64,
        spilled,
        "{present:?}"
    );
    assert_eq!(store.log_lines("are lost"), 1);
    for (id, here) in ids.iter().zip(&present) {
        let got = c.get(&[*id], Some(Duration::ZERO)).unwrap().remove(0);
        match (here, got) {
            (true, Some(b)) => assert_eq!(b.data(), &content(*id, 200_000)[..]),
            (false, None) => {}
            (here, got) => panic!("contains said {here}, get gave {:?}", got.is_some()),
        }
    }
    // The directory comes back: spilling works again within a second or two.
    std::fs::create_dir_all(&parent).unwrap();
    let t = Instant::now();
    loop {
        let id = ObjectId::random();
        if c.put(id, &content(id, 200_000), b"").is_ok() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "spilling never recovered"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(store.log_lines("spilling goes on in a new one") + store.log_lines("works again") >= 1);
    drop(store);
    let _ = std::fs::remove_dir_all(&parent);
}
