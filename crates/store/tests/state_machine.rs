//! The state machine's rules, driven directly (no daemon, no I/O).
//!
//! These tests check the store's state, not what it asks the daemon to
//! deliver, so they drop `Effects` freely (daemon code may not: it is
//! `#[must_use]`).
#![allow(unused_must_use)]

use ferroplasma_protocol::ObjectId;
use ferroplasma_store::*;
use proptest::prelude::*;

fn id(n: u8) -> ObjectId {
    ObjectId([n; 20])
}

fn sealed(s: &mut Store, c: ClientId, n: u8, size: u64) {
    s.create(c, id(n), size, 0, 0).unwrap();
    s.seal(c, id(n), 1).unwrap();
    s.release(c, id(n)).unwrap();
}

#[test]
fn lifecycle_create_seal_get_release_delete() {
    let mut s = Store::new(1 << 20);
    let a = s.connect();
    let b = s.connect();
    let (loc, _) = s.create(a, id(1), 100, 10, 5).unwrap();
    assert_eq!(loc.offset % 64, 0);
    assert_eq!(loc.metadata_offset() % 64, 0);
    assert!(!s.contains(&id(1)), "unsealed objects are invisible");
    assert!(!s.contains_deleting(&id(1)), "to Plasma's contains too");
    assert_eq!(s.get(b, id(1)), None);
    assert_eq!(s.seal(b, id(1), 6), Err(StoreError::NotCreator(id(1))));
    s.seal(a, id(1), 9).unwrap();
    assert_eq!(s.seal(a, id(1), 9), Err(StoreError::AlreadySealed(id(1))));
    assert!(s.contains(&id(1)));
    assert_eq!(s.get(b, id(1)), Some(loc));
    let info = &s.list()[0];
    assert_eq!((info.ref_count, info.construct_duration_us), (2, Some(4)));
    assert_eq!(
        s.create(b, id(1), 1, 0, 0).unwrap_err(),
        StoreError::ObjectExists(id(1))
    );
    s.release(a, id(1)).unwrap();
    assert_eq!(s.release(a, id(1)), Err(StoreError::NotHeld(id(1))));
    assert_eq!(s.delete(id(1)).0, DeleteOutcome::Deferred);
    assert!(!s.contains(&id(1)));
    assert!(
        s.contains_deleting(&id(1)),
        "Plasma's: there until released"
    );
    s.release(b, id(1)).unwrap();
    assert!(!s.contains_deleting(&id(1)));
    assert_eq!(s.stats().objects, 0);
    assert_eq!(s.stats().used, 0);
    assert_eq!(s.delete(id(1)).0, DeleteOutcome::NotFound);
}

#[test]
fn seal_wakes_watchers_and_tells_subscribers() {
    let mut s = Store::new(1 << 20);
    let (a, w, sub) = (s.connect(), s.connect(), s.connect());
    s.subscribe(sub);
    s.watch(w, id(3));
    s.create(a, id(3), 8, 0, 0).unwrap();
    let fx = s.seal(a, id(3), 0).unwrap();
    assert_eq!(fx.notices[0], (w, Notice::Sealed(id(3))));
    assert!(matches!(
        fx.notices[1],
        (c, Notice::Event(Event { kind: EventKind::Sealed, data_size: 8, .. })) if c == sub
    ));
    // The watch is consumed by the seal.
    s.release(a, id(3)).unwrap();
    let fx = s.delete(id(3)).1;
    assert_eq!(fx.notices.len(), 1);
    assert!(matches!(
        fx.notices[0].1,
        Notice::Event(Event {
            kind: EventKind::Deleted,
            ..
        })
    ));
}

#[test]
fn eviction_is_lru_by_release_and_only_as_much_as_needed() {
    let mut s = Store::new(64 * 10);
    let c = s.connect();
    for n in 1..=5 {
        sealed(&mut s, c, n, 128);
    }
    // Touch 1 so that it becomes the most recently released.
    s.get(c, id(1)).unwrap();
    s.release(c, id(1)).unwrap();
    // 10 slots, 10 used: a 2-slot create must evict exactly one object: 2.
    s.create(c, id(9), 128, 0, 0).unwrap();
    assert!(!s.contains(&id(2)));
    for n in [1, 3, 4, 5] {
        assert!(s.contains(&id(n)), "{n} evicted needlessly");
    }
    assert_eq!(s.stats().evictions, 1);
    // Explicit evict takes the next in order: 3, then 4.
    let (freed, count, _) = s.evict(129);
    assert_eq!((freed, count), (256, 2));
    assert!(!s.contains(&id(3)) && !s.contains(&id(4)) && s.contains(&id(1)));
}

#[test]
fn referenced_and_unsealed_objects_are_never_evicted() {
    let mut s = Store::new(64 * 4);
    let c = s.connect();
    s.create(c, id(1), 64, 0, 0).unwrap(); // unsealed
    s.create(c, id(2), 64, 0, 0).unwrap();
    s.seal(c, id(2), 0).unwrap(); // sealed, still referenced by its creator
    s.create(c, id(3), 128, 0, 0).unwrap();
    let err = s.create(c, id(4), 64, 0, 0).unwrap_err();
    assert!(matches!(
        err,
        StoreError::StoreFull {
            requested: 64,
            free: 0,
            evictable: 0,
            ..
        }
    ));
    assert_eq!(s.stats().objects, 3);
    assert_eq!(s.evict(1 << 20).1, 0);
}

#[test]
fn an_object_as_large_as_the_store_fits_and_larger_does_not() {
    let mut s = Store::new(1 << 16);
    let c = s.connect();
    s.create(c, id(1), 1 << 16, 0, 0).unwrap();
    s.abort(c, id(1)).unwrap();
    assert!(matches!(
        s.create(c, id(1), (1 << 16) + 1, 0, 0),
        Err(StoreError::StoreFull { .. })
    ));
}

#[test]
fn metadata_over_128_mib_is_refused_before_anything_is_allocated() {
    let mut s = Store::new(1 << 30);
    let c = s.connect();
    let too_much = ferroplasma_store::MAX_METADATA + 1;
    assert_eq!(
        s.create(c, id(1), 64, too_much, 0).unwrap_err(),
        StoreError::MetadataTooLarge {
            size: too_much,
            limit: ferroplasma_store::MAX_METADATA
        }
    );
    assert_eq!(s.stats().objects, 0);
    let (loc, _) = s.create(c, id(1), 64, (1 << 27) - 1, 0).unwrap();
    assert_eq!(loc.metadata_size, (1 << 27) - 1);
    s.seal(c, id(1), 1).unwrap();
    let listed = s.list();
    assert_eq!(listed[0].location.metadata_size, (1 << 27) - 1);
}

#[test]
fn disconnect_aborts_creations_and_drops_references() {
    let mut s = Store::new(1 << 20);
    let (a, b) = (s.connect(), s.connect());
    sealed(&mut s, a, 1, 1000);
    s.get(b, id(1)).unwrap();
    s.get(b, id(1)).unwrap();
    s.create(b, id(2), 5000, 0, 0).unwrap();
    s.watch(b, id(7));
    s.delete(id(1));
    s.disconnect(b);
    let st = s.stats();
    assert_eq!((st.objects, st.used, st.clients), (0, 0, 1));
    // A later seal of a watched id notifies nobody.
    s.create(a, id(7), 1, 0, 0).unwrap();
    assert!(s.seal(a, id(7), 0).unwrap().notices.is_empty());
}

#[test]
fn abort_frees_and_allows_recreate() {
    let mut s = Store::new(1 << 20);
    let c = s.connect();
    s.create(c, id(1), 1000, 0, 0).unwrap();
    s.abort(c, id(1)).unwrap();
    assert_eq!(s.stats().used, 0);
    s.create(c, id(1), 1000, 0, 0).unwrap();
    s.seal(c, id(1), 0).unwrap();
    assert_eq!(s.abort(c, id(1)), Err(StoreError::AlreadySealed(id(1))));
}

#[derive(Debug, Clone)]
enum Op {
    Create(u8, u8, u16),
    Seal(u8, u8),
    Abort(u8, u8),
    Get(u8, u8),
    Release(u8, u8),
    Delete(u8),
    Evict(u16),
    Disconnect(u8),
}

#[test]
fn discarded_unsealed_objects_are_reported_as_aborted() {
    let mut s = Store::new(1 << 20);
    let c = s.connect();
    s.create(c, id(1), 10, 0, 0).unwrap();
    s.create(c, id(2), 10, 0, 0).unwrap();
    s.create(c, id(3), 10, 0, 0).unwrap();
    s.seal(c, id(3), 1).unwrap();
    assert_eq!(s.abort(c, id(1)).unwrap().aborted, vec![id(1)]);
    // Disconnecting aborts the rest of the unsealed ones, not the sealed one.
    let fx = s.disconnect(c);
    assert_eq!(fx.aborted, vec![id(2)]);
    // Deleting a sealed object is not an abort.
    let c = s.connect();
    sealed(&mut s, c, 4, 10);
    assert!(s.delete(id(4)).1.aborted.is_empty());
}

fn op() -> impl Strategy<Value = Op> {
    let c = 0u8..3;
    let o = 0u8..12;
    prop_oneof![
        (c.clone(), o.clone(), 0u16..3000).prop_map(|(c, o, s)| Op::Create(c, o, s)),
        (c.clone(), o.clone()).prop_map(|(c, o)| Op::Seal(c, o)),
        (c.clone(), o.clone()).prop_map(|(c, o)| Op::Abort(c, o)),
        (c.clone(), o.clone()).prop_map(|(c, o)| Op::Get(c, o)),
        (c.clone(), o.clone()).prop_map(|(c, o)| Op::Release(c, o)),
        o.prop_map(Op::Delete),
        (0u16..5000).prop_map(Op::Evict),
        c.prop_map(Op::Disconnect),
    ]
}

proptest! {
    /// Whatever clients do, memory accounting stays exact, referenced objects
    /// survive, and when everyone leaves and everything is deleted, nothing
    /// is left.
    #[test]
    fn accounting_survives_any_sequence(ops in proptest::collection::vec(op(), 1..300)) {
        let mut s = Store::new(16 * 1024);
        let mut clients: Vec<ClientId> = (0..3).map(|_| s.connect()).collect();
        for op in ops {
            match op {
                Op::Create(c, o, n) => { let _ = s.create(clients[c as usize], id(o), n as u64, 3, 0); }
                Op::Seal(c, o) => { let _ = s.seal(clients[c as usize], id(o), 0); }
                Op::Abort(c, o) => { let _ = s.abort(clients[c as usize], id(o)); }
                Op::Get(c, o) => { let _ = s.get(clients[c as usize], id(o)); }
                Op::Release(c, o) => { let _ = s.release(clients[c as usize], id(o)); }
                Op::Delete(o) => { let _ = s.delete(id(o)); }
                Op::Evict(n) => { let _ = s.evict(n as u64); }
                Op::Disconnect(c) => {
                    s.disconnect(clients[c as usize]);
                    clients[c as usize] = s.connect();
                }
            }
            let list = s.list();
            let held: u64 = list.iter().map(|i| ferroplasma_protocol::layout::allocation_size(
                i.location.data_size, i.location.metadata_size)).sum();
            prop_assert_eq!(s.stats().used, held);
            // The counters stats reports in O(1) match a recount.
            let in_memory = list.iter().filter(|i| !i.spilled);
            let sealed = in_memory.clone().filter(|i| i.state == ObjectState::Sealed).count();
            let referenced = in_memory.filter(|i| i.ref_count > 0).count();
            prop_assert_eq!(s.stats().sealed_objects, sealed as u64);
            prop_assert_eq!(s.stats().referenced_objects, referenced as u64);
            for i in &list {
                if let ObjectState::Created { creator } = i.state {
                    prop_assert!(clients.contains(&creator), "orphaned unsealed object");
                }
            }
        }
        for c in clients { s.disconnect(c); }
        for i in s.list() { s.delete(i.id); }
        prop_assert_eq!(s.stats().used, 0);
        prop_assert_eq!(s.stats().objects, 0);
    }
}

proptest! {
    /// The store keeps its built-in eviction order in its object table;
    /// it evicts exactly what a store with [`Lru`] as its policy evicts,
    /// whatever clients do, and reports the same objects and figures.
    #[test]
    fn the_built_in_order_is_lru(ops in proptest::collection::vec(op(), 1..300)) {
        let mut a = Store::new(16 * 1024);
        let mut b = Store::with_policy(16 * 1024, Box::new(Lru::default()));
        let clients: Vec<(ClientId, ClientId)> = (0..3).map(|_| (a.connect(), b.connect())).collect();
        for op in ops {
            let (outcome_a, outcome_b) = match op {
                Op::Create(c, o, n) => {
                    let (ca, cb) = clients[c as usize];
                    (format!("{:?}", a.create(ca, id(o), n as u64, 3, 0)), format!("{:?}", b.create(cb, id(o), n as u64, 3, 0)))
                }
                Op::Seal(c, o) => {
                    let (ca, cb) = clients[c as usize];
                    (format!("{:?}", a.seal(ca, id(o), 0)), format!("{:?}", b.seal(cb, id(o), 0)))
                }
                Op::Abort(c, o) => {
                    let (ca, cb) = clients[c as usize];
                    (format!("{:?}", a.abort(ca, id(o))), format!("{:?}", b.abort(cb, id(o))))
                }
                Op::Get(c, o) => {
                    let (ca, cb) = clients[c as usize];
                    (format!("{:?}", a.get(ca, id(o))), format!("{:?}", b.get(cb, id(o))))
                }
                Op::Release(c, o) => {
                    let (ca, cb) = clients[c as usize];
                    (format!("{:?}", a.release(ca, id(o))), format!("{:?}", b.release(cb, id(o))))
                }
                Op::Delete(o) => (format!("{:?}", a.delete(id(o))), format!("{:?}", b.delete(id(o)))),
                Op::Evict(n) => (format!("{:?}", a.evict(n as u64)), format!("{:?}", b.evict(n as u64))),
                // A disconnect drops a client's references in the order of
                // a HashMap, which differs between two stores: the objects
                // become evictable in different orders. Not compared here.
                Op::Disconnect(_) => continue,
            };
            prop_assert_eq!(outcome_a, outcome_b);
            let (mut la, mut lb) = (a.list(), b.list());
            la.sort_by_key(|i| i.id);
            lb.sort_by_key(|i| i.id);
            prop_assert_eq!(la, lb);
            prop_assert_eq!(format!("{:?}", a.stats()), format!("{:?}", b.stats()));
        }
    }
}

#[test]
fn capacity_is_reported_as_configured_and_an_object_of_exactly_that_size_fits() {
    let mut s = Store::new(1_000_001);
    assert_eq!(s.capacity(), 1_000_001);
    assert_eq!(s.stats().capacity, 1_000_001);
    let c = s.connect();
    s.create(c, id(1), 1_000_001, 0, 0).unwrap();
    assert!(matches!(
        s.create(c, id(2), 1, 0, 0),
        Err(StoreError::StoreFull { .. })
    ));
    s.seal(c, id(1), 0).unwrap();
    s.release(c, id(1)).unwrap();
    // One byte over the configured capacity never fits, even after eviction
    // (although the allocator's 64-byte rounding would have room).
    assert!(matches!(
        s.create(c, id(3), 1_000_002, 0, 0),
        Err(StoreError::StoreFull { .. })
    ));
    assert!(s.contains(&id(1)), "nothing was evicted for it");
}

#[test]
fn spilling_keeps_the_books_without_io() {
    // 8 KiB store, objects of 1 KiB: the ninth needs room.
    let mut s = Store::with_spill(8192, 1 << 20);
    let c = s.connect();
    for n in 1..=8 {
        sealed(&mut s, c, n, 1024);
    }
    assert!(!s.spill_plan(1000, 0).is_empty(), "full: something must go");
    let plan = s.spill_plan(1000, 0);
    // Oldest first, and a batch: an eighth of the store (1 KiB) at least.
    assert_eq!(plan[0].id, id(1));
    let seg = s.begin_spill(&plan).unwrap();
    let offsets: Vec<u64> = plan
        .iter()
        .scan(0, |o, v| {
            let at = *o;
            *o += v.len;
            Some(at)
        })
        .collect();
    assert!(s
        .finish_spill(seg, &plan, &offsets)
        .dead_segments
        .is_empty());
    assert!(s.is_spilled(&id(1)) && s.contains(&id(1)));
    assert_eq!(
        s.get(c, id(1)),
        None,
        "a spilled object must be restored first"
    );
    assert_eq!(
        s.create(c, id(1), 1, 0, 0).unwrap_err(),
        StoreError::ObjectExists(id(1))
    );
    let listed = s.list();
    assert_eq!(listed.iter().filter(|o| o.spilled).count(), plan.len());
    sealed(&mut s, c, 9, 1000);
    let st = s.stats();
    assert_eq!(
        (st.spilled_objects, st.spills, st.evictions),
        (plan.len() as u64, plan.len() as u64, 0)
    );
    // Restoring needs room again; the daemon spills first, as here.
    let more = s.spill_plan(1024, 0);
    let seg2 = s.begin_spill(&more).unwrap();
    let offs: Vec<u64> = (0..more.len() as u64).map(|i| i * 1024).collect();
    s.finish_spill(seg2, &more, &offs);
    let mut read_from = None;
    let fx = s
        .restore(id(1), |loc, at| {
            read_from = Some((loc, at));
            true
        })
        .unwrap();
    let mut dead = fx.dead_segments;
    let (loc, at) = read_from.expect("read");
    assert_eq!((at.segment, at.offset, at.len), (seg, 0, 1024));
    assert_eq!(loc.data_size, 1024);
    assert_eq!(s.get(c, id(1)), Some(loc));
    // The counters follow objects out to disk and back.
    let in_memory: Vec<_> = s.list().into_iter().filter(|i| !i.spilled).collect();
    assert_eq!(s.stats().sealed_objects, in_memory.len() as u64);
    assert_eq!(s.stats().referenced_objects, 1);
    // Restoring or deleting the last object of a segment frees it.
    for v in plan.iter().skip(1) {
        let (outcome, fx) = s.delete(v.id);
        assert_eq!(outcome, DeleteOutcome::Deleted);
        dead.extend(fx.dead_segments);
    }
    assert_eq!(dead, vec![seg], "the first segment has no object left");
    assert!(s.stats().restores == 1);
    // The spill directory's limit is enforced.
    let huge = SpillVictim {
        id: id(99),
        offset: 0,
        len: 2 << 20,
    };
    assert!(matches!(
        s.begin_spill(&[huge]),
        Err(StoreError::SpillFull { .. })
    ));
}

#[test]
fn victims_being_spilled_are_pinned_until_the_write_is_done() {
    let mut s = Store::with_spill(4096, 1 << 20);
    let c = s.connect();
    for n in 1..=4 {
        sealed(&mut s, c, n, 1024);
    }
    let plan = s.spill_plan(2048, 0);
    let ids: Vec<ObjectId> = plan.iter().map(|v| v.id).collect();
    assert_eq!(ids, vec![id(1), id(2)]);
    let seg = s.begin_spill(&plan).unwrap();
    // While the segment is written: readable, not evicted, not planned
    // again, and a delete waits.
    assert!(s.spill_plan(1024, 0).iter().all(|v| !ids.contains(&v.id)));
    let held = s.get(c, id(1)).expect("readable while being spilled");
    assert_eq!(s.delete(id(2)).0, DeleteOutcome::Deferred);
    assert_eq!(s.evict(u64::MAX).1, 2, "only the two not being spilled");
    let fx = s.finish_spill(seg, &plan, &[0, 1024]);
    // The one read meanwhile stays in memory; the deleted one is gone.
    assert!(!s.is_spilled(&id(1)) && s.get(c, id(1)) == Some(held));
    assert!(!s.contains(&id(2)) && !s.is_spilled(&id(2)));
    assert_eq!(fx.dead_segments, vec![seg], "nothing was left to spill");
    // A failed write gives the victims back to eviction.
    sealed(&mut s, c, 7, 1024);
    sealed(&mut s, c, 8, 1024);
    let plan = s.spill_plan(2048, 0);
    assert_eq!(plan.len(), 2);
    s.begin_spill(&plan).unwrap();
    assert_eq!(s.evict(u64::MAX).1, 0, "pinned");
    s.abort_spill(&plan);
    assert_eq!(s.evict(u64::MAX).1, 2, "evictable again");
}

#[test]
fn without_spilling_there_is_no_plan() {
    let mut s = Store::new(4096);
    let c = s.connect();
    for n in 1..=4 {
        sealed(&mut s, c, n, 1024);
    }
    assert!(s.spill_plan(2000, 0).is_empty());
    assert!(s.begin_spill(&[]).is_err());
}

#[test]
fn a_taken_id_needs_no_room() {
    let mut s = Store::with_spill(4096, 1 << 20);
    let c = s.connect();
    sealed(&mut s, c, 1, 1024);
    assert!(s.exists(&id(1)));
    assert!(!s.exists(&id(2)));
    s.create(c, id(2), 10, 0, 0).unwrap();
    assert!(s.exists(&id(2)), "unsealed objects take their id too");
}

/// A policy that evicts the largest object first: the store's eviction
/// mechanism follows whatever the policy names.
#[derive(Debug, Default)]
struct LargestFirst(std::collections::BTreeMap<(std::cmp::Reverse<u64>, [u8; 20]), ObjectId>);

impl ferroplasma_store::EvictionPolicy for LargestFirst {
    fn add(&mut self, id: ObjectId, size: u64) {
        self.0.insert((std::cmp::Reverse(size), id.0), id);
    }
    fn remove(&mut self, id: &ObjectId) {
        self.0.retain(|_, v| v != id);
    }
    fn victims(&self) -> Box<dyn Iterator<Item = ObjectId> + '_> {
        Box::new(self.0.values().copied())
    }
    fn bytes(&self) -> u64 {
        self.0.keys().map(|(s, _)| s.0).sum()
    }
    fn contains(&self, id: &ObjectId) -> bool {
        self.0.values().any(|v| v == id)
    }
}

#[test]
fn eviction_follows_the_policy() {
    let mut s = Store::with_policy(64 * 10, Box::new(LargestFirst::default()));
    let c = s.connect();
    sealed(&mut s, c, 1, 64);
    sealed(&mut s, c, 2, 64 * 4);
    sealed(&mut s, c, 3, 64 * 2);
    // 7 of 10 slots used; 4 more need room: the largest (2) goes, not the oldest (1).
    s.create(c, id(4), 64 * 4, 0, 0).unwrap();
    assert!(!s.contains(&id(2)));
    assert!(s.contains(&id(1)) && s.contains(&id(3)));
    let (_, n, _) = s.evict(1);
    assert_eq!(n, 1);
    assert!(!s.contains(&id(3)), "then the next largest");
}

/// A policy that names objects it should not (one in use, one unknown):
/// the store skips them.
#[derive(Debug)]
struct Careless(Vec<ObjectId>);

impl ferroplasma_store::EvictionPolicy for Careless {
    fn add(&mut self, id: ObjectId, _size: u64) {
        self.0.push(id);
    }
    fn remove(&mut self, _id: &ObjectId) {} // forgets to
    fn victims(&self) -> Box<dyn Iterator<Item = ObjectId> + '_> {
        Box::new(self.0.iter().copied())
    }
    fn bytes(&self) -> u64 {
        1 << 30
    }
    fn contains(&self, id: &ObjectId) -> bool {
        self.0.contains(id)
    }
}

#[test]
fn a_careless_policy_cannot_make_the_store_free_memory_in_use() {
    let mut s = Store::with_policy(64 * 4, Box::new(Careless(vec![id(77)])));
    let c = s.connect();
    sealed(&mut s, c, 1, 64);
    sealed(&mut s, c, 2, 64);
    let held = s.get(c, id(1)).unwrap(); // in use, but the policy still names it
    let (_, n, _) = s.evict(1 << 20);
    assert_eq!(n, 1, "only the evictable one");
    assert_eq!(s.get(c, id(1)), Some(held));
    assert!(!s.contains(&id(2)));
    // And a create that needs room fails cleanly instead of looping.
    s.create(c, id(3), 64 * 4, 0, 0).unwrap_err();
}

/// Spills everything out of a store of 4 KiB holding 1..=4.
fn spilled_out(s: &mut Store, n: u8) {
    let plan = s.spill_plan(4096, 0);
    assert!(plan.iter().any(|v| v.id == id(n)), "{plan:?}");
    let seg = s.begin_spill(&plan).unwrap();
    let offs: Vec<u64> = (0..plan.len() as u64).map(|i| i * 1024).collect();
    s.finish_spill(seg, &plan, &offs);
    assert!(s.is_spilled(&id(n)));
}

#[test]
fn an_object_being_restored_is_unreadable_pinned_and_handed_to_its_waiters() {
    let mut s = Store::with_spill(4096, 1 << 20);
    let c = s.connect();
    let waiter = s.connect();
    for n in 1..=4 {
        sealed(&mut s, c, n, 1024);
    }
    spilled_out(&mut s, 1);
    s.watch(waiter, id(1));
    let (_, _, fx) = s.begin_restore(id(1)).unwrap();
    assert!(fx.notices.is_empty());
    // While its bytes are read back: there, but not readable, not evictable,
    // not spillable, and a delete waits.
    assert!(s.contains(&id(1)) && s.is_restoring(&id(1)) && !s.is_spilled(&id(1)));
    assert_eq!(
        s.get(c, id(1)),
        None,
        "not readable before the read is done"
    );
    assert_eq!(s.evict(u64::MAX).1, 0, "not evictable");
    assert!(s.spill_plan(4096, 0).is_empty(), "not spillable");
    // Done: the waiter holds a reference and is told so; nobody else does.
    let fx = s.finish_restore(id(1), true);
    assert_eq!(fx.notices, vec![(waiter, Notice::Restored(id(1)))]);
    assert!(!s.is_restoring(&id(1)));
    assert_eq!(s.stats().referenced_objects, 1);
    assert_eq!(s.evict(u64::MAX).1, 0, "held by the waiter");
    assert!(s.release(waiter, id(1)).is_ok());
    assert!(s.release(waiter, id(1)).is_err(), "exactly one reference");
    assert_eq!(s.evict(u64::MAX).1, 1, "evictable once released");
    // Deleted while restoring: gone when the read is done; a failed read
    // drops the object and tells the waiters, who hold nothing.
    for (delete, read) in [(true, true), (false, false)] {
        let mut s = Store::with_spill(4096, 1 << 20);
        let c = s.connect();
        for n in 1..=4 {
            sealed(&mut s, c, n, 1024);
        }
        spilled_out(&mut s, 1);
        s.watch(c, id(1));
        s.begin_restore(id(1)).unwrap();
        if delete {
            assert_eq!(s.delete(id(1)).0, DeleteOutcome::Deferred);
        }
        let fx = s.finish_restore(id(1), read);
        assert!(!s.contains(&id(1)) && !s.is_spilled(&id(1)));
        assert!(fx.notices.contains(&(c, Notice::Sealed(id(1)))));
        assert_eq!(s.stats().used, 0);
        assert_eq!(s.stats().referenced_objects, 0);
    }
}

/// Readers that take references without asking (the daemon's shared
/// table), faked: `held` names the ids a client holds, and how many holds.
#[derive(Debug, Default)]
struct FakeReaders {
    published: std::sync::Mutex<Vec<ObjectId>>,
    held: std::sync::Mutex<Vec<(ObjectId, ClientId, u32)>>,
}

impl Readers for FakeReaders {
    fn readable(&self, id: ObjectId, _loc: Location) -> bool {
        let mut p = self.published.lock().unwrap();
        if !p.contains(&id) {
            p.push(id);
        }
        true
    }
    fn unreadable(&self, id: ObjectId) -> Vec<(ClientId, u32)> {
        self.published.lock().unwrap().retain(|p| *p != id);
        let mut held = self.held.lock().unwrap();
        let out = held
            .iter()
            .filter(|(h, _, _)| *h == id)
            .map(|&(_, c, n)| (c, n))
            .collect();
        held.retain(|(h, _, _)| *h != id);
        out
    }
}

#[test]
fn holds_taken_without_asking_become_references_before_anything_is_freed() {
    let readers = std::sync::Arc::new(FakeReaders::default());
    let mut s = Store::new(1000);
    s.set_readers(readers.clone());
    let (w, r) = (s.connect(), s.connect());
    sealed(&mut s, w, 1, 400);
    sealed(&mut s, w, 2, 400);
    assert_eq!(
        *readers.published.lock().unwrap(),
        [id(1), id(2)],
        "sealed: published"
    );
    // r holds object 1 twice through the table: a delete is deferred, and
    // only r's two releases free it.
    readers.held.lock().unwrap().push((id(1), r, 2));
    assert_eq!(s.delete(id(1)).0, DeleteOutcome::Deferred);
    assert!(
        !readers.published.lock().unwrap().contains(&id(1)),
        "retired"
    );
    s.release(r, id(1)).unwrap();
    assert!(s.exists(&id(1)));
    s.release(r, id(1)).unwrap();
    assert!(!s.exists(&id(1)));
    // r holds object 2: eviction skips it and finds nothing else.
    readers.held.lock().unwrap().push((id(2), r, 1));
    let (freed, count, _) = s.evict(1);
    assert_eq!((freed, count), (0, 0));
    assert!(s.contains(&id(2)));
    assert_eq!(s.list()[0].ref_count, 1);
    // A client that is gone holds nothing.
    readers.held.lock().unwrap().push((id(2), 999, 5));
    s.release(r, id(2)).unwrap();
    assert_eq!(s.delete(id(2)).0, DeleteOutcome::Deleted);
}

#[derive(Debug, Default)]
struct CountingReaders {
    asked: std::sync::atomic::AtomicUsize,
}

impl Readers for CountingReaders {
    fn readable(&self, _id: ObjectId, _loc: Location) -> bool {
        true
    }
    fn unreadable(&self, _id: ObjectId) -> Vec<(ClientId, u32)> {
        Vec::new()
    }
    fn held(&self) -> Vec<(ObjectId, u64)> {
        self.asked
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Vec::new()
    }
}

/// What a cluster member sends in every heartbeat, and `stats`, cost
/// nothing per object: neither asks the readers (whose answer is a pass over
/// every client's holds; the daemon makes it off the store's thread).
#[test]
fn usage_and_stats_never_ask_the_readers() {
    let readers = std::sync::Arc::new(CountingReaders::default());
    let mut s = Store::new(1 << 20);
    s.set_readers(readers.clone());
    let c = s.connect();
    for n in 0..10 {
        sealed(&mut s, c, n, 1000);
    }
    let u = s.usage();
    assert_eq!(readers.asked.load(std::sync::atomic::Ordering::Relaxed), 0);
    let st = s.stats();
    assert_eq!(
        readers.asked.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "stats asked the readers"
    );
    assert_eq!(
        (u.capacity, u.used, u.objects),
        (st.capacity, st.used, st.objects)
    );
    assert_eq!(u.objects, 10);
}

#[test]
fn an_object_created_sealed_is_one_created_sealed_and_released() {
    let readers = std::sync::Arc::new(FakeReaders::default());
    let mut s = Store::new(1000);
    s.set_readers(readers.clone());
    let (w, sub, other) = (s.connect(), s.connect(), s.connect());
    s.subscribe(sub);
    s.watch(w, id(1));
    let mut written = None;
    let fx = s
        .create_sealed(id(1), 300, 20, 7, |loc| {
            // The bytes go in before anyone can see the object.
            assert!(readers.published.lock().unwrap().is_empty());
            written = Some(*loc);
        })
        .unwrap();
    let loc = written.expect("write called");
    assert_eq!((loc.data_size, loc.metadata_size), (300, 20));
    assert_eq!(fx.notices[0], (w, Notice::Sealed(id(1))));
    assert!(matches!(
        fx.notices[1],
        (c, Notice::Event(Event { kind: EventKind::Sealed, data_size: 300, metadata_size: 20, .. })) if c == sub
    ));
    assert_eq!(*readers.published.lock().unwrap(), [id(1)]);
    assert!(s.contains(&id(1)));
    assert_eq!(s.sealed_location(&id(1)), Some(loc));
    let info = &s.list()[0];
    assert_eq!((info.ref_count, info.construct_duration_us), (0, Some(0)));
    let st = s.stats();
    assert_eq!(
        (st.objects, st.sealed_objects, st.referenced_objects),
        (1, 1, 0)
    );
    // Anyone may take it; unreferenced, it is evictable.
    assert_eq!(s.get(other, id(1)), Some(loc));
    s.release(other, id(1)).unwrap();
    assert_eq!(
        s.create_sealed(id(1), 1, 0, 0, |_| panic!("no write for a taken id")),
        Err(StoreError::ObjectExists(id(1)))
    );
    // No room: the other object is evicted for it, as for a create.
    s.create_sealed(id(2), 900, 0, 0, |_| {}).unwrap();
    assert!(!s.exists(&id(1)));
    assert!(matches!(
        s.create_sealed(id(3), 2000, 0, 0, |_| panic!("no write without room")),
        Err(StoreError::StoreFull { .. })
    ));
    assert_eq!(s.stats().objects, 1);
}

#[test]
fn a_sealed_location_is_given_only_for_readable_objects() {
    let mut s = Store::new(1 << 20);
    let a = s.connect();
    let (loc, _) = s.create(a, id(1), 10, 0, 0).unwrap();
    assert_eq!(s.sealed_location(&id(1)), None, "unsealed");
    s.seal(a, id(1), 0).unwrap();
    assert_eq!(s.sealed_location(&id(1)), Some(loc));
    assert_eq!(s.delete(id(1)).0, DeleteOutcome::Deferred);
    assert_eq!(s.sealed_location(&id(1)), None, "being deleted");
    assert_eq!(s.sealed_location(&id(2)), None, "absent");
}
