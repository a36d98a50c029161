//! The create protocol of writes without a round trip
//! (`src/fast_writes.rs`), checked with loom over every interleaving the
//! C11 memory model allows (up to a preemption bound): two creators of one
//! id never both succeed, whether both take the fast path or one asks the
//! store, and the one told it succeeded is the one whose object the store
//! keeps.
//!
//! Run by `make test`:
//! `RUSTFLAGS="--cfg ferroplasma_loom" cargo test -p ferroplasma-protocol --test fast_writes_model --release`
#![cfg(ferroplasma_loom)]

use ferroplasma_protocol::fast_writes::{
    begin, claim, clear_claim, end, pending, publish_state, push, read, settled_alone, taken, Area,
    Entry, Record, RingHeader, CREATE,
};
use ferroplasma_protocol::ObjectId;
use loom::sync::atomic::{AtomicBool, AtomicU32};
use loom::sync::{Arc, Mutex};

const ID: ObjectId = ObjectId([7; 20]);

/// The store's books, under its lock: who owns the id (1 or 2), if anyone.
/// The object stays unsealed in this model: one created through a ring
/// keeps its bucket claimed (until its seal, which never comes), one
/// created by asking the store counts as hidden.
#[derive(Default)]
struct Books {
    owner: Option<u32>,
    through_ring: bool,
    tails: [u64; 2],
    /// Creators whose record the store turned down (the id was taken).
    refused: [bool; 2],
}

struct World {
    area: Area,
    bucket: AtomicU32,
    rings: [RingHeader; 2],
    records: [Vec<Record>; 2],
    /// The shared table: true once the object is published there (sealed).
    in_table: AtomicBool,
    books: Mutex<Books>,
}

fn world() -> Arc<World> {
    Arc::new(World {
        area: Area::new(),
        bucket: AtomicU32::new(0),
        rings: [RingHeader::new(), RingHeader::new()],
        records: [vec![Record::new()], vec![Record::new()]],
        in_table: AtomicBool::new(false),
        books: Mutex::new(Books::default()),
    })
}

/// One section of the store's lock: drain the rings, run `f`, publish the
/// hidden count (the object is unsealed in this model: hidden once owned).
fn section<T>(w: &World, f: impl FnOnce(&mut Books) -> T) -> T {
    let mut b = w.books.lock().unwrap();
    begin(&w.area);
    drain(w, &mut b);
    let out = f(&mut b);
    publish_state(&w.area, hidden(&b), false);
    drain(w, &mut b);
    publish_state(&w.area, hidden(&b), false);
    end(&w.area);
    out
}

fn hidden(b: &Books) -> u64 {
    u64::from(b.owner.is_some() && !b.through_ring)
}

fn drain(w: &World, b: &mut Books) {
    for c in 0..2 {
        let tail = b.tails[c];
        let n = pending(&w.rings[c], tail, 1).expect("an honest client");
        for at in tail..tail + n {
            let e = read(&w.records[c], at);
            assert_eq!(e.kind, CREATE);
            if b.owner.is_none() {
                b.owner = Some(c as u32 + 1);
                b.through_ring = true;
            } else {
                b.refused[c] = true;
                clear_claim(&w.bucket, c as u32 + 1);
            }
        }
        b.tails[c] = tail + n;
        taken(&w.rings[c], tail + n);
    }
}

/// A creator `c` (0 or 1) on the fast path; true when told it created the id.
fn fast_creator(w: &World, c: usize) -> bool {
    let tag = c as u32 + 1;
    if !claim(&w.bucket, &w.rings[c], 0, tag) {
        return slow_creator(w, c);
    }
    let e = Entry {
        kind: CREATE,
        id: ID,
        offset: 64,
        data_size: 8,
        metadata_size: 0,
        time_us: 0,
    };
    assert!(push(&w.rings[c], &w.records[c], &e));
    if settled_alone(&w.area, || {
        Some(w.in_table.load(loom::sync::atomic::Ordering::Acquire))
    }) {
        return true;
    }
    // Settle: the store decides from the record.
    section(w, |b| !b.refused[c] && b.owner == Some(tag))
}

/// A creator that asks the store (a `Create` message).
fn slow_creator(w: &World, c: usize) -> bool {
    let tag = c as u32 + 1;
    section(w, |b| {
        if b.owner.is_none() {
            b.owner = Some(tag);
            true
        } else {
            false
        }
    })
}

fn model(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(bound);
    b.check(f);
}

fn check(w: &World, told: [bool; 2]) {
    let owner = w.books.lock().unwrap().owner;
    assert!(
        !(told[0] && told[1]),
        "both creators were told they created the id"
    );
    for (c, &t) in told.iter().enumerate() {
        if t {
            assert_eq!(
                owner,
                Some(c as u32 + 1),
                "told {c} it created the id; the store kept another"
            );
        }
    }
}

#[test]
fn two_fast_creators_of_one_id_never_both_succeed() {
    model(3, || {
        let w = world();
        let other = {
            let w = w.clone();
            loom::thread::spawn(move || fast_creator(&w, 1))
        };
        let mine = fast_creator(&w, 0);
        let theirs = other.join().unwrap();
        // Whatever the store has not taken in yet, it takes in now.
        section(&w, |_| ());
        check(&w, [mine, theirs]);
    });
}

#[test]
fn a_fast_creator_and_one_that_asks_the_store_never_both_succeed() {
    model(3, || {
        let w = world();
        let other = {
            let w = w.clone();
            loom::thread::spawn(move || slow_creator(&w, 1))
        };
        let mine = fast_creator(&w, 0);
        let theirs = other.join().unwrap();
        section(&w, |_| ());
        check(&w, [mine, theirs]);
    });
}
