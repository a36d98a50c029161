//! Reads without a round trip (docs/protocol.md): gets, contains and
//! releases of sealed local objects go through the object table the store
//! publishes in shared memory, and an object a client holds that way is
//! never freed, evicted or deleted under it.

mod common;

use common::{content, TestStore};
use ferroplasma_client::{Client, ClientError, DeleteStatus, ObjectId};
use std::time::Duration;

/// A store publishing its object table (the default).
fn store_with_table(memory: &str) -> TestStore {
    TestStore::start(memory)
}

/// While the store is stopped (SIGSTOP), a client still gets, checks and
/// releases sealed objects: none of it asks the store.
#[test]
fn gets_contains_and_releases_need_no_round_trip() {
    let store = store_with_table("64MiB");
    let c = store.client();
    let ids: Vec<ObjectId> = (0..100).map(|_| ObjectId::random()).collect();
    for id in &ids {
        c.put(*id, &content(*id, 1000), b"m").unwrap();
    }
    // Puts of small objects need no round trip either: the store takes them
    // into its table within milliseconds (docs/protocol.md, "Writes without
    // a round trip").
    std::thread::sleep(Duration::from_millis(100));
    store.signal("-STOP");
    let (tx, rx) = std::sync::mpsc::channel();
    let path = store.path().to_path_buf();
    let probe = {
        let ids = ids.clone();
        std::thread::spawn(move || {
            // A client connected before the stop, reading while stopped.
            let bufs = c.get(&ids, Some(Duration::ZERO)).unwrap();
            for (id, b) in ids.iter().zip(&bufs) {
                let b = b.as_ref().expect("found");
                assert_eq!(b.data(), &content(*id, 1000)[..]);
                assert_eq!(b.metadata(), b"m");
            }
            assert!(c.contains(&ids).unwrap().iter().all(|&p| p));
            drop(bufs);
            let _ = tx.send(());
            c
        })
    };
    let answered = rx.recv_timeout(Duration::from_secs(10)).is_ok();
    store.signal("-CONT");
    let c = probe.join().unwrap();
    assert!(
        answered,
        "a get of sealed objects waited for the stopped store"
    );
    // Released: every object can be deleted at once.
    let st = c.delete(&ids).unwrap();
    assert!(st.iter().all(|s| *s == DeleteStatus::Deleted), "{st:?}");
    assert_eq!(
        Client::connect(Some(&path)).unwrap().stats().unwrap().used,
        0
    );
}

/// A delete of an object a client holds through the table is deferred,
/// and its bytes stay intact until the client lets go.
#[test]
fn an_object_held_through_the_table_is_not_deleted_under_its_reader() {
    let store = store_with_table("64MiB");
    let (reader, deleter) = (store.client(), store.client());
    let id = ObjectId::random();
    reader.put(id, &content(id, 4096), b"").unwrap();
    let held = reader.get(&[id], None).unwrap().remove(0).unwrap();
    assert_eq!(deleter.delete(&[id]).unwrap(), [DeleteStatus::Deferred]);
    // Memory freed now would be reused by this object.
    let other = ObjectId::random();
    deleter.put(other, &vec![0xAB; 4096], b"").unwrap();
    assert_eq!(held.data(), &content(id, 4096)[..]);
    drop(held);
    store.eventually("the deleted object is freed once released", || {
        !deleter.list().unwrap().iter().any(|o| o.id == id)
    });
}

/// Eviction skips an object a client holds through the table.
#[test]
fn eviction_skips_objects_held_through_the_table() {
    let store = store_with_table("4MiB");
    let (reader, writer) = (store.client(), store.client());
    let id = ObjectId::random();
    writer.put(id, &content(id, 1 << 20), b"").unwrap();
    let held = reader.get(&[id], None).unwrap().remove(0).unwrap();
    // Fill the store several times over: everything else is evicted.
    for _ in 0..12 {
        let other = ObjectId::random();
        writer.put(other, &content(other, 1 << 20), b"").unwrap();
    }
    assert_eq!(held.data(), &content(id, 1 << 20)[..]);
    assert!(writer.contains(&[id]).unwrap()[0]);
    drop(held);
}

/// `--table-slots 0` turns the table off: the same operations ask the
/// store.
#[test]
fn without_the_table_gets_ask_the_store() {
    let store = TestStore::start_with("16MiB", &["--table-slots", "0"]);
    let c = store.client();
    let id = ObjectId::random();
    c.put(id, b"slow path", b"").unwrap();
    store.signal("-STOP");
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let got = c.get(&[id], Some(Duration::ZERO)).map(|v| v.len());
        let _ = tx.send(got.is_ok());
    });
    let answered = rx.recv_timeout(Duration::from_millis(500)).is_ok();
    store.signal("-CONT");
    t.join().unwrap();
    assert!(
        !answered,
        "without the table a get asks the (stopped) store"
    );
}

/// Many readers (one connection each) take and give back holds on objects
/// that writers delete and create again and that eviction removes: every
/// byte read is the object's own.
#[test]
fn readers_racing_deletes_and_evictions_read_only_their_objects_bytes() {
    let store = store_with_table("8MiB");
    let ids: Vec<ObjectId> = (0..64).map(|_| ObjectId::random()).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let size = |id: &ObjectId| 16_384 + (id.0[0] as usize) * 256;
    let mut threads = Vec::new();
    for r in 0..3 {
        let (c, ids, stop) = (store.client(), ids.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut reads = 0u64;
            let mut i = r;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i = (i * 7 + 3) % ids.len();
                let id = ids[i];
                if let Some(b) = c.get(&[id], Some(Duration::ZERO)).unwrap().remove(0) {
                    assert_eq!(b.data(), &content(id, size(&id))[..], "bytes of {id}");
                    reads += 1;
                }
            }
            reads
        }));
    }
    let w = store.client();
    let t = std::time::Instant::now();
    let mut n = 0usize;
    while t.elapsed() < Duration::from_secs(4) {
        let id = ids[n % ids.len()];
        n += 1;
        if n % 3 == 0 {
            let _ = w.delete(&[id]);
        } else {
            let _ = w.put(id, &content(id, size(&id)), b"");
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(reads > 100, "only {reads} reads");
    println!("{n} writes and deletes, {reads} reads checked");
}

/// Helper for the kill test: run as a child process, holds every object
/// named in `FP_HOLD_IDS` through the table, says so, and waits to be
/// killed.
#[test]
#[ignore = "helper: runs only as a child process of the kill test"]
fn holder_worker() {
    let (Ok(socket), Ok(ids)) = (
        std::env::var("FP_HOLD_SOCKET"),
        std::env::var("FP_HOLD_IDS"),
    ) else {
        return;
    };
    let c = Client::connect(Some(std::path::Path::new(&socket))).unwrap();
    let ids: Vec<ObjectId> = ids
        .split(',')
        .map(|s| ObjectId::from_hex(s).unwrap())
        .collect();
    let held = c.get(&ids, Some(Duration::ZERO)).unwrap();
    assert!(held.iter().all(Option::is_some));
    println!("held {}", held.len());
    std::thread::sleep(Duration::from_secs(600));
}

/// A client SIGKILLed while it holds objects through the table leaves
/// nothing held: once its connection is gone, a delete frees everything.
#[test]
fn a_killed_reader_leaves_nothing_held() {
    use std::io::BufRead;
    let store = store_with_table("64MiB");
    let c = store.client();
    let ids: Vec<ObjectId> = (0..200).map(|_| ObjectId::random()).collect();
    for id in &ids {
        c.put(*id, &content(*id, 3000), b"").unwrap();
    }
    let list = ids
        .iter()
        .map(ObjectId::to_hex)
        .collect::<Vec<_>>()
        .join(",");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "holder_worker", "--ignored", "--nocapture"])
        .env("FP_HOLD_SOCKET", store.path())
        .env("FP_HOLD_IDS", list)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("held") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the holder died");
    }
    // Deleted while held: deferred (the holds became references).
    let st = c.delete(&ids[..100]).unwrap();
    assert!(st.iter().all(|s| *s == DeleteStatus::Deferred), "{st:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    store.eventually("the killed reader's holds are gone", || {
        c.list().unwrap().len() == 100
    });
    assert!(c
        .delete(&ids[100..])
        .unwrap()
        .iter()
        .all(|s| *s == DeleteStatus::Deleted));
    let s = c.stats().unwrap();
    assert_eq!((s.used, s.objects), (0, 0));
}

/// Restores a sysfs setting when dropped.
struct Setting {
    path: &'static str,
    old: String,
}

impl Setting {
    fn set(path: &'static str, value: &str) -> Option<Self> {
        let text = std::fs::read_to_string(path).ok()?;
        // "always within_size advise [never] deny force": the bracketed one.
        let old = text.split(['[', ']']).nth(1)?.to_string();
        std::fs::write(path, value).ok()?;
        Some(Self { path, old })
    }
}

impl Drop for Setting {
    fn drop(&mut self) {
        let _ = std::fs::write(self.path, &self.old);
    }
}

/// kB of the store's memory this process maps with 2 MiB page-table entries.
fn arena_pmd_mapped_kb() -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut in_arena = false;
    let mut kb = 0;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            in_arena = line.contains("ferroplasma-arena");
        } else if in_arena && first == "ShmemPmdMapped:" {
            kb += line
                .split_whitespace()
                .nth(1)
                .unwrap()
                .parse::<u64>()
                .unwrap();
        }
    }
    kb
}

/// With shared-memory transparent huge pages on request (`advise`, the
/// setting docs/operations.md recommends), the store's memory is mapped
/// with 2 MiB pages by writers and readers alike: a reader of a large
/// object takes 512x fewer page faults (docs/benchmarks.md, the reader of
/// 100 MB objects). Root: it changes a system setting, and restores it.
#[test]
#[ignore = "root: sets /sys/kernel/mm/transparent_hugepage/shmem_enabled"]
fn root_large_objects_are_mapped_with_huge_pages_when_the_system_allows() {
    let Some(_thp) = Setting::set(
        "/sys/kernel/mm/transparent_hugepage/shmem_enabled",
        "advise",
    ) else {
        eprintln!("skipped: this kernel has no shared-memory transparent huge pages");
        return;
    };
    let store = TestStore::start("256MiB");
    let writer = store.client();
    let id = ObjectId::random();
    let data = content(id, 64 << 20);
    writer.put(id, &data, b"").unwrap();
    let reader = store.client();
    let got = reader.get(&[id], Some(Duration::ZERO)).unwrap();
    let buf = got[0].as_ref().expect("sealed");
    assert_eq!(buf.data(), &data[..]);
    let kb = arena_pmd_mapped_kb();
    assert!(
        kb >= 32 << 10,
        "only {kb} kB of 2 x 64 MiB of mapped store memory is in huge pages"
    );
}

/// Plasma's `release` check (does this client hold the object?) holds for
/// objects held through the table: while a buffer is alive, also after the
/// object was deleted and its slot reused; not once the buffer is gone.
#[test]
fn release_knows_what_a_client_holds_through_the_table() {
    let store = TestStore::start_with("64MiB", &["--table-slots", "64"]);
    let c = store.client();
    let id = ObjectId::random();
    c.put(id, b"held", b"").unwrap();
    let got = c.get(&[id], Some(Duration::ZERO)).unwrap();
    c.release(id).expect("held through the table");
    let other = ObjectId::random();
    assert!(matches!(
        c.release(other),
        Err(ferroplasma_client::ClientError::NotHeld(_))
    ));
    // Deleted while held, and 64 slots filled with other objects: the slot
    // it had may now hold another one.
    assert_eq!(c.delete(&[id]).unwrap(), vec![DeleteStatus::Deferred]);
    for _ in 0..200 {
        let o = ObjectId::random();
        c.put(o, b"x", b"").unwrap();
        drop(c.get(&[o], Some(Duration::ZERO)).unwrap());
    }
    c.release(id).expect("still held: the buffer is alive");
    assert_eq!(got[0].as_ref().unwrap().data(), b"held");
    drop(got);
    assert!(matches!(
        c.release(id),
        Err(ferroplasma_client::ClientError::NotHeld(_))
    ));
}

/// A client costs the store one descriptor, its socket: the store keeps
/// only the mapping of the client's holds region, not its file.
#[test]
fn a_client_costs_the_store_one_descriptor() {
    let store = store_with_table("64MiB");
    let pid = store.child.as_ref().unwrap().id();
    let open = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    // A request answered after the handshake means the store has finished
    // with the handshake's descriptors (it hands the holds file over and
    // closes its copy right after sending it).
    let warm = store.client();
    warm.stats().unwrap();
    let before = open();
    let clients: Vec<Client> = (0..20).map(|_| store.client()).collect();
    for c in &clients {
        c.stats().unwrap();
    }
    let after = open();
    assert_eq!(
        after - before,
        clients.len(),
        "20 clients took {} descriptors of the store",
        after - before
    );
    drop(clients);
}

#[test]
fn objects_held_through_the_table_are_not_called_evictable() {
    // The case: two 100 MiB objects a reader holds (through the
    // table, with no reference the store was told of) made StoreFull say
    // "209715968 evictable" and stats report them evictable.
    let store = TestStore::start("256MiB");
    let (owner, reader) = (store.client(), store.client());
    let ids = [ObjectId::random(), ObjectId::random()];
    let big = vec![7u8; 100 << 20];
    for id in &ids {
        owner.put(*id, &big, b"").unwrap();
    }
    assert!(owner.stats().unwrap().evictable_bytes >= 200 << 20);
    let held = reader.get(&ids, Some(Duration::ZERO)).unwrap();
    assert!(held.iter().all(|b| b.is_some()));
    let s = owner.stats().unwrap();
    assert_eq!((s.evictable_bytes, s.referenced_objects), (0, 2), "{s:?}");
    let err = owner
        .create(ObjectId::random(), 100 << 20, b"")
        .unwrap_err();
    assert!(matches!(err, ClientError::StoreFull(_)), "{err}");
    assert!(err.to_string().contains(" 0 evictable"), "{err}");
    drop(held);
}
