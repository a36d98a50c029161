//! The hold protocol of the shared object table (`src/shared_table.rs`), checked
//! with loom over every interleaving the C11 memory model allows: an object
//! is never freed (its memory written) while a client holds it.
//!
//! Run by `make test`:
//! `RUSTFLAGS="--cfg ferroplasma_loom" cargo test -p ferroplasma-protocol --test table_model --release`
#![cfg(ferroplasma_loom)]

use ferroplasma_protocol::shared_table::{adopt, give_back, id_words, take, Slot, Take};
use ferroplasma_protocol::ObjectId;
use loom::cell::UnsafeCell;
use loom::sync::atomic::AtomicU32;
use loom::sync::Arc;

struct World {
    slots: Vec<Slot>,
    holds: Vec<AtomicU32>,
    /// The object's bytes: read by a client holding it, written when the
    /// store frees it. Loom reports a read and a write that are not
    /// ordered by happens-before (a use after free).
    bytes: UnsafeCell<u64>,
}

// Safety: the cell is only touched through loom's checked accessors.
unsafe impl Sync for World {}

const ID: ObjectId = ObjectId([7; 20]);

fn world() -> Arc<World> {
    let w = World {
        slots: vec![Slot::new()],
        holds: vec![AtomicU32::new(0)],
        bytes: UnsafeCell::new(42),
    };
    w.slots[0].set_reach(1);
    assert!(w.slots[0].publish(&id_words(&ID), 64, 8, 0));
    Arc::new(w)
}

/// A client reads the object through a hold and gives it back.
fn client(w: &World) {
    match take(&w.slots, &w.holds, 0, &ID, true) {
        Take::Held(i, _) => {
            // Safety: a read through loom's cell; loom checks it.
            let v = w.bytes.with(|p| unsafe { *p });
            assert_eq!(v, 42, "read freed memory");
            // Adopted or not, the hold ends here (an adopted one is a store
            // reference the client releases over the socket: the model's
            // store never frees an adopted object).
            give_back(&w.holds[i]);
        }
        Take::Absent | Take::Busy | Take::ReleaseThenAsk => {}
    }
}

/// The store retires the object and frees it unless a client holds it.
fn store(w: &World) -> bool {
    w.slots[0].retire();
    if adopt(&w.holds[0]) == 0 {
        // Safety: a write through loom's cell; loom checks it.
        w.bytes.with_mut(|p| unsafe { *p = 0 });
        true
    } else {
        false
    }
}

/// Every interleaving up to `bound` preemptions (loom's standard bound:
/// unbounded search of these spin and CAS loops does not end).
fn model(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(bound);
    b.check(f);
}

#[test]
fn an_object_is_never_freed_while_a_client_holds_it() {
    model(4, || {
        let w = world();
        let c = {
            let w = w.clone();
            loom::thread::spawn(move || client(&w))
        };
        store(&w);
        c.join().unwrap();
    });
}

#[test]
fn two_clients_and_the_store() {
    model(2, || {
        let w = world();
        let cs: Vec<_> = (0..2)
            .map(|_| {
                let w = w.clone();
                loom::thread::spawn(move || client(&w))
            })
            .collect();
        store(&w);
        for c in cs {
            c.join().unwrap();
        }
    });
}
