//! A client looks for an id only as far as its home slot's reach: a miss
//! costs one slot's read, and an object published away from its home is
//! found while the reach covers it.
#![cfg(not(ferroplasma_loom))]

use ferroplasma_protocol::shared_table::{home, id_words, take, Slot, Take, PROBES};
use ferroplasma_protocol::ObjectId;
use std::sync::atomic::{AtomicU32, Ordering};

const SLOTS: usize = 64;
const KEY: u64 = 0x5eed;

fn table() -> (Vec<Slot>, Vec<AtomicU32>) {
    (
        (0..SLOTS).map(|_| Slot::new()).collect(),
        (0..SLOTS).map(|_| AtomicU32::new(0)).collect(),
    )
}

/// Leaves a slot as if the store were writing it for ever (its sequence
/// number odd): a reader that looks at it gives up.
fn jam(slot: &Slot) {
    let seq: &AtomicU32 = &slot.seq;
    seq.store(1, Ordering::Release);
}

#[test]
fn an_id_not_in_the_table_costs_only_its_home_slot() {
    let (slots, holds) = table();
    let id = ObjectId([3; 20]);
    let h = home(&id_words(&id), KEY, SLOTS);
    // Every other slot of the window is unreadable: a miss that looked
    // past the home (whose reach is 0) would come back Busy, not Absent.
    for k in 1..PROBES {
        jam(&slots[(h + k) % SLOTS]);
    }
    assert_eq!(take(&slots, &holds, KEY, &id, true), Take::Absent);
}

#[test]
fn an_object_away_from_its_home_is_found_within_the_reach() {
    let (slots, holds) = table();
    let id = ObjectId([9; 20]);
    let words = id_words(&id);
    let h = home(&words, KEY, SLOTS);
    let at = (h + 5) % SLOTS;
    // Published 5 slots out, as the store does when the first 5 are taken.
    assert!(slots[at].publish(&words, 4096, 10, 2));
    // Without the home's reach covering it, the client does not look there
    // (unless the store keeps no reach: then it looks at the whole window).
    assert_eq!(take(&slots, &holds, KEY, &id, true), Take::Absent);
    assert!(matches!(
        take(&slots, &holds, KEY, &id, false),
        Take::Held(..)
    ));
    holds[at].store(0, Ordering::Relaxed);
    slots[h].set_reach(6);
    match take(&slots, &holds, KEY, &id, true) {
        Take::Held(i, v) => {
            assert_eq!(i, at);
            assert_eq!((v.offset, v.data_size, v.metadata_size), (4096, 10, 2));
            assert_eq!(holds[at].load(Ordering::Relaxed), 1);
        }
        other => panic!("expected a hold, got {other:?}"),
    }
    // The reach lives beside the home slot's own state: publishing and
    // retiring the home slot's object keep it.
    let other = ObjectId([1; 20]);
    assert!(slots[h].publish(&id_words(&other), 0, 1, 0));
    assert_eq!(slots[h].read().map(|v| v.reach), Some(6));
    slots[h].retire();
    assert_eq!(slots[h].read().map(|v| v.reach), Some(6));
    assert!(matches!(
        take(&slots, &holds, KEY, &id, true),
        Take::Held(..)
    ));
}
