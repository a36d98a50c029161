//! Spilling, waiting for space, and a store that dies under its clients. Each test runs real store processes.

mod common;

use common::{content, temp_dir, TestStore};
use ferroplasma_client::{Client, ClientError, ObjectId};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn spill_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|d| std::fs::read_dir(d.path()).unwrap().count())
        .sum()
}

#[test]
fn spilled_objects_come_back_byte_exact() {
    let spill = temp_dir("spill");
    let store = TestStore::start_with("1MiB", &["--spill-dir", spill.to_str().unwrap()]);
    let c = store.client();
    let ids: Vec<ObjectId> = (0..6).map(|_| ObjectId::random()).collect();
    for id in &ids {
        c.put(*id, &content(*id, 300_000), &content(*id, 100)[..7])
            .unwrap();
    }
    let s = c.stats().unwrap();
    assert!(s.spilled_objects >= 3, "{s:?}");
    assert_eq!(s.evictions, 0, "nothing is dropped when spilling");
    let listed = c.list().unwrap();
    assert_eq!(listed.len(), 6);
    assert_eq!(
        listed.iter().filter(|o| o.spilled).count() as u64,
        s.spilled_objects
    );
    assert!(c.contains(&ids).unwrap().iter().all(|&b| b));
    // A create of a taken id is refused without spilling anything for it.
    let before = c.stats().unwrap().spills;
    let err = c.create(ids[5], 300_000, b"").unwrap_err();
    assert!(matches!(err, ClientError::ObjectExists { .. }), "{err}");
    let err = c.create(ids[0], 300_000, b"").unwrap_err(); // a spilled one
    assert!(matches!(err, ClientError::ObjectExists { .. }), "{err}");
    assert_eq!(c.stats().unwrap().spills, before);
    // Every object, spilled or not, reads back exactly (gets restore).
    for id in &ids {
        let b = c
            .get(&[*id], Some(Duration::ZERO))
            .unwrap()
            .remove(0)
            .unwrap();
        assert_eq!(b.data(), &content(*id, 300_000)[..]);
        assert_eq!(b.metadata(), &content(*id, 100)[..7]);
    }
    let s = c.stats().unwrap();
    assert!(s.restores >= 3);
    // Deleting everything leaves no segment file behind.
    c.delete(&ids).unwrap();
    store.eventually("spill files removed", || {
        c.stats().unwrap().spilled_objects == 0 && spill_files(&spill) == 0
    });
    drop(store);
    let _ = std::fs::remove_dir_all(&spill);
}

#[test]
fn small_objects_are_spilled_in_batches() {
    let spill = temp_dir("spill-batch");
    let store = TestStore::start_with("256KiB", &["--spill-dir", spill.to_str().unwrap()]);
    let c = store.client();
    let ids: Vec<ObjectId> = (0..2000).map(|_| ObjectId::random()).collect();
    for id in &ids {
        c.put(*id, &content(*id, 1000), b"").unwrap();
    }
    let s = c.stats().unwrap();
    assert!(s.spilled_objects > 1000, "{s:?}");
    assert!(
        (spill_files(&spill) as u64) * 10 < s.spilled_objects,
        "{} files for {} objects",
        spill_files(&spill),
        s.spilled_objects
    );
    for id in ids.iter().step_by(97) {
        let b = c.get(&[*id], None).unwrap().remove(0).unwrap();
        assert_eq!(b.data(), &content(*id, 1000)[..]);
    }
    drop(store);
    let _ = std::fs::remove_dir_all(&spill);
}

#[test]
fn a_full_spill_directory_is_a_clear_store_full_error() {
    let spill = temp_dir("spill-full");
    let store = TestStore::start_with(
        "1MiB",
        &[
            "--spill-dir",
            spill.to_str().unwrap(),
            "--spill-limit",
            "600KiB",
        ],
    );
    let c = store.client();
    let t = Instant::now();
    let mut stored = Vec::new();
    let err = loop {
        let id = ObjectId::random();
        match c.put(id, &content(id, 250_000), b"") {
            Ok(()) => stored.push(id),
            Err(e) => break e,
        }
        assert!(stored.len() < 100, "the limit was never reached");
    };
    assert!(t.elapsed() < Duration::from_secs(10), "no hang");
    assert!(matches!(err, ClientError::StoreFull(_)), "{err}");
    assert!(err.to_string().contains("spill"), "{err}");
    // Nothing stored is lost: a get either returns the right bytes or, while
    // memory and spill directory are both full, a clear StoreFull error.
    let mut readable = 0;
    for id in &stored {
        match c.get(&[*id], Some(Duration::ZERO)) {
            Ok(mut v) => {
                let b = v.remove(0).expect("stored objects stay");
                assert_eq!(b.data(), &content(*id, 250_000)[..]);
                readable += 1;
            }
            Err(e) => assert!(matches!(e, ClientError::StoreFull(_)), "{e}"),
        }
    }
    assert!(readable > 0);
    // Making room makes every object readable again.
    let (gone, kept) = stored.split_at(stored.len() / 2);
    c.delete(gone).unwrap();
    for id in kept {
        let b = c
            .get(&[*id], Some(Duration::ZERO))
            .unwrap()
            .remove(0)
            .unwrap();
        assert_eq!(b.data(), &content(*id, 250_000)[..]);
    }
    drop(store);
    let _ = std::fs::remove_dir_all(&spill);
}

#[test]
fn without_a_spill_dir_eviction_drops_objects_as_before() {
    let store = TestStore::start("1MiB");
    let c = store.client();
    for _ in 0..6 {
        c.put(ObjectId::random(), &[7u8; 300_000], b"").unwrap();
    }
    let s = c.stats().unwrap();
    assert!(s.evictions >= 3 && s.spilled_objects == 0, "{s:?}");
}

#[test]
fn a_create_can_wait_for_space() {
    let store = TestStore::start("1MiB");
    let holder = store.client();
    let big = ObjectId::random();
    holder.put(big, &[1u8; 800_000], b"").unwrap();
    let held = holder.get(&[big], None).unwrap();
    let c = store.client();
    // Without waiting: refused at once.
    let err = c.create(ObjectId::random(), 500_000, b"").unwrap_err();
    assert!(matches!(err, ClientError::StoreFull(_)), "{err}");
    // Waiting, with a limit that runs out.
    let t = Instant::now();
    let err = c
        .create_waiting(
            ObjectId::random(),
            500_000,
            b"",
            Some(Duration::from_millis(300)),
        )
        .unwrap_err();
    assert!(matches!(err, ClientError::StoreFull(_)), "{err}");
    assert!(t.elapsed() >= Duration::from_millis(290) && t.elapsed() < Duration::from_secs(5));
    // Waiting while another client lets go.
    let waiter = std::thread::spawn({
        let socket = store.path().to_path_buf();
        move || {
            let c = Client::connect(Some(&socket)).unwrap();
            let id = ObjectId::random();
            let t = Instant::now();
            let mut b = c.create_waiting(id, 500_000, b"", Some(Duration::from_secs(20)))?;
            b.as_mut_slice().fill(9);
            c.seal(b)?;
            Ok::<_, ClientError>(t.elapsed())
        }
    });
    // Free the space only once the create waits in the store for it.
    store.eventually("the create waits for space", || {
        c.stats().unwrap().waiting_creates == 1
    });
    assert!(
        !waiter.is_finished(),
        "the create was answered with no space"
    );
    drop(held);
    holder.delete(&[big]).unwrap();
    waiter.join().unwrap().unwrap();
    assert_eq!(c.stats().unwrap().waiting_creates, 0);
    // An object larger than the store never waits.
    let err = c
        .create_waiting(ObjectId::random(), 2 << 20, b"", None)
        .unwrap_err();
    assert!(matches!(err, ClientError::StoreFull(_)));
}

// ------------------------------------------------------------ memory honesty

#[test]
fn a_store_never_promises_more_than_the_backing_filesystem_has() {
    let dir = temp_dir("honest");
    let out = Command::new(common::bin())
        .args(["store", "--memory", "1000TiB", "--socket"])
        .arg(dir.join("s.sock"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("SIGBUS") && err.contains("--prefault"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// ------------------------------------------------------------ store killed

#[test]
fn clients_of_a_killed_store_get_an_error_promptly() {
    let mut store = TestStore::start("8MiB");
    let c = store.client();
    let blocked = std::thread::spawn({
        let socket = store.path().to_path_buf();
        move || {
            let c = Client::connect(Some(&socket)).unwrap();
            let t = Instant::now();
            let r = c.get(&[ObjectId::random()], None);
            (r.map(|_| ()), t.elapsed())
        }
    });
    // Kill the store only once the get waits in it.
    store.eventually("the get is parked", || {
        c.stats().unwrap().awaited_objects == 1
    });
    let mut child = store.child.take().unwrap();
    child.kill().unwrap(); // SIGKILL: no goodbye to anyone
    child.wait().unwrap();
    let t = Instant::now();
    let (r, _) = blocked.join().unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "the blocked get hung");
    assert!(matches!(r, Err(ClientError::Disconnected(_))), "{r:?}");
    let err = c.create(ObjectId::random(), 100, b"").unwrap_err();
    assert!(matches!(err, ClientError::Disconnected(_)), "{err}");
    let err = Client::connect(Some(store.path())).unwrap_err();
    assert!(matches!(err, ClientError::StoreUnavailable { .. }), "{err}");
}

#[test]
fn a_socket_in_a_missing_directory_says_to_create_it() {
    let dir = temp_dir("no-socket-dir");
    let missing = dir.join("not-there").join("store.sock");
    let out = common::run_store_once(&missing, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("does not exist: create it first"), "{err}");
    assert!(!err.contains("entity not found"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
