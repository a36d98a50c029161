//! Many waiters, many writers, one subscriber, against a real store.
//!
//! 200 clients each park the most gets a connection may have waiting
//! (4096), pipelined on a raw socket; 4 writers seal 100,000 objects; a
//! subscriber listens from before the first seal. Every waiter is woken
//! exactly once with its object, the subscriber sees every seal exactly
//! once, and afterwards the store holds no reference and nothing leaked.
//! `FP_STRESS_SCALE` scales the client and object counts (default 1).

mod common;

use common::TestStore;
use ferroplasma_client::{Client, EventKind, ObjectId};
use ferroplasma_protocol::frame::{encode_frame, FrameCodec, FrameReader};
use ferroplasma_protocol::pb::{self, reply, request};
use ferroplasma_protocol::ProtocolError;
use std::collections::HashSet;
use std::io::{ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const PARKED_PER_CLIENT: usize = 4096;

fn scale() -> usize {
    std::env::var("FP_STRESS_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

/// A raw connection that parks `ids.len()` gets (one id each, no timeout)
/// and returns the request ids answered and whether each had its object.
fn waiter(path: &Path, ids: Vec<ObjectId>) -> Vec<(u64, bool)> {
    let mut s = UnixStream::connect(path).unwrap();
    s.write_all(&encode_frame(&pb::Request {
        request_id: 0,
        body: Some(request::Body::Connect(pb::Connect {
            protocol_version: ferroplasma_protocol::PROTOCOL_VERSION,
            client_name: "stress waiter".into(),
        })),
    }))
    .unwrap();
    let mut out = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        out.extend(encode_frame(&pb::Request {
            request_id: i as u64 + 1,
            body: Some(request::Body::Get(pb::Get {
                object_ids: id.0.to_vec(),
                timeout_ms: -1,
            })),
        }));
    }
    s.write_all(&out).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let mut r = FrameReader::new(s, FrameCodec::REPLIES);
    let connect: pb::Reply = r.read_message().unwrap();
    assert!(matches!(connect.body, Some(reply::Body::Connect(_))));
    let answered = (0..ids.len())
        .map(|_| {
            let reply: pb::Reply = r.read_message().expect("a reply to every get");
            let ok = match reply.body {
                Some(reply::Body::Get(g)) => {
                    g.results.len() == 1 && g.results[0].location.is_some()
                }
                other => panic!("not a get reply: {other:?}"),
            };
            (reply.request_id, ok)
        })
        .collect();
    // And nothing more: no get is answered twice.
    r.get_ref()
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    match r.read_message::<pb::Reply>() {
        Err(ProtocolError::Io(e))
            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("a reply nobody asked for: {other:?}"),
    }
    answered
}

#[test]
fn waiters_writers_and_a_subscriber_at_scale() {
    let clients = 200 * scale();
    let objects = 100_000 * scale();
    let store = TestStore::start("256MiB");
    let path = store.path().to_path_buf();
    let ids: Arc<Vec<ObjectId>> = Arc::new((0..objects).map(|_| ObjectId::random()).collect());

    // The subscriber is acknowledged before anything is sealed.
    let mut sub = store.client().subscribe().unwrap();
    let subscriber = std::thread::spawn(move || {
        let mut seen = HashSet::with_capacity(objects);
        while seen.len() < objects {
            let e = sub
                .next_timeout(Duration::from_secs(300))
                .unwrap()
                .expect("a seal event");
            assert_eq!(e.kind, EventKind::Sealed);
            assert!(seen.insert(e.id), "seal of {} told twice", e.id);
        }
        seen
    });

    // Waiters park every get before the writers start.
    let waiters: Vec<_> = (0..clients)
        .map(|c| {
            let path = path.clone();
            let mine: Vec<ObjectId> = (0..PARKED_PER_CLIENT)
                .map(|k| ids[(c * PARKED_PER_CLIENT + k * 7) % objects])
                .collect();
            std::thread::spawn(move || waiter(&path, mine))
        })
        .collect();
    // Writers start only once every get is parked, so that every get is
    // answered by the wake-up path.
    let awaited: HashSet<ObjectId> = (0..clients)
        .flat_map(|c| {
            (0..PARKED_PER_CLIENT).map(move |k| (c * PARKED_PER_CLIENT + k * 7) % objects)
        })
        .map(|i| ids[i])
        .collect();
    let probe = store.client();
    let t = std::time::Instant::now();
    while probe.stats().unwrap().awaited_objects as usize != awaited.len() {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the gets were not all parked"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (path, ids) = (path.clone(), ids.clone());
            std::thread::spawn(move || {
                let c = Client::connect(Some(&path)).unwrap();
                for id in ids.iter().skip(w).step_by(4) {
                    c.create_and_seal(*id, &id.0, b"").unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    for w in waiters {
        let answered = w.join().unwrap();
        let rids: HashSet<u64> = answered.iter().map(|(r, _)| *r).collect();
        assert_eq!(
            rids.len(),
            PARKED_PER_CLIENT,
            "each get answered exactly once"
        );
        assert!(answered.iter().all(|(_, ok)| *ok), "each with its object");
    }
    let seen = subscriber.join().unwrap();
    assert_eq!(seen.len(), objects);
    assert!(ids.iter().all(|id| seen.contains(id)));

    // Nothing is held any more, and every byte used belongs to an object.
    store.eventually("the waiters' references are gone", || {
        let s = probe.stats().unwrap();
        s.referenced_objects == 0 && s.used == s.evictable_bytes
    });
    let s = probe.stats().unwrap();
    assert_eq!(s.objects as usize, objects);
    // The store's own memory stayed bounded: its peak resident set (the
    // arena's touched pages included) stays under 1 GiB per unit of scale.
    let pid = store.child.as_ref().unwrap().id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    println!(
        "store peak RSS: {} MiB for {clients} clients x {PARKED_PER_CLIENT} parked gets",
        peak_kib / 1024
    );
    assert!(peak_kib < (scale() as u64) << 20, "peak RSS {peak_kib} KiB");
}
