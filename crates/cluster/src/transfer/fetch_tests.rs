//! Remote gets between in-process members whose state a test can reach
//! into: what a fetch does when the directory is behind the stores.

use crate::cluster::Cluster;
use crate::directory::agent;
use crate::sync::lock;
use crate::testkit::{member_with_store, runtime, TestStore};
use ferroplasma_protocol::ObjectId;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A member and its store.
struct Member {
    cluster: Arc<Cluster>,
    store: Arc<TestStore>,
}

impl std::ops::Deref for Member {
    type Target = Arc<Cluster>;

    fn deref(&self) -> &Arc<Cluster> {
        &self.cluster
    }
}

fn member(rt: &tokio::runtime::Runtime, peers: Vec<String>) -> Member {
    let beat = Duration::from_millis(50);
    let (cluster, store) = member_with_store(rt, peers, beat, Duration::from_secs(2));
    Member { cluster, store }
}

fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(15), "never: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Two members, F and G (on `rts[0]` and `rts[1]`), once each sees the
/// ring of both and has settled.
fn two_members(rts: &[tokio::runtime::Runtime]) -> (Member, Member) {
    let f = member(&rts[0], vec![]);
    let g = member(&rts[1], vec![f.me().to_string()]);
    eventually("a ring of two everywhere", || {
        [&f, &g]
            .iter()
            .all(|m| lock(&m.ring).members().len() == 2 && m.settled())
    });
    (f, g)
}

/// A fresh id whose owner in `c`'s ring is `owner`.
fn owned_by(c: &Cluster, owner: &str) -> ObjectId {
    loop {
        let id = ObjectId::random();
        if c.targets(&id)[0] == owner {
            return id;
        }
    }
}

/// Creates `id` sealed in `c`'s store with `bytes` (as a client's put
/// would, its seal heard by the agent, who registers it).
fn put(c: &Member, id: ObjectId, bytes: &[u8]) {
    c.store.put(id, bytes);
}

/// `id`'s data in `c`'s store, if it is sealed there.
fn data(c: &Member, id: &ObjectId) -> Option<Vec<u8>> {
    c.store.data(id)
}

fn holders(c: &Cluster, id: &ObjectId) -> Vec<String> {
    let d = lock(&c.directory);
    let mut h: Vec<String> = d
        .lookup(id)
        .map(|e| e.holders.iter().map(|h| h.to_string()).collect())
        .unwrap_or_default();
    h.sort();
    h
}

/// F owns X, held by G and (its directory says) by H; F asks H a LOOKUP
/// anyway (for Y, which H owns and holds), so X rides in it. H has lost its
/// copy and F has not heard yet: X comes from G at once, from F's own
/// entry, with no lookup more and no wait.
#[test]
fn an_object_the_asked_member_no_longer_has_comes_from_its_other_holder() {
    let rts: Vec<_> = (0..3).map(|_| runtime()).collect();
    let f = member(&rts[0], vec![]);
    let h = member(&rts[1], vec![f.me().to_string()]);
    let g = member(&rts[2], vec![f.me().to_string()]);
    let all = [&f, &h, &g];
    eventually("a ring of three everywhere", || {
        all.iter().all(|m| lock(&m.ring).members().len() == 3) && all.iter().all(|m| m.settled())
    });
    let x = owned_by(&f, f.me());
    let y = owned_by(&f, h.me());
    let (xs, ys) = (vec![0x5a; 3000], vec![0xa5; 100]);
    put(&g, x, &xs);
    put(&h, y, &ys);
    // H takes a copy of X from G (registered with F as a second holder).
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    h.want(vec![x], None, tx.clone());
    let mut both = vec![g.me().to_string(), h.me().to_string()];
    both.sort();
    eventually("F's directory lists G and H for X", || {
        holders(&f, &x) == both
    });
    eventually("H's directory lists Y", || holders(&h, &y) == [h.me()]);
    // H loses its copy, and nobody hears of it (the effects that would
    // tell its agent are dropped): F's entry is now behind H's store.
    {
        let mut sh = h.store.lock();
        let (_, fx) = sh.store.delete(x);
        drop(fx);
        assert!(!sh.store.exists(&x));
    }
    assert_eq!(holders(&f, &x), both);
    let served = h.counters.served.load(Ordering::Relaxed);
    let lookups = f.counters.lookups.load(Ordering::Relaxed);

    f.want(vec![x, y], None, tx);
    eventually("X and Y on F", || {
        data(&f, &x).is_some() && data(&f, &y).is_some()
    });
    assert_eq!(data(&f, &x).as_deref(), Some(&xs[..]), "X's bytes");
    assert_eq!(data(&f, &y).as_deref(), Some(&ys[..]), "Y's bytes");
    assert_eq!(
        f.counters.lookups.load(Ordering::Relaxed) - lookups,
        1,
        "one LOOKUP (to H, with X in it); X's other holder came from F's own entry"
    );
    assert_eq!(
        h.counters.served.load(Ordering::Relaxed) - served,
        1,
        "H sent Y only"
    );
}

/// While F pulls X from G, X is made in F's own store (here: created
/// there directly while G is held up before it sends). The pulled bytes
/// find the id taken: F keeps its own object, which is not a cached copy
/// (its seal registers it as a primary, and as the later seal it is the
/// one the directory keeps) and is not counted as fetched.
#[test]
fn an_object_made_here_during_its_pull_stays_this_members_own() {
    let rts: Vec<_> = (0..2).map(|_| runtime()).collect();
    let (f, g) = two_members(&rts);
    let x = owned_by(&f, f.me());
    let (theirs, ours) = (vec![2u8; 2000], vec![1u8; 2000]);
    put(&g, x, &theirs);
    eventually("F's directory lists G for X", || {
        holders(&f, &x) == [g.me()]
    });
    let (fetched, pulls) = (
        f.counters.fetches.load(Ordering::Relaxed),
        f.counters.pulls.load(Ordering::Relaxed),
    );
    {
        // G cannot pin anything while its state is held: F's pull waits
        // in G's answer.
        let _held = g.store.lock();
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        f.want(vec![x], None, tx);
        eventually("F's pull sent", || {
            f.counters.pulls.load(Ordering::Relaxed) > pulls
        });
        std::thread::sleep(Duration::from_millis(100));
        put(&f, x, &ours);
    }
    eventually("the fetch of X over", || {
        !lock(&f.inflight).contains_key(&x)
    });
    assert_eq!(data(&f, &x).as_deref(), Some(&ours[..]), "F's own bytes");
    assert!(!f.is_cached(&x), "F's own object is not a cached copy");
    assert_eq!(f.counters.fetches.load(Ordering::Relaxed), fetched);
    // Registered as a primary, sealed after G's: the later object is X.
    eventually("F registered as X's holder", || holders(&f, &x) == [f.me()]);
}

/// A reader on F gets G's objects one at a time, each as soon as the one
/// before is here. Their copies are announced to G (owner or backup of
/// every id in a ring of two) in at most one update per
/// [`agent::LINGER`](agent::LINGER), not one per get, and
/// every one of them is announced.
#[test]
fn copies_pulled_one_at_a_time_are_announced_together() {
    let rts: Vec<_> = (0..2).map(|_| runtime()).collect();
    let (f, g) = two_members(&rts);
    let ids: Vec<ObjectId> = (0..60).map(|_| ObjectId::random()).collect();
    for (i, id) in ids.iter().enumerate() {
        put(&g, *id, &[i as u8; 1000]);
    }
    eventually("G's objects in both directories", || {
        ids.iter()
            .all(|id| holders(&f, id) == [g.me()] && holders(&g, id) == [g.me()])
    });
    let updates = f.counters.updates.load(Ordering::Relaxed);
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let started = Instant::now();
    for (i, id) in ids.iter().enumerate() {
        f.want(vec![*id], None, tx.clone());
        let t = Instant::now();
        while data(&f, id).is_none() {
            assert!(t.elapsed() < Duration::from_secs(10), "get {i} never done");
            std::thread::sleep(Duration::from_micros(20));
        }
    }
    // The last announcement may go out up to one linger (and a timer tick)
    // after the last get.
    let took = started.elapsed();
    let mut both = vec![f.me().to_string(), g.me().to_string()];
    both.sort();
    eventually("every copy announced on both members", || {
        ids.iter()
            .all(|id| holders(&f, id) == both && holders(&g, id) == both)
    });
    let sent = f.counters.updates.load(Ordering::Relaxed) - updates;
    let linger = agent::LINGER;
    let most = (took.as_micros() / linger.as_micros()) as u64 + 3;
    assert!(
        sent <= most,
        "{sent} updates for {} copies pulled in {took:?}: at most {most} (one per {linger:?})",
        ids.len()
    );
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            data(&f, id),
            Some(vec![i as u8; 1000]),
            "object {i}'s bytes"
        );
    }
}
