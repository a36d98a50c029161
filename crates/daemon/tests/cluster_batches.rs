//! Batched remote gets on real stores: one lookup per owner and one pull
//! per holder for a whole batch, every byte intact, and a holder that dies
//! in the middle of a batched pull.

mod common;

use common::cluster::{cluster_sized, eventually, Member};
use common::content;
use ferroplasma_client::{Client, ClientError, ClusterStatus, ObjectBuffer, ObjectId};
use std::collections::HashSet;
use std::time::{Duration, Instant};

fn status(m: &Member) -> ClusterStatus {
    m.client().cluster_status().unwrap()
}

/// Sizes from 0 to ~4 kB, different for each object.
fn size_of(i: usize) -> usize {
    (i * 37) % 4000
}

fn put_many(c: &Client, ids: &[ObjectId], size: impl Fn(usize) -> usize, offset: usize) {
    for (k, id) in ids.iter().enumerate() {
        let len = size(offset + k);
        let meta = &content(*id, 9)[..(offset + k) % 6];
        // Just after members join, the directory may be rebuilding: the
        // store says to retry shortly.
        let t = Instant::now();
        loop {
            match c.put(*id, &content(*id, len), meta) {
                Ok(()) => break,
                Err(ClientError::ClusterUnavailable(_))
                    if t.elapsed() < Duration::from_secs(15) =>
                {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => panic!("put: {e}"),
            }
        }
    }
}

/// Gets `ids` on `m` in one call once each is registered, and checks that
/// every object came, each byte of its data and metadata as `put_many`
/// (from offset 0) wrote it. Returns `m`'s counters before and after, and
/// the buffers.
fn fetch_whole(
    m: &Member,
    ids: &[ObjectId],
    size: impl Fn(usize) -> usize,
) -> (ClusterStatus, Vec<Option<ObjectBuffer>>, ClusterStatus) {
    let c = m.client();
    eventually("every object registered", Duration::from_secs(20), || {
        registered(&c, ids)
    });
    let before = status(m);
    let got = c.get(ids, Some(Duration::from_secs(60))).unwrap();
    for (i, (id, b)) in ids.iter().zip(&got).enumerate() {
        let b = b.as_ref().unwrap_or_else(|| panic!("object {i} missing"));
        assert!(b.data() == &content(*id, size(i))[..], "data of {i}");
        assert_eq!(b.metadata(), &content(*id, 9)[..i % 6], "metadata of {i}");
    }
    (before, got, status(m))
}

fn registered(c: &Client, ids: &[ObjectId]) -> bool {
    ids.chunks(10_000)
        .all(|piece| c.contains_in(piece, true).unwrap().iter().all(|&p| p))
}

/// 5,000 objects spread over three members, fetched by a fourth in one
/// get: every byte and every metadata byte is right, and the batch cost one
/// directory lookup per other owner and one pull request per holder, not
/// one of each per object.
#[test]
fn a_batched_get_of_5000_objects_held_by_three_members_costs_requests_per_member_not_per_object() {
    let m = cluster_sized(4, "128MiB");
    let ids: Vec<ObjectId> = (0..5000).map(|_| ObjectId::random()).collect();
    let per = ids.len().div_ceil(3);
    for (h, piece) in ids.chunks(per).enumerate() {
        put_many(&m[h].client(), piece, size_of, h * per);
    }
    let d = m[3].client();
    let (before, got, after) = fetch_whole(&m[3], &ids, size_of);
    assert_eq!(after.fetches - before.fetches, 5000);
    // One lookup per other owner (each a pull of what that owner holds
    // itself), then one pull per holder for the rest.
    let lookups = after.lookups - before.lookups;
    assert_eq!(lookups, 3, "one lookup per other owner, not per object");
    let pulls = after.pulls - before.pulls;
    assert!(
        (3..=6).contains(&pulls),
        "one request per owner and per holder, not per object: {pulls}"
    );
    // The copies are cached here now: a second get moves nothing.
    drop(got);
    let again = d.get(&ids, Some(Duration::from_secs(10))).unwrap();
    assert!(again.iter().all(Option::is_some));
    assert_eq!(status(&m[3]).pulls, after.pulls);
}

/// A batch held by one other member costs one round trip, whoever owns
/// the ids: the objects this member owns (its directory says where they
/// are) travel with the lookup of those the other owns, in one request.
/// Small and large objects (copied out and staged, or sent from the arena
/// into their allocations) come whole in the same stream.
#[test]
fn a_batch_held_by_one_other_member_comes_in_one_request() {
    let m = cluster_sized(2, "256MiB");
    let a = m[0].client();
    let size = |i: usize| {
        if i % 50 == 7 {
            300_000
        } else {
            (i * 37) % 3000
        }
    };
    let ids: Vec<ObjectId> = (0..1000).map(|_| ObjectId::random()).collect();
    put_many(&a, &ids, size, 0);
    let (before, _got, after) = fetch_whole(&m[1], &ids, size);
    assert_eq!(after.fetches - before.fetches, 1000);
    assert_eq!(after.lookups - before.lookups, 1, "one lookup");
    assert_eq!(
        after.pulls - before.pulls,
        1,
        "the objects this member owns came with the lookup"
    );
}

/// A batch whose objects are partly sealed and partly not created yet:
/// what is there is pulled at once (a get with a timeout returns it even if
/// the rest never comes), and the rest as it is sealed.
#[test]
fn a_batch_pulls_what_is_sealed_while_it_waits_for_the_rest() {
    let m = cluster_sized(3, "64MiB");
    let (a, c) = (m[0].client(), m[2].client());
    let now: Vec<ObjectId> = (0..50).map(|_| ObjectId::random()).collect();
    let later: Vec<ObjectId> = (0..50).map(|_| ObjectId::random()).collect();
    put_many(&a, &now, |_| 2000, 0);
    eventually("registered", Duration::from_secs(10), || {
        registered(&c, &now)
    });
    let all: Vec<ObjectId> = now.iter().chain(&later).copied().collect();
    // Nothing of `later` comes: the get times out with `now` in hand.
    let got = c.get(&all, Some(Duration::from_millis(1500))).unwrap();
    assert!(got[..50].iter().all(Option::is_some), "sealed ones pulled");
    assert!(got[50..].iter().all(Option::is_none));
    drop(got);
    // Now the rest is created while a get waits for all of them: the first
    // one sealed is pulled at once, before the others exist (the owners'
    // lookups answer as soon as one of their ids is sealed).
    let waiter = std::thread::spawn(move || {
        let got = c.get(&all, Some(Duration::from_secs(30))).unwrap();
        got.iter().all(Option::is_some)
    });
    std::thread::sleep(Duration::from_millis(300));
    let fetched = status(&m[2]).fetches;
    let b = m[1].client();
    put_many(&b, &later[..1], |_| 3000, 0);
    eventually("the first one pulled alone", Duration::from_secs(5), || {
        status(&m[2]).fetches == fetched + 1
    });
    put_many(&b, &later[1..], |_| 3000, 1);
    assert!(waiter.join().unwrap(), "every object arrived");
}

fn kill(m: &mut Member) {
    let mut child = m.store.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A holder killed in the middle of a batched pull: the objects another
/// member also holds are pulled from that member, the rest are reported
/// lost (`ObjectLost`), and no get hangs.
#[test]
fn a_holder_killed_mid_pull_gives_what_others_hold_and_loses_the_rest() {
    let mut m = cluster_sized(3, "512MiB");
    let (b, c) = (m[1].client(), m[2].client());
    const N: usize = 400;
    const SIZE: usize = 1 << 20;
    let ids: Vec<ObjectId> = (0..N).map(|_| ObjectId::random()).collect();
    put_many(&m[0].client(), &ids, |_| SIZE, 0);
    // B also holds every third object (cached copies, registered).
    let shared: Vec<ObjectId> = ids.iter().step_by(3).copied().collect();
    drop(b.get(&shared, Some(Duration::from_secs(30))).unwrap());
    eventually("B's copies registered", Duration::from_secs(10), || {
        let listed = c.list_in(true).unwrap();
        let on_b: HashSet<ObjectId> = listed
            .iter()
            .filter(|o| o.node == m[1].addr)
            .map(|o| o.id)
            .collect();
        shared.iter().all(|id| on_b.contains(id))
    });
    eventually("registered", Duration::from_secs(10), || {
        registered(&c, &ids)
    });
    // C pulls all of them; A (which holds all, and so is asked for all)
    // is stopped once the first objects have arrived, then killed.
    let fetched = status(&m[2]).fetches;
    let asked = ids.clone();
    let getter = std::thread::spawn(move || c.get(&asked, Some(Duration::from_secs(60))));
    let t = Instant::now();
    while status(&m[2]).fetches == fetched {
        assert!(t.elapsed() < Duration::from_secs(20), "nothing pulled");
        std::thread::sleep(Duration::from_millis(1));
    }
    common::cluster::signal(&m[0], "-STOP");
    let arrived = status(&m[2]).fetches - fetched;
    assert!(
        (arrived as usize) < N,
        "the pull was stopped in the middle ({arrived} of {N} arrived)"
    );
    kill(&mut m[0]);
    let t0 = Instant::now();
    match getter.join().unwrap() {
        Err(ClientError::ObjectLost { id: Some(id), .. }) => {
            assert!(!shared.contains(&id), "{id} is held by B, not lost")
        }
        other => panic!("expected ObjectLost for the batch, got {other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    // What B holds comes whole from B (or had come from A already).
    let c = m[2].client();
    let got = c.get(&shared, Some(Duration::from_secs(20))).unwrap();
    for (id, buf) in shared.iter().zip(&got) {
        let buf = buf.as_ref().expect("held by B");
        assert!(buf.data() == &content(*id, SIZE)[..], "data of {id}");
    }
    // The rest is lost, except what arrived from A before it stopped.
    let here: HashSet<ObjectId> = c.list().unwrap().iter().map(|o| o.id).collect();
    let mut lost = 0;
    for id in ids.iter().filter(|id| !shared.contains(id)) {
        match c.get(&[*id], Some(Duration::from_secs(20))) {
            Ok(v) if here.contains(id) => {
                let buf = v[0].as_ref().expect("arrived before the stop");
                assert!(buf.data() == &content(*id, SIZE)[..], "data of {id}");
            }
            Err(ClientError::ObjectLost { id: Some(l), .. }) => {
                assert_eq!(l, *id);
                lost += 1;
            }
            other => panic!("expected ObjectLost for {id}, got {other:?}"),
        }
    }
    assert!(lost > 0, "some objects only A held were lost");
}
