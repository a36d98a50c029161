//! Ids a cluster member hands out (`Client::new_id`, docs/cluster.md):
//! claimed cluster-wide ahead, so that a put with one asks no other member
//! (and a small one not even its own store), while ids stay unique across
//! the cluster and a member's rings take in no other id.

mod common;

use common::cluster::{check, cluster, eventually, signal, Member};
use common::content;
use ferroplasma_client::{Client, ObjectId};
use std::collections::HashSet;
use std::time::Duration;

/// Up to `n` ids from `c`, retried while the cluster is still settling.
fn new_ids(c: &Client, n: usize) -> Vec<ObjectId> {
    let t = std::time::Instant::now();
    (0..n)
        .map(|_| loop {
            match c.new_id() {
                Err(ferroplasma_client::ClientError::ClusterUnavailable(_))
                    if t.elapsed() < Duration::from_secs(15) =>
                {
                    std::thread::sleep(Duration::from_millis(50))
                }
                r => break r.unwrap(),
            }
        })
        .collect()
}

fn put_all(c: &Client, ids: &[ObjectId], len: usize) {
    for id in ids {
        c.put(*id, &content(*id, len), &content(*id, 9)[..5])
            .unwrap();
    }
}

/// With ids from `new_id`, a member's client puts small objects while
/// every other member of the cluster is stopped (SIGSTOP): no claim. (Its
/// own store is left running: stopped inside its lock, it would rightly
/// hold up writes without a round trip, which on one store are tested in
/// fast_writes.rs.) Once they run again, every member reads them.
#[test]
fn puts_with_handed_ids_ask_no_member() {
    let m = cluster(3);
    let a = m[0].client();
    let ids = new_ids(&a, 101);
    // The first put asks for the ring and a lease.
    put_all(&a, &ids[..1], 1000);
    std::thread::sleep(Duration::from_millis(200));
    for x in &m[1..] {
        signal(x, "-STOP");
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let writer = {
        let ids = ids[1..].to_vec();
        std::thread::spawn(move || {
            put_all(&a, &ids, 1000);
            let _ = tx.send(());
        })
    };
    let answered = rx.recv_timeout(Duration::from_secs(10)).is_ok();
    for x in &m[1..] {
        signal(x, "-CONT");
    }
    writer.join().unwrap();
    assert!(
        answered,
        "a put with a handed id waited for a stopped store"
    );
    for reader in [&m[1], &m[2]] {
        let c = reader.client();
        for id in &ids {
            check(&c, *id, 1000, Duration::from_secs(10));
        }
    }
}

/// Members hand out ids no other member hands out, and objects put with
/// them from several members at once are each readable everywhere; the
/// ids a client never used are given back when it leaves.
#[test]
fn handed_ids_are_unique_across_members_and_go_back_unused() {
    let m = cluster(3);
    let writers: Vec<_> = m
        .iter()
        .map(|x| {
            let c = x.client();
            std::thread::spawn(move || {
                let ids = new_ids(&c, 600);
                put_all(&c, &ids, 100);
                ids
            })
        })
        .collect();
    let all: Vec<Vec<ObjectId>> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    let distinct: HashSet<ObjectId> = all.iter().flatten().copied().collect();
    assert_eq!(distinct.len(), 1800, "an id was handed out twice");
    let c = m[2].client();
    for id in &all[0] {
        check(&c, *id, 100, Duration::from_secs(10));
    }
    // A client that takes ids and leaves without using them: their claims
    // go back, and the directory ends up holding only the objects' entries.
    let entries = |x: &Member| x.client().cluster_status().unwrap().directory_entries;
    eventually("the directory settles", Duration::from_secs(10), || {
        m.iter().map(entries).sum::<u64>() == 2 * 1800 + claimed_ahead(&m)
    });
    {
        let idle = m[1].client();
        new_ids(&idle, 10);
    }
    eventually("unused ids are given back", Duration::from_secs(10), || {
        m.iter().map(entries).sum::<u64>() == 2 * 1800 + claimed_ahead(&m)
    });
}

/// Directory entries held for ids the members claimed ahead and have not
/// handed out (two each: owner and backup).
fn claimed_ahead(m: &[Member]) -> u64 {
    m.iter()
        .map(|x| 2 * x.client().cluster_status().unwrap().ids_claimed_ahead)
        .sum()
}

/// A member's ring takes in a create only of an id the member handed that
/// client: a hand-made ring record of any other id is turned down as taken
/// (`Settle` says so, the id is not created, the ring is still read),
/// while one of a handed id is taken in.
#[test]
fn a_member_ring_takes_in_only_handed_ids() {
    use common::attacker::raw_connection;
    use ferroplasma_protocol::fast_writes::RING_HEADER_BYTES;
    use ferroplasma_protocol::pb::{self, reply, request};
    let m = cluster(2);
    let (mut s, hello, fds) = raw_connection(m[0].store.path());
    assert!(hello.cluster_member);
    let ask = |s: &mut std::os::unix::net::UnixStream, body| {
        use ferroplasma_protocol::frame::{read_message, write_message};
        let req = pb::Request {
            request_id: 7,
            body: Some(body),
        };
        write_message(s, &req).unwrap();
        let r: pb::Reply = read_message(s, 1 << 20).unwrap();
        r.body.expect("a reply")
    };
    let lease = |s: &mut _| {
        ask(
            s,
            request::Body::Lease(pb::Lease {
                size: 1 << 20,
                ended: vec![],
                bumps_top: false,
            }),
        )
    };
    let reply::Body::Lease(l) = lease(&mut s) else {
        panic!("a member offers leases")
    };
    let handed = loop {
        match ask(&mut s, request::Body::NewIds(pb::NewIds { count: 4 })) {
            reply::Body::NewIds(r) => break ObjectId::from_slice(&r.object_ids[..20]).unwrap(),
            reply::Body::Error(e) if e.code == pb::ErrorCode::ClusterUnavailable as i32 => {
                std::thread::sleep(Duration::from_millis(50))
            }
            other => panic!("{other:?}"),
        }
    };
    // The store's arena, mapped shared; this test writes only its own ring
    // and lease.
    let arena = memmap2::MmapOptions::new()
        .len(hello.arenas[0].size as usize)
        .map_raw(&fds[0])
        .unwrap();
    let record = |at: u64, id: &ObjectId, kind: u64, offset: u64| {
        let w = ferroplasma_protocol::shared_table::id_words(id);
        let words = [kind, w[0], w[1], w[2], offset, 100, 0, 0];
        for (i, v) in words.iter().enumerate() {
            let p = l.ring_offset as usize + RING_HEADER_BYTES + (at as usize) * 64 + i * 8;
            // Safety: inside the mapping (the store put the ring there).
            unsafe { (arena.as_mut_ptr().add(p) as *mut u64).write_volatile(*v) };
        }
        // Safety: the ring's head, inside the mapping.
        unsafe {
            (arena.as_mut_ptr().add(l.ring_offset as usize) as *mut u64).write_volatile(at + 1)
        };
    };
    // CREATE then SEAL of the handed id, in the lease.
    record(0, &handed, 1, l.offset);
    record(1, &handed, 2, l.offset);
    assert!(matches!(lease(&mut s), reply::Body::Lease(_)));
    let c = m[0].client();
    assert!(
        c.contains(&[handed]).unwrap()[0],
        "the handed id was taken in"
    );
    // CREATE of an id nobody handed out: turned down as taken (the client
    // hears it at Settle), and the ring is still read.
    let forged = ObjectId::random();
    record(2, &forged, 1, l.offset + 4096);
    let settled = ask(
        &mut s,
        request::Body::Settle(pb::Settle {
            object_id: forged.0.to_vec(),
        }),
    );
    let reply::Body::Error(e) = settled else {
        panic!("a ring create of an id not handed out was taken in: {settled:?}")
    };
    assert_eq!(e.code, pb::ErrorCode::ObjectExists as i32, "{}", e.message);
    assert!(!c.contains(&[forged]).unwrap()[0]);
    let second = match ask(&mut s, request::Body::NewIds(pb::NewIds { count: 1 })) {
        reply::Body::NewIds(r) => ObjectId::from_slice(&r.object_ids[..20]).unwrap(),
        other => panic!("{other:?}"),
    };
    record(3, &second, 1, l.offset + 8192);
    record(4, &second, 2, l.offset + 8192);
    assert!(matches!(lease(&mut s), reply::Body::Lease(_)));
    assert!(c.contains(&[second]).unwrap()[0], "the ring is still read");
}

/// A connection holds at most 4096 handed ids it has not used, even when
/// it asks for them in many requests sent back to back (each passed the
/// count before any was answered).
#[test]
fn a_connection_holds_at_most_4096_unused_ids() {
    use common::attacker::raw_connection;
    use ferroplasma_protocol::frame::{read_message, write_message};
    use ferroplasma_protocol::pb::{self, reply, request};
    let m = cluster(2);
    // Until the members have settled, NewIds answers "retry shortly".
    let warm = m[0].client();
    new_ids(&warm, 1);
    let (mut s, _, _) = raw_connection(m[0].store.path());
    for i in 0..24 {
        let req = pb::Request {
            request_id: 100 + i,
            body: Some(request::Body::NewIds(pb::NewIds { count: 256 })),
        };
        write_message(&mut s, &req).unwrap();
    }
    let mut held = 0;
    for _ in 0..24 {
        let r: pb::Reply = read_message(&mut s, 1 << 20).unwrap();
        match r.body.expect("a reply") {
            reply::Body::NewIds(ids) => held += ids.object_ids.len() / 20,
            reply::Body::Error(e) => {
                assert_eq!(e.code, pb::ErrorCode::TooLarge as i32, "{}", e.message)
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(held, 4096, "handed out {held}");
}
