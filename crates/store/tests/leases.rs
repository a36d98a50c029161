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
    let (start, _) = s.lease(a, 4096).unwrap();
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
    let (start, _) = s.lease(a, 1024).unwrap();
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
    let (start, _) = s.lease(a, 1024).unwrap();
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
    let (start, _) = s.lease(a, 4096).unwrap();
    s.lease(a, 4096).unwrap();
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
    s.lease(a, 4096).unwrap();
    assert!(!s.exists(&id(1)), "evicted for the lease");
    assert!(matches!(
        s.lease(a, 8192),
        Err(StoreError::StoreFull { .. })
    ));
}
