//! Leases (writes without a round trip), driven directly: objects a client
//! made in leased memory are taken in as if created, their memory comes
//! back alone, and what no object took comes back with the lease.
#![allow(unused_must_use)]

use ferroplasma_protocol::ObjectId;
use ferroplasma_store::*;

fn id(n: u8) -> ObjectId {
    ObjectId([n; 20])
}

fn at(offset: u64, data_size: u64) -> Location {
    Location {
        arena: 0,
        offset,
        data_size,
        metadata_size: 0,
    }
}

#[test]
fn objects_made_in_a_lease_live_as_created_ones_and_the_rest_comes_back_with_it() {
    let mut s = Store::new(1 << 20);
    let free = s.free_bytes();
    let a = s.connect();
    let (start, _) = s.lease(a, 4096, false).unwrap();
    assert_eq!(s.free_bytes(), free - 4096);
    assert_eq!(s.stats().used, 0, "room leased is not used by objects");
    s.take_in(a, id(1), at(start, 100), 1).unwrap();
    assert_eq!(s.stats().used, 128);
    // A gap (an object the client abandoned before telling the store).
    s.take_in(a, id(2), at(start + 256, 64), 1).unwrap();
    assert!(!s.contains(&id(1)), "unsealed until sealed");
    s.seal(a, id(1), 2).unwrap();
    s.seal(a, id(2), 2).unwrap();
    assert!(s.contains(&id(1)) && s.contains(&id(2)));
    let b = s.connect();
    assert_eq!(s.get(b, id(1)), Some(at(start, 100)));
    s.release(b, id(1)).unwrap();
    s.release(a, id(1)).unwrap();
    s.release(a, id(2)).unwrap();
    // Deleted inside a live lease: its memory comes back at once.
    assert_eq!(s.delete(id(1)).0, DeleteOutcome::Deleted);
    assert_eq!(s.free_bytes(), free - 4096 + 128);
    assert!(s.end_lease(a, start));
    assert!(!s.end_lease(a, start), "ended once");
    // Only the object still alive holds memory.
    assert_eq!(s.free_bytes(), free - 64);
    assert_eq!(s.delete(id(2)).0, DeleteOutcome::Deleted);
    assert_eq!(s.free_bytes(), free);
    assert_eq!(s.stats().used, 0);
}

#[test]
fn an_object_outside_free_room_of_the_clients_leases_is_refused() {
    let mut s = Store::new(1 << 20);
    let a = s.connect();
    let b = s.connect();
    let (start, _) = s.lease(a, 1024, false).unwrap();
    let outside = |r: Result<(), StoreError>| matches!(r, Err(StoreError::OutsideLease { .. }));
    assert!(
        outside(s.take_in(b, id(1), at(start, 64), 0)),
        "another client's lease"
    );
    assert!(
        outside(s.take_in(a, id(1), at(start + 1000, 64), 0)),
        "past its end"
    );
    assert!(
        outside(s.take_in(a, id(1), at(start + 8, 64), 0)),
        "not aligned"
    );
    s.take_in(a, id(1), at(start + 128, 64), 0).unwrap();
    assert!(
        outside(s.take_in(a, id(2), at(start, 64), 0)),
        "behind the last object"
    );
    assert!(
        outside(s.take_in(a, id(2), at(start + 128, 64), 0)),
        "over the last object"
    );
}

#[test]
fn a_taken_id_is_refused_and_its_room_stays_leased_until_the_lease_ends() {
    let mut s = Store::new(1 << 20);
    let free = s.free_bytes();
    let a = s.connect();
    s.create(a, id(1), 10, 0, 0).unwrap();
    let (start, _) = s.lease(a, 1024, false).unwrap();
    assert_eq!(
        s.take_in(a, id(1), at(start, 64), 0),
        Err(StoreError::ObjectExists(id(1)))
    );
    s.take_in(a, id(2), at(start + 64, 64), 0).unwrap();
    s.abort(a, id(1)).unwrap();
    s.abort(a, id(2)).unwrap();
    assert_eq!(
        s.free_bytes(),
        free - 1024 + 64,
        "the refused object's room is still leased"
    );
    s.end_lease(a, start);
    assert_eq!(s.free_bytes(), free);
}

#[test]
fn a_client_that_disconnects_leaves_nothing_of_its_leases() {
    let mut s = Store::new(1 << 20);
    let free = s.free_bytes();
    let a = s.connect();
    let (start, _) = s.lease(a, 4096, false).unwrap();
    s.lease(a, 4096, false).unwrap();
    s.take_in(a, id(1), at(start, 64), 0).unwrap();
    s.take_in(a, id(2), at(start + 64, 64), 0).unwrap();
    s.seal(a, id(2), 1).unwrap();
    s.disconnect(a);
    assert!(!s.exists(&id(1)), "unsealed: aborted");
    assert!(s.contains(&id(2)), "sealed: it outlives its creator");
    assert_eq!(s.free_bytes(), free - 64);
}

#[test]
fn a_lease_evicts_as_a_create_would() {
    let mut s = Store::new(8192);
    let a = s.connect();
    s.create(a, id(1), 6000, 0, 0).unwrap();
    s.seal(a, id(1), 1).unwrap();
    s.release(a, id(1)).unwrap();
    s.lease(a, 4096, false).unwrap();
    assert!(!s.exists(&id(1)), "evicted for the lease");
    assert!(matches!(
        s.lease(a, 8192, false),
        Err(StoreError::StoreFull { .. })
    ));
}

/// Lease tops as a client publishes them: a fixed answer per client, and
/// whether the store asked.
#[derive(Debug, Default)]
struct Tops(std::sync::Mutex<std::collections::HashMap<ClientId, u64>>);

impl LeaseTops for Tops {
    fn close(&self, client: ClientId) -> Option<u64> {
        self.0.lock().unwrap().remove(&client)
    }
}

/// A store with no room left but the unused rest of a client's open lease
/// takes that rest back (the client allocates nothing more in it) before
/// it evicts anything: an object of nearly the whole store fits while the
/// objects already made in the lease stay. A top the client could not
/// have reached (behind what the store took in, past the lease, not
/// aligned) takes nothing back.
#[test]
fn an_allocation_with_no_room_takes_back_the_unused_rest_of_open_leases() {
    let cap = 1 << 20;
    let mut s = Store::new(cap);
    let tops = std::sync::Arc::new(Tops::default());
    s.set_lease_tops(tops.clone());
    let a = s.connect();
    let (start, _) = s.lease(a, 64 << 10, true).unwrap();
    s.take_in(a, id(1), at(start, 1000), 1).unwrap();
    s.seal(a, id(1), 2).unwrap();
    // The client allocated 1024 + 512 bytes (a second object, not yet told).
    tops.0.lock().unwrap().insert(a, start + 1536);
    let b = s.connect();
    // Everything but the lease's allocated part and the object: fits only
    // when the lease's rest comes back.
    let big = cap - 1536;
    let (loc, _) = s
        .create(b, id(9), big, 0, 0)
        .expect("the lease's rest taken back");
    assert!(s.exists(&id(9)));
    assert_eq!(s.stats().evictions, 0, "no object was evicted for it");
    assert!(loc.offset >= start + 1536 || loc.offset + big <= start);
    // The client's record of its second object, inside what it allocated.
    s.take_in(a, id(2), at(start + 1024, 500), 3).unwrap();
    // Nothing past the top any more.
    assert!(matches!(
        s.take_in(a, id(3), at(start + 1536, 10), 4),
        Err(StoreError::OutsideLease { .. })
    ));
    s.abort(b, id(9)).unwrap();
    // A lie: a top behind what the store took in takes nothing back.
    let c = s.connect();
    let (start, _) = s.lease(c, 64 << 10, true).unwrap();
    s.take_in(c, id(4), at(start, 4096), 5).unwrap();
    tops.0.lock().unwrap().insert(c, start + 64);
    let free = s.free_bytes();
    assert!(s.create(b, id(8), free + 1, 0, 0).is_err() || s.stats().evictions > 0);
    assert!(
        s.take_in(c, id(5), at(start + 4096, 10), 6).is_ok(),
        "still leased"
    );
}
