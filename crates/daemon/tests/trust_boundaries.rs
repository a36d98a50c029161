//! The store tried as an attacker on the same host would (docs/security.md):
//! files under the store's feet, descriptors reopened, hostile sizes and
//! flag values, exposed endpoints. Each test runs real store processes.
//! Attacks that need a second user are in `other_users.rs`.

mod common;

use common::attacker::{raw_handshake, writable_somehow, LoggedStore};
use common::{bin, content, temp_dir};
use ferroplasma_client::{ClientError, ObjectId};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

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

// ------------------------------------------------------- the shared table

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

#[test]
fn exposed_endpoints_and_readable_secrets_are_warned_about_at_start() {
    let dir = temp_dir("exposed");
    let token = dir.join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let store = LoggedStore::start(
        "16MiB",
        &[
            "--metrics-listen",
            "0.0.0.0:0",
            "--cluster-listen",
            "127.0.0.1:0",
            "--cluster-token-file",
            token.to_str().unwrap(),
        ],
    );
    store.client().stats().unwrap();
    assert_eq!(
        store.log_lines("has no authentication and listens beyond this host"),
        1
    );
    assert_eq!(
        store.log_lines("can be read by other users: chmod 600 it"),
        1
    );
    drop(store);
    // Private file, loopback metrics: not a word.
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let quiet = LoggedStore::start(
        "16MiB",
        &[
            "--metrics-listen",
            "0",
            "--cluster-listen",
            "127.0.0.1:0",
            "--cluster-token-file",
            token.to_str().unwrap(),
        ],
    );
    quiet.client().stats().unwrap();
    assert_eq!(quiet.log_lines("has no authentication"), 0);
    assert_eq!(quiet.log_lines("chmod 600"), 0);
    let _ = std::fs::remove_dir_all(&dir);
}
