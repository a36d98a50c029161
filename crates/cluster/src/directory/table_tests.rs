//! The directory's state machine on its own.

use super::*;

fn names(holders: &[Member]) -> Vec<&str> {
    holders.iter().map(|h| &**h).collect()
}

const PRIMARY: Change = Change::SealedPrimary {
    data_size: 10,
    metadata_size: 2,
    version: 100,
};
const CACHED: Change = Change::SealedCached {
    data_size: 10,
    metadata_size: 2,
};

#[test]
fn a_claimed_or_sealed_id_cannot_be_claimed_elsewhere() {
    let mut d = Directory::new();
    let id = ObjectId::random();
    assert!(d.claim(id, "a"));
    assert!(d.claim(id, "a"), "re-claiming one's own id is fine");
    assert!(!d.claim(id, "b"));
    d.update(id, "a", PRIMARY, false);
    assert!(!d.claim(id, "a"));
    assert!(!d.claim(id, "b"));
}

#[test]
fn claims_are_granted_only_once_every_member_has_re_registered_for_the_ring() {
    let mut d = Directory::new();
    let members = || vec!["a".to_string(), "b".into(), "c".into()];
    d.set_ring(7, members());
    let (id, held) = (ObjectId::random(), ObjectId::random());
    // "c" re-registered for ring 7 before this member heard of it.
    d.synced("c", 7);
    d.set_ring(7, members());
    d.synced("a", 7);
    assert!(
        matches!(d.claim_in_ring(id, "a", 7, false), Claim::NotNow(_)),
        "b has not re-registered"
    );
    // What is known is refused at once.
    d.update(held, "b", PRIMARY, true);
    assert_eq!(d.claim_in_ring(held, "a", 7, false), Claim::Refused);
    // A re-claim of an id granted before the change is recorded.
    let reclaimed = ObjectId::random();
    assert_eq!(d.claim_in_ring(reclaimed, "c", 7, true), Claim::Granted);
    d.synced("b", 7);
    assert!(
        matches!(d.claim_in_ring(id, "a", 8, false), Claim::NotNow(_)),
        "another ring"
    );
    assert_eq!(d.claim_in_ring(id, "a", 7, false), Claim::Granted);
    assert_eq!(d.claim_in_ring(reclaimed, "a", 7, false), Claim::Refused);
    // A new ring: the marks of the old one no longer count.
    d.set_ring(9, members());
    assert!(matches!(
        d.claim_in_ring(ObjectId::random(), "a", 9, false),
        Claim::NotNow(_)
    ));
}

/// Four members joining one after another: a member may hear another's
/// re-registration for the final ring while it is still two rings
/// behind. That mark must survive the ring in between, or the
/// directory is never complete (the sender re-registers only when its
/// own ring changes) and no id can be claimed.
#[test]
fn an_early_re_registration_survives_the_rings_in_between() {
    let mut d = Directory::new();
    let four = || vec!["a".to_string(), "b".into(), "c".into(), "d".into()];
    d.set_ring(1, vec!["a".into(), "d".into()]);
    // "a" already sees all four (ring 3) and says so.
    d.synced("a", 3);
    d.set_ring(2, vec!["a".into(), "c".into(), "d".into()]);
    d.set_ring(3, four());
    for m in ["b", "c", "d"] {
        d.synced(m, 3);
    }
    assert!(d.is_complete(), "a's early mark still counts");
    assert_eq!(
        d.claim_in_ring(ObjectId::random(), "b", 3, false),
        Claim::Granted
    );
    // The marks of a ring left behind do not count if it forms again.
    d.set_ring(4, vec!["a".into(), "b".into(), "c".into()]);
    d.set_ring(3, four());
    assert!(!d.is_complete());
}

#[test]
fn an_aborted_claim_frees_the_id() {
    let mut d = Directory::new();
    let id = ObjectId::random();
    assert!(d.claim(id, "a"));
    d.update(id, "b", Change::Aborted, false);
    assert!(!d.claim(id, "b"), "only the claimer's abort counts");
    d.update(id, "a", Change::Dropped, false);
    assert!(!d.claim(id, "b"), "news of an old copy dropped is no abort");
    d.update(id, "a", Change::Aborted, false);
    assert!(d.claim(id, "b"));
}

#[test]
fn recording_copies_allocates_nothing_once_the_members_are_known() {
    // Every object a member pulls is one update at its owner and
    // backup: with the members' names known (and room in the map),
    // an entry's primary, its cached copies and their drops cost no
    // heap allocation but the entry's own (entries are boxed, so that
    // the table's slots stay small: memory_per_entry_of_a_million).
    let mut d = Directory::new();
    let first = ObjectId::random();
    d.update(first, "a", PRIMARY, false);
    d.update(first, "b", CACHED, false);
    let ids: Vec<ObjectId> = (0..1000).map(|_| ObjectId::random()).collect();
    d.entries.reserve(ids.len());
    let counted = allocation_counter::measure(|| {
        for id in &ids {
            assert!(d.update(*id, "a", PRIMARY, false));
            assert!(d.update(*id, "b", CACHED, false));
        }
        for id in &ids[..500] {
            assert!(d.update(*id, "b", Change::Dropped, false));
        }
    });
    assert_eq!(counted.count_total, ids.len() as u64, "{counted:?}");
    assert_eq!(names(&d.lookup(&ids[0]).unwrap().holders), ["a"]);
    assert_eq!(names(&d.lookup(&ids[999]).unwrap().holders), ["a", "b"]);
}

#[test]
fn copies_are_recorded_primary_first_and_dropped_one_by_one() {
    let mut d = Directory::new();
    let id = ObjectId::random();
    d.claim(id, "a");
    d.update(id, "a", PRIMARY, false);
    assert!(d.update(id, "b", CACHED, false));
    assert!(d.update(id, "c", CACHED, false));
    assert_eq!(names(&d.lookup(&id).unwrap().holders), ["a", "b", "c"]);
    d.update(id, "a", Change::Dropped, false);
    assert_eq!(names(&d.lookup(&id).unwrap().holders), ["b", "c"]);
    d.update(id, "b", Change::Dropped, false);
    d.update(id, "c", Change::Dropped, false);
    assert!(d.lookup(&id).is_none(), "evicted everywhere: gone");
}

#[test]
fn a_cached_copy_of_a_deleted_object_is_refused_unless_rejoining() {
    let mut d = Directory::new();
    let id = ObjectId::random();
    assert!(!d.update(id, "b", CACHED, false));
    assert!(d.lookup(&id).is_none());
    assert!(d.update(id, "b", CACHED, true));
    assert_eq!(d.lookup(&id).unwrap().state, State::Sealed);
}

#[test]
fn a_dead_member_loses_only_objects_it_alone_held() {
    let mut d = Directory::new();
    let (solo, shared, claimed) = (ObjectId::random(), ObjectId::random(), ObjectId::random());
    d.update(solo, "a", PRIMARY, false);
    d.update(shared, "a", PRIMARY, false);
    d.update(shared, "b", CACHED, false);
    d.claim(claimed, "a");
    assert_eq!(d.member_died("a"), 2);
    assert_eq!(d.lookup(&solo).unwrap().state, State::Lost);
    assert_eq!(names(&d.lookup(&shared).unwrap().holders), ["b"]);
    // Its claim too: it may have sealed before the directory heard.
    assert_eq!(d.lookup(&claimed).unwrap().state, State::Lost);
    assert!(d.claim(claimed, "b"), "and the id may be taken again");
    // A lost id may be created again; a returning member revives it.
    assert!(d.claim(solo, "c"));
    let lost2 = ObjectId::random();
    d.update(lost2, "a", PRIMARY, false);
    d.member_died("a");
    d.update(lost2, "a", PRIMARY, true);
    assert_eq!(d.lookup(&lost2).unwrap().state, State::Sealed);
}

#[test]
fn a_primary_copy_never_takes_an_id_another_member_claimed_or_created() {
    let mut d = Directory::new();
    let id = ObjectId::random();
    // "a" created it, was cut off and declared dead; "b" took the id.
    d.claim(id, "a");
    d.update(id, "a", PRIMARY, false);
    d.member_died("a");
    assert!(d.claim(id, "b"));
    // "a" comes back and re-registers its copy: refused, while "b"
    // creates, and once "b" sealed.
    assert!(!d.update(id, "a", PRIMARY, true));
    assert_eq!(
        d.lookup(&id).unwrap().state,
        State::Creating { by: "b".into() }
    );
    assert!(d.update(id, "b", PRIMARY, false));
    assert!(!d.update(id, "a", PRIMARY, true));
    assert_eq!(names(&d.lookup(&id).unwrap().holders), ["b"]);
    // A cached copy registered first (a new owner) leaves the creator
    // unknown: the primary is taken.
    let other = ObjectId::random();
    assert!(d.update(other, "c", CACHED, true));
    assert!(d.update(other, "a", PRIMARY, true));
    assert_eq!(names(&d.lookup(&other).unwrap().holders), ["a", "c"]);
    // Its own object, lost while it was away, it gets back.
    let mine = ObjectId::random();
    d.claim(mine, "a");
    d.member_died("a");
    assert!(d.update(mine, "a", PRIMARY, true));
    assert_eq!(d.lookup(&mine).unwrap().state, State::Sealed);
}

#[test]
fn a_deletion_stays_until_every_holder_dropped_its_copy() {
    let mut d = Directory::new();
    let id = ObjectId::random();
    d.update(id, "a", PRIMARY, false);
    d.update(id, "b", CACHED, false);
    assert_eq!(names(&d.forget(&id).unwrap().holders), ["a", "b"]);
    // Until they report the copies dropped, a report of one is refused.
    assert_eq!(d.lookup(&id).unwrap().state, State::Deleted);
    assert!(!d.update(id, "b", CACHED, true));
    d.update(id, "a", Change::Dropped, false);
    d.update(id, "b", Change::Dropped, false);
    assert!(d.is_empty());
}

#[test]
fn a_member_away_during_a_delete_drops_its_copy_when_it_returns() {
    let mut d = Directory::new();
    let id = ObjectId::random();
    d.update(id, "a", PRIMARY, false);
    d.update(id, "b", CACHED, false);
    d.member_died("b");
    assert_eq!(names(&d.lookup(&id).unwrap().holders), ["a"]);
    // Deleted while b was away: b is among the holders the delete is
    // told of, and its copy is refused when it comes back.
    assert_eq!(names(&d.forget(&id).unwrap().holders), ["a", "b"]);
    d.update(id, "a", Change::Dropped, false);
    assert!(
        !d.update(id, "b", CACHED, true),
        "a deleted object stays deleted"
    );
    d.update(id, "b", Change::Dropped, true);
    assert!(d.is_empty());
    // A member away that returns to an object still there holds it again.
    let kept = ObjectId::random();
    d.update(kept, "a", PRIMARY, false);
    d.update(kept, "b", CACHED, false);
    d.member_died("a");
    assert!(d.update(kept, "a", PRIMARY, true));
    assert_eq!(names(&d.lookup(&kept).unwrap().holders), ["a", "b"]);
    // One back from a pause holds it again, a lost object included.
    let paused = ObjectId::random();
    d.update(paused, "p", PRIMARY, false);
    d.member_died("p");
    assert_eq!(d.lookup(&paused).unwrap().state, State::Lost);
    d.member_back("p");
    assert_eq!(d.lookup(&paused).unwrap().state, State::Sealed);
    assert_eq!(names(&d.lookup(&paused).unwrap().holders), ["p"]);
    // One that restarted holds nothing: the deletion is complete.
    let gone = ObjectId::random();
    d.update(gone, "c", PRIMARY, false);
    d.member_died("c");
    d.forget(&gone);
    assert_eq!(d.lookup(&gone).unwrap().state, State::Deleted);
    d.member_restarted("c");
    assert!(d.lookup(&gone).is_none());
}

fn primary(version: u64) -> Change {
    Change::SealedPrimary {
        data_size: 10,
        metadata_size: 2,
        version,
    }
}

#[test]
fn of_two_primaries_reported_to_a_new_owner_the_later_one_wins() {
    // "a" sealed at 100, was away, its object lost and created again by
    // "b" at 200; both re-register with an owner that knows neither.
    for a_first in [true, false] {
        let mut d = Directory::new();
        let id = ObjectId::random();
        if a_first {
            assert!(d.update(id, "a", primary(100), true));
            assert!(d.update(id, "c", CACHED, true));
            assert!(
                d.update(id, "b", primary(200), true),
                "the later object wins"
            );
            assert!(
                !d.update(id, "c", CACHED, true),
                "c's copy is of the old object"
            );
        } else {
            assert!(d.update(id, "b", primary(200), true));
        }
        assert!(
            !d.update(id, "a", primary(100), true),
            "the earlier one is refused"
        );
        let e = d.lookup(&id).unwrap();
        assert_eq!(
            (e.creator.as_deref(), names(&e.holders)),
            (Some("b"), vec!["b"])
        );
    }
    // A deleted object reported again is refused; a later one is not.
    let mut d = Directory::new();
    let id = ObjectId::random();
    d.update(id, "a", primary(100), false);
    d.update(id, "x", CACHED, false);
    d.forget(&id);
    assert!(!d.update(id, "a", primary(100), true));
    assert!(d.update(id, "b", primary(300), true));
}

#[test]
fn stale_copies_never_join_an_object_created_again() {
    let mut d = Directory::new();
    let id = ObjectId::random();
    d.update(id, "a", PRIMARY, false);
    d.update(id, "b", CACHED, false);
    d.member_died("b");
    d.forget(&id);
    d.update(id, "a", Change::Dropped, false);
    // Created again (by c) while b still holds the old bytes.
    assert!(d.claim(id, "c"));
    d.update(id, "c", PRIMARY, false);
    assert!(
        !d.update(id, "b", CACHED, true),
        "b's copy is of the old object"
    );
    assert_eq!(names(&d.lookup(&id).unwrap().holders), ["c"]);
    d.update(id, "b", Change::Dropped, false);
    assert!(d.lookup(&id).unwrap().stale.is_empty());
    // The same after a loss: the lost object's holder is refused too.
    let lost = ObjectId::random();
    d.update(lost, "a", PRIMARY, false);
    d.member_died("a");
    assert!(d.claim(lost, "c"));
    assert!(!d.update(lost, "a", PRIMARY, true));
}

/// What a directory entry costs: a million sealed objects registered by
/// one member (docs/cluster.md states the figure this prints; run with
/// `cargo test --release -p ferroplasma-cluster --lib memory_per_entry -- --nocapture`).
#[test]
fn memory_per_entry_of_a_million() {
    let n: u64 = 1_000_000;
    let ids: Vec<ObjectId> = (0..n)
        .map(|i| {
            let mut b = [5u8; 20];
            b[..8].copy_from_slice(&i.to_le_bytes());
            ObjectId(b)
        })
        .collect();
    let mut d = Directory::new();
    let held = allocation_counter::measure(|| {
        for id in &ids {
            assert!(d.update(*id, "a", PRIMARY, true));
        }
    });
    assert_eq!(d.len(), n as usize);
    let per_entry = held.bytes_current as u64 / n;
    println!(
        "{n} entries: {per_entry} B each on the heap (an entry is {} B, {} B with its id)",
        std::mem::size_of::<Entry>(),
        std::mem::size_of::<(ObjectId, Entry)>()
    );
    // A table of 2^21 slots of an id, a pointer and a control byte each
    // (33 B: 69 B per entry), and the boxed entry (160 B). Unboxed, the
    // slots were 185 B each: 387 B per entry.
    assert!(per_entry <= 240, "{per_entry} B per entry");
}
