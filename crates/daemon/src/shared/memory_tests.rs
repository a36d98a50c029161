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

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

#[test]
fn steps_reserve_whole_blocks_of_free_memory_and_free_them_again() {
    let (shared, kept) = fragmented(96);
    let mut sh = shared.lock();
    let free_before = sh.store.free_bytes();
    let touched = sh.store.touched_end();
    let mut step = sh.tidy_memory().expect("enough was freed for a give-back");
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
    // The aborted creates above freed memory: one more pass, then nothing
    // is left to give back until more is freed.
    let mut step = sh.tidy_memory();
    while let Some(s) = step {
        let r = s.run();
        step = sh.finish_give_back(s, r);
    }
    assert!(
        sh.tidy_memory().is_none(),
        "nothing more freed: no new give-back"
    );
}
