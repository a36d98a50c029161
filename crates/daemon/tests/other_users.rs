//! Another user on the host, tried as an attacker (docs/security.md): one
//! the store allows (a reader) and one who gets to the socket path first
//! (a squatter). The tests run a child process as uid 65534 and need root:
//! `make test` runs them when root (`root_`), elsewhere they are ignored.

mod common;

use common::attacker::{raw_handshake, writable_somehow, LoggedStore};
use common::{bin, content, temp_dir};
use ferroplasma_client::{Client, ClientError, ObjectId};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
    // Allowed by uid, and by group: a reader either way.
    for allow in [["--allow-uid", "0,65534"], ["--allow-gid", "65534"]] {
        let mut flags = vec!["--socket-mode", "666"];
        flags.extend(allow);
        let store = LoggedStore::start("16MiB", &flags);
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
        assert_eq!(said, "ok", "{allow:?}");
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

/// Child process: another user tries to use the store.
#[test]
#[ignore = "helper: runs only as a child process of a root_ test"]
fn child_connects() {
    let Ok(socket) = std::env::var("FP_TRUST_SOCKET") else {
        return;
    };
    become_nobody();
    match Client::connect(Some(socket.as_ref())).and_then(|c| c.stats()) {
        Ok(_) => println!("RESULT allowed"),
        Err(e) => println!("RESULT refused: {e}"),
    }
}

#[test]
#[ignore = "needs root (a client of another user): make test runs it when root"]
fn root_only_allowed_users_may_connect() {
    assert!(nix::unistd::geteuid().is_root(), "needs root");
    // A socket anyone may open: the allow-list alone keeps others out.
    for (flags, expect) in [
        (&["--socket-mode", "666"][..], "refused"),
        (
            &["--socket-mode", "666", "--allow-uid", "0,65534"][..],
            "allowed",
        ),
    ] {
        let store = LoggedStore::start("8MiB", flags);
        open_to_all(&store.dir);
        let env = [("FP_TRUST_SOCKET", store.socket.display().to_string())];
        let got = as_nobody("child_connects", &env);
        assert!(got.starts_with(expect), "{flags:?}: {got}");
        store.client().stats().unwrap(); // the store's own user still may
    }
}
