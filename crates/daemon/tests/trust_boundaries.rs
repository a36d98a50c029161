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

// ------------------------------------------------- raw access to descriptors

/// Connects by hand, as a hostile client would, and keeps every descriptor
/// the store sends: the arena, the table and the holds region.
fn raw_handshake(
    socket: &Path,
) -> (
    ferroplasma_protocol::pb::ConnectReply,
    Vec<std::os::fd::OwnedFd>,
) {
    use ferroplasma_protocol::frame::{write_message, FrameCodec};
    use ferroplasma_protocol::pb::{self, reply, request};
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    let req = pb::Request {
        request_id: 1,
        body: Some(request::Body::Connect(pb::Connect {
            protocol_version: ferroplasma_protocol::PROTOCOL_VERSION,
            client_name: "attacker".into(),
        })),
    };
    write_message(&mut s, &req).unwrap();
    let (mut fds, mut buf, mut chunk) = (Vec::new(), bytes::BytesMut::new(), vec![0u8; 4096]);
    loop {
        if let Some(r) = FrameCodec::REPLIES
            .decode_message::<pb::Reply>(&mut buf)
            .unwrap()
        {
            let Some(reply::Body::Connect(c)) = r.body else {
                panic!("no Connect reply: {r:?}");
            };
            std::mem::forget(s); // the connection stays open while the test runs
            return (c, fds);
        }
        let mut cmsg = nix::cmsg_space!([RawFd; 8]);
        let mut iov = [std::io::IoSliceMut::new(&mut chunk)];
        let msg =
            recvmsg::<()>(s.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::empty()).unwrap();
        let n = msg.bytes;
        for c in msg.cmsgs().unwrap() {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // Safety: the kernel just installed these descriptors for us.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        assert!(n > 0, "the store hung up during the handshake");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Whether `fd` can be written in any way: reopened read-write through
/// /proc, then written or mapped shared and writable.
fn writable_somehow(fd: &std::os::fd::OwnedFd) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) => return Err(format!("reopen refused: {e}")),
    };
    let mut why = Vec::new();
    match std::os::unix::fs::FileExt::write_at(&f, &[0u8; 8], 4096) {
        Ok(_) => return Ok(()),
        Err(e) => why.push(format!("write refused: {e}")),
    }
    // Safety: a fresh mapping of a file nobody else in this process maps;
    // it is unmapped at once.
    match unsafe { memmap2::MmapOptions::new().len(4096).map_mut(&f) } {
        Ok(_) => Ok(()),
        Err(e) => {
            why.push(format!("writable mapping refused: {e}"));
            Err(why.join("; "))
        }
    }
}

#[test]
fn a_client_that_truncates_its_holds_region_cannot_crash_the_store() {
    let mut store = LoggedStore::start("16MiB", &[]);
    let (reply, fds) = raw_handshake(&store.socket);
    assert!(reply.table_slots > 0 && fds.len() == 3, "{reply:?}");
    let holds = std::fs::File::from(fds.into_iter().nth(2).unwrap());
    let truncated = holds.set_len(0);
    // The store reads every client's holds region for stats and on every
    // retire (a delete): it is still there, and serving.
    let c = store.client();
    for _ in 0..10 {
        let id = ObjectId::random();
        let _ = c.put(id, &content(id, 1000), b"");
        let _ = c.delete(&[id]);
    }
    let _ = c.stats();
    assert!(matches!(store.child.try_wait(), Ok(None)), "the store died");
    assert!(truncated.is_err(), "the holds region could be truncated");
}

#[test]
fn the_shared_table_cannot_be_written_however_it_is_reopened() {
    let store = LoggedStore::start("16MiB", &[]);
    let (reply, fds) = raw_handshake(&store.socket);
    assert!(
        reply.table_slots > 0 && fds.len() == 3,
        "{reply:?}, {} fds",
        fds.len()
    );
    let refused = writable_somehow(&fds[1]);
    assert!(refused.is_err(), "the table was writable after a reopen");
    // The store's own user still writes its objects (the arena), and a
    // client reads them through the table as before.
    let c = store.client();
    let id = ObjectId::random();
    c.put(id, &content(id, 1000), b"").unwrap();
    let b = c
        .get(&[id], Some(Duration::ZERO))
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(b.data(), &content(id, 1000)[..]);
}

// ------------------------------------------------------------- other users

/// Runs this test binary's `child` test as uid/gid 65534 (nobody) with
/// `env`, and returns what it printed after `RESULT `.
fn as_nobody(child: &str, env: &[(&str, String)]) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            child,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.lines()
        .find_map(|l| l.split_once("RESULT ").map(|(_, r)| r.to_string()))
        .unwrap_or_else(|| {
            panic!(
                "child said nothing: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

fn become_nobody() {
    nix::unistd::setgroups(&[]).unwrap();
    nix::unistd::setgid(nix::unistd::Gid::from_raw(65534)).unwrap();
    nix::unistd::setuid(nix::unistd::Uid::from_raw(65534)).unwrap();
}

fn open_to_all(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
}

/// Child process: another user allowed by the store tries to change an
/// object it did not create, every way it can.
#[test]
#[ignore = "helper: runs only as a child process of a root_ test"]
fn child_reader_tries_to_write() {
    let Ok(socket) = std::env::var("FP_TRUST_SOCKET") else {
        return;
    };
    let id = ObjectId::from_hex(&std::env::var("FP_TRUST_ID").unwrap()).unwrap();
    become_nobody();
    let result = (|| -> Result<(), String> {
        let c = Client::connect(Some(socket.as_ref())).map_err(|e| e.to_string())?;
        if !c.read_only() {
            return Err("the store gave another user write access".into());
        }
        let b = c
            .get(&[id], Some(Duration::ZERO))
            .map_err(|e| e.to_string())?
            .remove(0);
        if b.map(|b| b.data().to_vec()) != Some(content(id, 100_000)) {
            return Err("could not read the owner's object".into());
        }
        let (_, fds) = raw_handshake(socket.as_ref());
        if writable_somehow(&fds[0]).is_ok() {
            return Err("the arena was writable".into());
        }
        match c.create(ObjectId::random(), 100_000, b"") {
            Err(ClientError::PermissionDenied(_)) => {}
            other => return Err(format!("create: {:?}", other.map(|_| ()))),
        }
        match c.delete(&[id]) {
            Err(ClientError::PermissionDenied(_)) => {}
            other => return Err(format!("delete: {other:?}")),
        }
        match c.evict(1 << 30) {
            Err(ClientError::PermissionDenied(_)) => {}
            other => return Err(format!("evict: {:?}", other.map(|_| ()))),
        }
        // Not even by value: its objects could evict the owner's, or take
        // ids the owner's programs expect.
        let mine = ObjectId::random();
        match c.put(mine, &content(mine, 1000), b"") {
            Err(ClientError::PermissionDenied(_)) => {}
            other => return Err(format!("put: {other:?}")),
        }
        if !c.contains(&[id]).map_err(|e| e.to_string())?[0] {
            return Err("contains lost the owner's object".into());
        }
        Ok(())
    })();
    match result {
        Ok(()) => println!("RESULT ok"),
        Err(e) => println!("RESULT failed: {e}"),
    }
}

#[test]
#[ignore = "needs root (a client of another user): make test runs it when root"]
fn root_another_allowed_user_reads_but_cannot_change_a_byte() {
    assert!(nix::unistd::geteuid().is_root(), "needs root");
    let store = LoggedStore::start("16MiB", &["--socket-mode", "666", "--allow-uid", "0,65534"]);
    open_to_all(&store.dir);
    let c = store.client();
    assert!(!c.read_only(), "the store's own user writes");
    let id = ObjectId::random();
    c.put(id, &content(id, 100_000), b"").unwrap();
    let said = as_nobody(
        "child_reader_tries_to_write",
        &[
            ("FP_TRUST_SOCKET", store.socket.display().to_string()),
            ("FP_TRUST_ID", id.to_hex()),
        ],
    );
    assert_eq!(said, "ok");
    let got = c
        .get(&[id], Some(Duration::ZERO))
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(
        got.data(),
        &content(id, 100_000)[..],
        "the owner's object changed"
    );
    assert_eq!(
        c.stats().unwrap().objects,
        1,
        "nothing was added or evicted"
    );
}

#[test]
#[ignore = "needs root (a store of another user): make test runs it when root"]
fn root_a_store_run_by_another_user_is_refused_with_its_owner_named() {
    assert!(nix::unistd::geteuid().is_root(), "needs root");
    use std::os::unix::process::CommandExt;
    // Another user gets to the socket path first (a squatter), letting
    // everyone in.
    let dir = temp_dir("squat");
    open_to_all(&dir);
    let socket = dir.join("store.sock");
    let mut squatter = Command::new(bin())
        .args([
            "store",
            "--memory",
            "8MiB",
            "--socket-mode",
            "666",
            "--allow-uid",
            "0,65534",
            "--socket",
        ])
        .arg(&socket)
        .uid(65534)
        .gid(65534)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let err = loop {
        match Client::connect(Some(&socket)) {
            Err(ClientError::StoreUnavailable { .. }) if t.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => break e,
            Ok(_) => panic!("a client connected to another user's store"),
        }
    };
    assert!(matches!(err, ClientError::PermissionDenied(_)), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("uid 65534") && msg.contains("FERROPLASMA_TRUST_UID=65534"),
        "{msg}"
    );
    // Named, it is trusted: by the option, and by the environment (the CLI).
    Client::connect_trusting(Some(&socket), &[65534])
        .unwrap()
        .stats()
        .unwrap();
    let cli = |trust: Option<&str>| {
        let mut cmd = Command::new(bin());
        cmd.args(["stats", "--socket"]).arg(&socket);
        if let Some(t) = trust {
            cmd.env("FERROPLASMA_TRUST_UID", t);
        }
        cmd.output().unwrap()
    };
    let refused = cli(None);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("uid 65534"));
    assert!(cli(Some("65534")).status.success());
    let bad = cli(Some("nobody"));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("is not a uid"),
        "{bad:?}"
    );
    let _ = squatter.kill();
    let _ = squatter.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------- hostile sizes

#[test]
fn batches_of_a_million_ids_work_and_the_client_stays_usable() {
    let store = LoggedStore::start("64MiB", &[]);
    let c = store.client();
    let real: Vec<ObjectId> = (0..1000).map(|_| ObjectId::random()).collect();
    for id in &real {
        c.put(*id, &content(*id, 100), b"").unwrap();
    }
    let mut ids: Vec<ObjectId> = (0..999_000).map(|_| ObjectId::random()).collect();
    ids.extend(&real);
    let got = c.get(&ids, Some(Duration::ZERO)).unwrap();
    assert_eq!(got.len(), ids.len());
    assert_eq!(got.iter().filter(|b| b.is_some()).count(), real.len());
    for (id, b) in ids.iter().zip(&got).skip(999_000) {
        assert_eq!(b.as_ref().unwrap().data(), &content(*id, 100)[..]);
    }
    drop(got); // a million releases
    let present = c.contains(&ids).unwrap();
    assert_eq!(present.iter().filter(|p| **p).count(), real.len());
    let deleted = c.delete(&ids).unwrap();
    assert_eq!(deleted.len(), ids.len());
    assert!(c.contains(&real).unwrap().iter().all(|p| !p), "all deleted");
    // Still usable.
    let id = ObjectId::random();
    c.put(id, b"after", b"").unwrap();
    assert!(c.contains(&[id]).unwrap()[0]);
}

#[test]
fn the_worst_flag_values_are_refused_in_one_line_with_status_2() {
    let dir = temp_dir("flags");
    let socket = dir.join("s.sock");
    let s = socket.to_str().unwrap();
    let cases: &[&[&str]] = &[
        &[
            "store",
            "-m",
            "64MiB",
            "--table-slots",
            "100000000",
            "-s",
            s,
        ],
        &[
            "store",
            "-m",
            "8MiB",
            "--cluster-listen",
            "127.0.0.1:0",
            "--cluster-token",
            "t",
            "--peer-timeout",
            "200000000000years",
            "-s",
            s,
        ],
        &[
            "store",
            "-m",
            "8MiB",
            "--heartbeat-interval",
            "25h",
            "-s",
            s,
        ],
        &["stats", "--watch", "1e300", "-s", s],
        &["stats", "--watch", "-1", "-s", s],
    ];
    for args in cases {
        let t = Instant::now();
        let out = Command::new(bin()).args(*args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{args:?} took {:?}",
            t.elapsed()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Child process: another user opens all the connections it can and holds
/// them until its stdin closes.
#[test]
#[ignore = "helper: runs only as a child process of a root_ test"]
fn child_reader_takes_every_slot() {
    let Ok(socket) = std::env::var("FP_TRUST_SOCKET") else {
        return;
    };
    become_nobody();
    let mut held = Vec::new();
    for _ in 0..8 {
        if let Ok(c) = Client::connect(Some(socket.as_ref())) {
            held.push(c);
        }
    }
    println!("RESULT {}", held.len());
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

#[test]
#[ignore = "needs root (a client of another user): make test runs it when root"]
fn root_other_users_cannot_take_the_owners_connection_slots() {
    use std::io::BufRead;
    assert!(nix::unistd::geteuid().is_root(), "needs root");
    let store = LoggedStore::start(
        "16MiB",
        &[
            "--socket-mode",
            "666",
            "--allow-uid",
            "0,65534",
            "--max-clients",
            "4",
        ],
    );
    open_to_all(&store.dir);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_reader_takes_every_slot",
            "--ignored",
            "--nocapture",
        ])
        .args(["--test-threads=1"])
        .env("FP_TRUST_SOCKET", &store.socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let said = loop {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the child said nothing"
        );
        if let Some((_, n)) = line.trim().split_once("RESULT ") {
            break n.to_string();
        }
    };
    assert_eq!(
        said, "2",
        "another user got more than half of --max-clients 4"
    );
    // While it holds them, the store's own user still gets in, twice.
    let (a, b) = (store.client(), store.client());
    a.stats().unwrap();
    b.stats().unwrap();
    drop(child.stdin.take());
    child.wait().unwrap();
}
