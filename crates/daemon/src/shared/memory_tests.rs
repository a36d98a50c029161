//! Giving pages back in steps, off the store's lock: what a step reserves,
//! that nothing is created in it meanwhile, and that the steps together
//! give back every large free range and then free it all again.

use super::*;
use crate::shared::SharedRef;
use ferroplasma_protocol::ObjectId;
use ferroplasma_store::Store;

const MIB: u64 = 1 << 20;

/// A store of `mib` MiB filled with objects of 1 MiB, their bytes written,
/// then all deleted but every eighth, which stays held: free ranges of
/// 7 MiB between them.
fn fragmented(mib: u64) -> (SharedRef, Vec<(u64, u64)>) {
    let arena = Arena::create(mib * MIB, None, false).unwrap();
    let shared = SharedRef::new(Store::new(mib * MIB), arena, None, None);
    let mut kept = Vec::new();
    {
        let mut sh = shared.lock();
        let mut ids = Vec::new();
        for i in 0..mib {
            let id = ObjectId::random();
            let arena = sh.arena.clone();
            let fx = sh
                .store
                .create_sealed(id, MIB, 0, 0, |l| {
                    arena.write(l.offset, &vec![1u8; MIB as usize])
                })
                .unwrap();
            sh.deliver(fx);
            if i % 8 == 0 {
                // Held (by client 9): never evicted to make room.
                let l = sh.store.get(9, id).unwrap();
                kept.push((l.offset, MIB));
            } else {
                ids.push(id);
            }
        }
        for id in ids {
            let (_, fx) = sh.store.delete(id);
            sh.deliver(fx);
        }
    }
    (shared, kept)
}

/// Looks as the store's timer does once a second, until one plans a step
/// (at most [`QUIET_LOOKS`] + 1): how many it took, and the step.
fn looks_until_step(sh: &mut Shared) -> (u32, Option<GiveBack>) {
    for n in 1..=QUIET_LOOKS + 1 {
        if let Some(step) = sh.tidy_memory() {
            return (n, Some(step));
        }
    }
    (QUIET_LOOKS + 1, None)
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

#[test]
fn steps_reserve_whole_blocks_of_free_memory_and_free_them_again() {
    let (shared, kept) = fragmented(96);
    let mut sh = shared.lock();
    let free_before = sh.store.free_bytes();
    let touched = sh.store.touched_end();
    // The first look finds 96 MiB allocated since the last: kept, until
    // enough looks in a row found no allocation.
    let (looks, step) = looks_until_step(&mut sh);
    assert_eq!(looks, QUIET_LOOKS + 1);
    let mut step = step.expect("enough was freed for a give-back");
    let mut covered = Vec::new();
    loop {
        let reserved: u64 = step.blocks.iter().map(|b| b.1).sum();
        assert!(reserved <= STEP_BYTES && reserved <= free_before / 2 + HUGE_PAGE);
        assert_eq!(
            sh.store.free_bytes(),
            free_before - reserved,
            "reserved while it runs"
        );
        for &b in &step.blocks {
            assert_eq!(
                (b.0 % HUGE_PAGE, b.1 % HUGE_PAGE),
                (0, 0),
                "{b:?} is not whole blocks"
            );
            assert!(b.0 + b.1 <= touched.div_ceil(HUGE_PAGE) * HUGE_PAGE);
            assert!(
                kept.iter().all(|&k| !overlaps(k, b)),
                "{b:?} holds an object"
            );
        }
        // Nothing is created inside a reserved block while the kernel takes
        // its pages (which would zero the new object's bytes).
        let mut made = Vec::new();
        while let Ok((l, _)) = sh.store.create(7, ObjectId::random(), MIB, 0, 0) {
            let b = (l.offset, MIB);
            assert!(
                step.blocks.iter().all(|&r| !overlaps(r, b)),
                "created in a reserved block"
            );
            made.push(l.offset);
        }
        let fx = sh.store.disconnect(7); // the unsealed creates go
        sh.deliver(fx);
        covered.extend(step.blocks.iter().copied());
        let result = step.run();
        assert!(result.is_ok(), "{result:?}");
        match sh.finish_give_back(step, result) {
            Some(next) => step = next,
            None => break,
        }
    }
    assert_eq!(
        sh.store.free_bytes(),
        free_before,
        "every block is free again"
    );
    // Every 2 MiB block inside a free range of at least 4 MiB was given back.
    for (offset, len) in sh.store.free_ranges_at_least(SMALLEST_RANGE) {
        let mut at = offset.div_ceil(HUGE_PAGE) * HUGE_PAGE;
        while at + HUGE_PAGE <= (offset + len).min(touched) {
            assert!(
                covered
                    .iter()
                    .any(|&(o, l)| o <= at && at + HUGE_PAGE <= o + l),
                "block at {at} of free range {offset}+{len} was not given back"
            );
            at += HUGE_PAGE;
        }
    }
    // The aborted creates above allocated and freed memory: a look finds
    // it in use again, the next one (no allocation since) gives it back,
    // and then nothing is left to give back until more is freed.
    let (_, mut step) = looks_until_step(&mut sh);
    assert!(step.is_some(), "no allocation since the last looks");
    while let Some(s) = step {
        let r = s.run();
        step = sh.finish_give_back(s, r);
    }
    assert!(
        sh.tidy_memory().is_none(),
        "nothing more freed: no new give-back"
    );
}

/// Memory freed while the store keeps allocating as much again (a program
/// that puts, reads and deletes large objects in a loop) keeps its pages;
/// once [`QUIET_LOOKS`] looks in a row found nothing allocated or freed,
/// they go back.
#[test]
fn freed_memory_keeps_its_pages_until_it_stayed_free_for_a_few_seconds() {
    let (shared, _) = fragmented(96);
    let mut sh = shared.lock();
    for _ in 0..QUIET_LOOKS - 1 {
        assert!(sh.tidy_memory().is_none(), "96 MiB allocated lately");
    }
    for _ in 0..32 {
        let id = ObjectId::random();
        let fx = sh.store.create_sealed(id, MIB, 0, 0, |_| ()).unwrap();
        sh.deliver(fx);
        let (_, fx) = sh.store.delete(id);
        sh.deliver(fx);
    }
    assert!(
        sh.tidy_memory().is_none(),
        "32 MiB allocated and freed again since the last look: kept"
    );
    let (looks, step) = looks_until_step(&mut sh);
    assert_eq!(looks, QUIET_LOOKS, "given back once allocations stopped");
    let step = step.expect("a step");
    let r = step.run();
    let _ = sh.finish_give_back(step, r);
    // Objects made, then a quiet spell, then deleted: their memory was
    // free for no time at all, and keeps its pages as long again.
    let ids: Vec<ObjectId> = (0..32).map(|_| ObjectId::random()).collect();
    for id in &ids {
        let fx = sh.store.create_sealed(*id, MIB, 0, 0, |_| ()).unwrap();
        sh.deliver(fx);
    }
    for _ in 0..=QUIET_LOOKS {
        let _ = sh.tidy_memory();
    }
    for id in ids {
        let (_, fx) = sh.store.delete(id);
        sh.deliver(fx);
    }
    let (looks, step) = looks_until_step(&mut sh);
    assert_eq!(looks, QUIET_LOOKS + 1, "freed memory waits before it goes");
    sh.abandon_give_back(&step.expect("a step").blocks);
}
