//! Writes without a round trip (docs/protocol.md): small objects are
//! created, written and sealed in memory the store leased the client, and
//! the store learns of them through the client's ring. Everything that
//! holds for creates over the socket holds for these: ids stay unique under
//! racing creators, waiters and subscribers hear of every seal once, and a
//! client killed mid-write leaves nothing behind.

mod common;

use common::{content, TestStore};
use ferroplasma_client::{Client, ClientError, EventKind, ObjectId};
use ferroplasma_protocol::fast_writes::bucket_of;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// `n` random ids in `n` different buckets (two objects of one bucket
/// being written at once: the second goes the slow way).
fn ids_in_distinct_buckets(n: usize) -> Vec<ObjectId> {
    let mut seen = HashSet::new();
    std::iter::repeat_with(ObjectId::random)
        .filter(|id| seen.insert(bucket_of(id)))
        .take(n)
        .collect()
}

/// While the store is stopped (SIGSTOP), a client that has its lease
/// creates, writes and seals small objects: none of it asks the store. Once
/// the store runs again, every other client sees them.
#[test]
fn small_creates_and_seals_need_no_round_trip() {
    let store = TestStore::start("64MiB");
    let c = store.client();
    // The first create asks for the ring and a lease.
    c.put(ObjectId::random(), b"first", b"").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let ids = ids_in_distinct_buckets(100);
    store.signal("-STOP");
    let (tx, rx) = std::sync::mpsc::channel();
    let writer = {
        let ids = ids.clone();
        std::thread::spawn(move || {
            for id in &ids {
                let mut b = c.create(*id, 1000, b"m").unwrap();
                b.as_mut_slice().copy_from_slice(&content(*id, 1000));
                drop(c.seal(b).unwrap());
            }
            let _ = tx.send(());
        })
    };
    let answered = rx.recv_timeout(Duration::from_secs(10)).is_ok();
    store.signal("-CONT");
    writer.join().unwrap();
    assert!(
        answered,
        "a small create and seal waited for the stopped store"
    );
    let other = store.client();
    let bufs = other.get(&ids, Some(Duration::from_secs(10))).unwrap();
    for (id, b) in ids.iter().zip(&bufs) {
        let b = b.as_ref().expect("sealed and visible to another client");
        assert_eq!(b.data(), &content(*id, 1000)[..]);
        assert_eq!(b.metadata(), b"m");
    }
}

/// A get waiting for an id is woken when another client seals it without a
/// round trip (the seal rings the store's doorbell).
#[test]
fn a_waiting_get_wakes_when_the_id_is_sealed_without_a_round_trip() {
    let store = TestStore::start("64MiB");
    let writer = store.client();
    writer.put(ObjectId::random(), b"lease", b"").unwrap();
    for _ in 0..20 {
        let id = ObjectId::random();
        let reader = store.client();
        let waiting = std::thread::spawn(move || {
            let t = Instant::now();
            let got = reader.get(&[id], Some(Duration::from_secs(20))).unwrap();
            (got[0].as_ref().map(|b| b.data().to_vec()), t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(30));
        writer.put(id, &content(id, 500), b"").unwrap();
        let (data, took) = waiting.join().unwrap();
        assert_eq!(data.as_deref(), Some(&content(id, 500)[..]));
        assert!(took < Duration::from_secs(10), "woken after {took:?}");
    }
}

/// A subscriber hears of every seal made through the rings of two
/// clients, each exactly once.
#[test]
fn subscribers_hear_of_every_seal_once() {
    let store = TestStore::start("256MiB");
    let watcher = store.client();
    let mut sub = watcher.subscribe().unwrap();
    let per = 1500;
    let writers: Vec<_> = (0..2)
        .map(|_| {
            let c = store.client();
            std::thread::spawn(move || {
                let ids: Vec<ObjectId> = (0..per).map(|_| ObjectId::random()).collect();
                for id in &ids {
                    c.put(*id, &content(*id, 200), b"").unwrap();
                }
                ids
            })
        })
        .collect();
    let want: HashSet<ObjectId> = writers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    let mut seen = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.len() < want.len() && Instant::now() < deadline {
        if let Some(e) = sub.next_timeout(Duration::from_millis(200)).unwrap() {
            if e.kind == EventKind::Sealed {
                *seen.entry(e.id).or_insert(0) += 1;
            }
        }
    }
    // Anything late would be a second event for an id.
    while let Some(e) = sub.next_timeout(Duration::from_millis(300)).unwrap() {
        if e.kind == EventKind::Sealed {
            *seen.entry(e.id).or_insert(0) += 1;
        }
    }
    assert_eq!(seen.len(), want.len(), "seals heard of");
    assert!(seen.keys().all(|id| want.contains(id)));
    assert!(seen.values().all(|&n| n == 1), "a seal heard of twice");
}

/// Four clients race to create the same ids, three without a round trip
/// (small objects, each in its own order) and one over the socket (objects
/// too large for the rings): every id is created exactly once, the others
/// are told it exists, and the store keeps the bytes of the one told it
/// succeeded.
#[test]
fn racing_creators_of_the_same_ids_never_both_succeed() {
    let store = TestStore::start("512MiB");
    let ids: Vec<ObjectId> = (0..1500).map(|_| ObjectId::random()).collect();
    let start = Arc::new(Barrier::new(4));
    let racers: Vec<_> = (0..4u8)
        .map(|who| {
            let c = store.client();
            let start = start.clone();
            let mut mine = ids.clone();
            // Different orders: each meets the others at different ids.
            let k = mine.len() / 4 * who as usize;
            mine.rotate_left(k);
            if who % 2 == 1 {
                mine.reverse();
            }
            std::thread::spawn(move || {
                let size = if who == 3 { 100_000 } else { 100 };
                start.wait();
                let mut won = Vec::new();
                for id in mine {
                    match c.put(id, &vec![who; size], &[who]) {
                        Ok(()) => won.push(id),
                        Err(ClientError::ObjectExists { .. }) => {}
                        Err(e) => panic!("racer {who}: {e}"),
                    }
                }
                (who, won)
            })
        })
        .collect();
    let mut winner = HashMap::new();
    for r in racers {
        let (who, won) = r.join().unwrap();
        for id in won {
            assert!(
                winner.insert(id, who).is_none(),
                "two creators were told they created {id}"
            );
        }
    }
    assert_eq!(winner.len(), ids.len(), "every id created once");
    let c = store.client();
    let bufs = c.get(&ids, Some(Duration::from_secs(10))).unwrap();
    for (id, b) in ids.iter().zip(&bufs) {
        let b = b.as_ref().expect("sealed");
        let who = winner[id];
        assert_eq!(
            b.metadata(),
            &[who],
            "{id}: the store kept another's object"
        );
        assert!(b.data().iter().all(|&x| x == who));
    }
}

/// Runs in a child process: seals 200 objects without a round trip, leaves
/// 50 more created and half written, then sleeps until killed.
#[test]
#[ignore = "helper: runs only as a child process of the kill test"]
fn writer_worker() {
    let Ok(socket) = std::env::var("FP_WRITER_SOCKET") else {
        return;
    };
    let c = Client::connect(Some(std::path::Path::new(&socket))).unwrap();
    let mut sealed = Vec::new();
    for _ in 0..200 {
        let id = ObjectId::random();
        c.put(id, &content(id, 2000), b"").unwrap();
        sealed.push(id.to_hex());
    }
    let mut open = Vec::new();
    for _ in 0..50 {
        let mut b = c.create(ObjectId::random(), 2000, b"").unwrap();
        b.as_mut_slice()[..1000].fill(7);
        open.push(b);
    }
    println!("sealed {}", sealed.join(","));
    std::thread::sleep(Duration::from_secs(600));
    drop(open);
}

/// A client SIGKILLed mid-write: its sealed objects stay, its unsealed
/// ones are aborted, and its ring and leases go back to the store.
#[test]
fn a_client_killed_mid_write_leaks_nothing() {
    use std::io::BufRead;
    let store = TestStore::start("64MiB");
    let c = store.client();
    let empty = c.stats().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "writer_worker", "--ignored", "--nocapture"])
        .env("FP_WRITER_SOCKET", store.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("sealed ") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the writer died");
    }
    let sealed: Vec<ObjectId> = line["sealed ".len()..]
        .trim()
        .split(',')
        .map(|s| ObjectId::from_hex(s).unwrap())
        .collect();
    child.kill().unwrap();
    child.wait().unwrap();
    store.eventually("the killed writer's objects are settled", || {
        c.list().unwrap().len() == 200
    });
    let bufs = c.get(&sealed, Some(Duration::ZERO)).unwrap();
    for (id, b) in sealed.iter().zip(&bufs) {
        assert_eq!(b.as_ref().expect("sealed").data(), &content(*id, 2000)[..]);
    }
    drop(bufs);
    let s = c.stats().unwrap();
    assert_eq!(s.objects, 200);
    assert_eq!(s.used, 200 * 2048, "objects only: no lease, no ring");
    c.delete(&sealed).unwrap();
    let s = c.stats().unwrap();
    assert_eq!((s.used, s.objects), (0, 0));
    assert_eq!(
        s.largest_free_block, empty.largest_free_block,
        "every byte of the leases and the ring is free again"
    );
}

/// A store started with `--fast-writes off` answers every create itself,
/// and a client then creates over the socket as before.
#[test]
fn fast_writes_off_sends_every_create_to_the_store() {
    let store = TestStore::start_with("64MiB", &["--fast-writes", "off"]);
    let c = store.client();
    c.put(ObjectId::random(), b"x", b"").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    store.signal("-STOP");
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let r = c.put(ObjectId::random(), b"y", b"");
        let _ = tx.send(());
        r
    });
    let answered = rx.recv_timeout(Duration::from_millis(500)).is_ok();
    store.signal("-CONT");
    t.join().unwrap().unwrap();
    assert!(
        !answered,
        "with --fast-writes off a put waits for the store"
    );
}

/// One request on a hand-made connection, and its reply.
fn ask(
    s: &mut std::os::unix::net::UnixStream,
    body: ferroplasma_protocol::pb::request::Body,
) -> ferroplasma_protocol::pb::reply::Body {
    use ferroplasma_protocol::frame::{read_message, write_message};
    use ferroplasma_protocol::pb;
    write_message(
        s,
        &pb::Request {
            request_id: 7,
            body: Some(body),
        },
    )
    .unwrap();
    let r: pb::Reply = read_message(s, 1 << 20).unwrap();
    r.body.expect("a reply")
}

/// A client that asks for lease after lease is refused once it holds 16,
/// and one that writes a record the protocol does not allow (an object
/// outside its leases) loses its ring, not its connection; the store and
/// other clients carry on, and the record's id is not created.
#[test]
fn a_client_that_abuses_leases_or_its_ring_harms_only_itself() {
    use common::attacker::raw_connection;
    use ferroplasma_protocol::fast_writes::{RECORD_BYTES, RING_HEADER_BYTES};
    use ferroplasma_protocol::pb::{self, reply, request};
    let store = TestStore::start("256MiB");
    let (mut s, hello, fds) = raw_connection(store.path());
    let lease = |s: &mut _, size| {
        ask(
            s,
            request::Body::Lease(pb::Lease {
                size,
                ended: vec![],
                bumps_top: false,
            }),
        )
    };
    let mut granted = Vec::new();
    let refused = loop {
        match lease(&mut s, 1 << 20) {
            reply::Body::Lease(l) => granted.push(l),
            other => break other,
        }
        assert!(granted.len() <= 16, "more than 16 leases");
    };
    assert_eq!(granted.len(), 16);
    let reply::Body::Error(e) = refused else {
        panic!("{refused:?}")
    };
    assert_eq!(e.code, pb::ErrorCode::TooLarge as i32, "{}", e.message);
    // A record of an object outside every lease of this client.
    // The store's arena, mapped shared; this test writes only its own ring.
    let arena = memmap2::MmapOptions::new()
        .len(hello.arenas[0].size as usize)
        .map_raw(&fds[0])
        .unwrap();
    let ring = granted[0].ring_offset as usize;
    let bad = ObjectId::random();
    let w = ferroplasma_protocol::shared_table::id_words(&bad);
    let words = [1u64, w[0], w[1], w[2], 0, 100, 0, 0]; // CREATE at offset 0
    for (i, v) in words.iter().enumerate() {
        let at = ring + RING_HEADER_BYTES + i * 8;
        // Safety: inside the mapping (the store put the ring there).
        unsafe { (arena.as_mut_ptr().add(at) as *mut u64).write_volatile(*v) };
    }
    assert_eq!(RECORD_BYTES, 64);
    // Safety: the ring's head, inside the mapping.
    unsafe { (arena.as_mut_ptr().add(ring) as *mut u64).write_volatile(1) };
    let after = lease(&mut s, 0);
    let after = match after {
        reply::Body::Lease(_) => lease(&mut s, 0),
        other => other,
    };
    let reply::Body::Error(e) = after else {
        panic!("the broken ring is still read: {after:?}")
    };
    assert_eq!(
        e.code,
        pb::ErrorCode::ProtocolViolation as i32,
        "{}",
        e.message
    );
    let c = store.client();
    assert!(!c.contains(&[bad]).unwrap()[0]);
    let id = ObjectId::random();
    c.put(id, b"still fine", b"").unwrap();
    assert_eq!(
        c.get(&[id], Some(Duration::ZERO)).unwrap()[0]
            .as_ref()
            .unwrap()
            .data(),
        b"still fine"
    );
    // Its connection still works for everything else.
    assert!(matches!(
        ask(&mut s, request::Body::Stats(pb::Stats {})),
        reply::Body::Stats(_)
    ));
}

/// Objects sealed through a ring keep their creator's times: a late
/// subscriber hears of them in the order they were sealed, even when the
/// store took them all in at once (here: while it was stopped).
#[test]
fn a_late_subscriber_hears_of_ring_seals_in_seal_order() {
    let store = TestStore::start("64MiB");
    let c = store.client();
    c.put(ObjectId::random(), b"lease", b"").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let ids = ids_in_distinct_buckets(20);
    store.signal("-STOP");
    let writer = {
        let ids = ids.clone();
        std::thread::spawn(move || {
            for id in &ids {
                c.put(*id, b"x", b"").unwrap();
                std::thread::sleep(Duration::from_micros(50));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    store.signal("-CONT");
    writer.join().unwrap();
    let watcher = store.client();
    let mut sub = watcher
        .subscribe_with(ferroplasma_client::EventFraming::ReplyFrames, true)
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < ids.len() {
        let e = sub
            .next_timeout(Duration::from_secs(10))
            .unwrap()
            .expect("an event");
        if ids.contains(&e.id) {
            seen.push(e.id);
        }
    }
    assert_eq!(seen, ids, "existing objects in the order they were sealed");
}

/// Context switches of every thread of process `pid` so far.
fn context_switches(pid: u32) -> u64 {
    let mut n = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let status =
            std::fs::read_to_string(task.unwrap().path().join("status")).unwrap_or_default();
        n += status
            .lines()
            .filter(|l| l.contains("ctxt_switches"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    n
}

/// A store whose clients stopped writing looks for their records 50 times
/// a second, not every 2 ms: an idle store with a writing client connected
/// wakes a few tens of times a second (it woke 514 times before).
#[test]
fn an_idle_store_with_a_writer_connected_rarely_wakes() {
    let store = TestStore::start("64MiB");
    let c = store.client();
    c.put(ObjectId::random(), b"a ring and a lease", b"")
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let pid = store.child.as_ref().unwrap().id();
    let before = context_switches(pid);
    std::thread::sleep(Duration::from_secs(1));
    let woke = context_switches(pid) - before;
    assert!(woke < 150, "the idle store woke {woke} times in a second");
    // Writes still appear to other clients' reads without a round trip.
    let id = ObjectId::random();
    c.put(id, b"late", b"").unwrap();
    let other = store.client();
    let t = Instant::now();
    while !other.contains(&[id]).unwrap()[0] {
        assert!(t.elapsed() < Duration::from_secs(5), "never seen");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A store with no room left but the unused rest of a writer's lease takes
/// that rest back for another client's large object (evicting nothing),
/// and the writer, whose lease is closed, never writes there again: the
/// large object's bytes stay as written while the writer keeps putting.
#[test]
fn the_unused_rest_of_a_lease_is_taken_back_when_room_runs_out() {
    let store = TestStore::start("32MiB");
    let a = store.client();
    let kept = ObjectId::random();
    a.put(kept, &[1u8; 1000], b"").unwrap(); // a ring and a 1 MiB lease
    let b = store.client();
    let s = b.stats().unwrap();
    // Fits only with most of the lease back (a's object stays).
    let size = s.largest_free_block + (512 << 10);
    let big = ObjectId::random();
    let mut buf = b
        .create(big, size, b"")
        .expect("the lease's unused rest was taken back");
    buf.as_mut_slice().fill(0xAB);
    let sealed = b.seal(buf).unwrap();
    assert_eq!(b.stats().unwrap().evictions, 0, "nothing evicted for it");
    assert!(b.contains(&[kept]).unwrap()[0]);
    // The writer goes on: its lease is closed, so its puts go elsewhere
    // (or find the store full), never into the large object.
    for _ in 0..200 {
        let _ = a.put(ObjectId::random(), &[2u8; 1000], b"");
    }
    let got = b
        .get(&[big], Some(Duration::ZERO))
        .unwrap()
        .remove(0)
        .unwrap();
    assert!(
        got.data().iter().all(|&x| x == 0xAB),
        "the writer wrote into it"
    );
    drop((got, sealed));
}
