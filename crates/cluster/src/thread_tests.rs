//! The cluster runs on its own thread: a store thread that is busy (here:
//! never driven again after start) does not stop heartbeats.

use crate::cluster::Cluster;
use crate::sync::lock;
use crate::testkit::runtime;
use std::sync::Arc;
use std::time::{Duration, Instant};

const PEER_TIMEOUT: Duration = Duration::from_millis(600);

fn member(rt: &tokio::runtime::Runtime, peers: Vec<String>) -> Arc<Cluster> {
    crate::testkit::member(rt, peers, Duration::from_millis(100), PEER_TIMEOUT)
}

#[test]
fn a_busy_store_thread_does_not_stop_heartbeats() {
    // B's store thread runs normally.
    let rt_b = runtime();
    let b = member(&rt_b, vec![]);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let driver = std::thread::spawn(move || {
        let _ = rt_b.block_on(stopped);
    });
    // A's store thread is never driven again after the start: as if it
    // were busy for good (a long batched get, a list of every object).
    let rt_a = runtime();
    let a = member(&rt_a, vec![b.me().to_string()]);
    let alive = || lock(&b.membership).is_alive(a.me());
    let t = Instant::now();
    while !alive() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "B never heard from A"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // And B keeps hearing from it, three peer timeouts long.
    let t = Instant::now();
    while t.elapsed() < 3 * PEER_TIMEOUT {
        assert!(
            alive(),
            "A was declared dead while its store thread was busy"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = stop.send(());
    driver.join().unwrap();
    drop(rt_a);
}

/// A member that has just (re)started and not yet met every member named to
/// it does not know the ring: a claim another member sends it then gets no
/// answer (it used to be granted at once, from a directory that knew
/// nothing yet, and one id came to name two objects: the nemesis found it).
#[test]
fn a_member_that_has_not_met_its_peers_grants_no_claim() {
    let rt = runtime();
    // Named a peer that never answers: not settled for a peer timeout.
    let fresh = member(&rt, vec!["127.0.0.1:9".into()]);
    let asker = member(&rt, vec![]);
    let msg = crate::pb::ClaimRequest {
        node: asker.me().to_string(),
        object_ids: ferroplasma_protocol::ObjectId::random().0.to_vec(),
        ..Default::default()
    };
    let answer = rt.block_on(async {
        let mut c = asker.peers.get(fresh.me()).expect("channel");
        c.claim(asker.peers.request(msg, Duration::ZERO)).await
    });
    match answer {
        Err(s) => assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}"),
        Ok(r) => panic!(
            "answered {:?} before knowing the ring",
            r.into_inner().granted
        ),
    }
}
