//! The cluster runs on its own thread: a store thread that is busy (here:
//! never driven again after start) does not stop heartbeats. And
//! heartbeats run on a thread of their own: a cluster thread that is busy
//! (a million directory entries registered, handed over or marked lost)
//! does not stop them either.

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

/// A member whose cluster thread is busy for three peer timeouts (here: a
/// task that never yields; before, re-registering a million objects held
/// it for seconds on a loaded machine) stays alive for its peers, and
/// sees them alive: heartbeats, their answers and the failure detector
/// run on the heartbeat thread.
#[test]
fn a_busy_cluster_thread_does_not_stop_heartbeats() {
    let rt = runtime();
    let b = member(&rt, vec![]);
    let a = member(&rt, vec![b.me().to_string()]);
    let both_alive =
        || lock(&b.membership).is_alive(a.me()) && lock(&a.membership).is_alive(b.me());
    let t = Instant::now();
    while !both_alive() {
        assert!(t.elapsed() < Duration::from_secs(10), "never met");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A's cluster thread is taken for three peer timeouts.
    let busy = 3 * PEER_TIMEOUT;
    a.rt.spawn(async move { std::thread::sleep(busy) });
    let t = Instant::now();
    while t.elapsed() < busy + PEER_TIMEOUT {
        assert!(
            both_alive(),
            "a member was declared dead while A's cluster thread was busy ({:?} in)",
            t.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
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
