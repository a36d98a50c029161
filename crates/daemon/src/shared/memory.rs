//! Memory the store gives back as objects go: the shared table shrinks
//! with the object count (`Store::resize_readers`), and the pages of large
//! free ranges of the arena go back to the kernel, so that a store emptied
//! of millions of objects holds about what an empty one does
//! (docs/operations.md, "Memory per object").
//!
//! Giving a gigabyte of pages back takes the kernel about 100 ms, so it is
//! not done while holding the store: each [`GiveBack`] step first reserves
//! its blocks in the allocator (nothing can be created there meanwhile),
//! then the kernel takes their pages on a blocking thread while the store
//! goes on answering, and then the blocks are free again.

use super::Shared;
use crate::arena::{Arena, HUGE_PAGE};
use std::sync::Arc;

/// Pages are given back once this many more bytes were freed since the
/// last time (deletes of a few objects cost nothing), and not while the
/// store allocated this many since its last look (the memory is in use
/// again).
const GIVE_BACK_AFTER: u64 = 16 << 20;
/// Looks in a row (seconds) with less than [`GIVE_BACK_AFTER`] allocated
/// and less freed before pages are given back, by default
/// (`--give-back-after 30s`): memory must stay free that long, so that a
/// loop of large puts and deletes with pauses keeps its pages, as a
/// decaying malloc's would.
pub const QUIET_LOOKS: u32 = 30;
/// Free ranges smaller than this keep their pages (they are reused soon,
/// and the kernel gives back whole 2 MiB blocks only).
const SMALLEST_RANGE: u64 = 4 << 20;
/// Bytes one step reserves at most: what a create can find taken for the
/// few milliseconds the kernel needs for them. A step also reserves at
/// most half of the free memory.
const STEP_BYTES: u64 = 256 << 20;

/// One step of giving pages back: blocks reserved in the allocator, whose
/// pages the kernel takes ([`GiveBack::run`], off the store's lock) before
/// [`Shared::finish_give_back`] frees them again.
#[derive(Debug)]
pub struct GiveBack {
    arena: Arc<Arena>,
    /// `(offset, len)`, 2 MiB-aligned, taken out of the allocator.
    pub blocks: Vec<(u64, u64)>,
    /// Where the next step starts, if free memory is left to look at.
    next: Option<u64>,
}

impl GiveBack {
    /// Gives the blocks' pages back to the kernel: slow, and it touches no
    /// state of the store (run it on a blocking thread). The bytes given
    /// back, or the error that stops giving back for good.
    pub fn run(&self) -> Result<u64, crate::DaemonError> {
        let mut bytes = 0;
        for &(offset, len) in &self.blocks {
            bytes += self.arena.give_back(offset, len)?;
        }
        Ok(bytes)
    }
}

impl Shared {
    /// Housekeeping, once a second: the shared table shrinks when deletes
    /// left it mostly empty; and when enough memory was freed since the last
    /// time, and the store has not allocated as much since the last look,
    /// the first step of giving its pages back. Each costs O(1) when there
    /// is nothing to do.
    ///
    /// Memory freed and allocated again keeps its pages: a program that
    /// puts, reads and deletes large objects in a loop would otherwise have
    /// each round's pages given back and faulted in again by the next (a
    /// 100 MB create then took 6–10× as long as Plasma's, which keeps them).
    /// Only once the store has allocated and freed less than 16 MiB a
    /// second for `--give-back-after` ([`QUIET_LOOKS`] looks by default)
    /// do the pages go.
    pub fn tidy_memory(&mut self) -> Option<GiveBack> {
        if self.table.is_some() {
            self.store.resize_readers(false);
        }
        let (allocated, freed) = (self.store.allocated_bytes(), self.store.freed_bytes());
        let busy = allocated.saturating_sub(self.last_look.0) >= GIVE_BACK_AFTER
            || freed.saturating_sub(self.last_look.1) >= GIVE_BACK_AFTER;
        self.last_look = (allocated, freed);
        self.quiet_looks = match busy {
            true => 0,
            false => self.quiet_looks.saturating_add(1),
        };
        if !self.give_back_memory
            || self.quiet_looks < self.quiet_looks_needed
            || freed < self.freed_given_back + GIVE_BACK_AFTER
        {
            return None;
        }
        self.freed_given_back = freed;
        self.plan_give_back(0)
    }

    /// The step of giving pages back that starts at offset `from`: the
    /// whole 2 MiB blocks of free ranges of at least [`SMALLEST_RANGE`]
    /// below the touched end of the arena (pages above it were never
    /// backed), reserved in the allocator, up to [`STEP_BYTES`] and half
    /// the free memory. `None` when there is nothing (more) to give back.
    pub fn plan_give_back(&mut self, from: u64) -> Option<GiveBack> {
        let end = self.store.touched_end().div_ceil(HUGE_PAGE) * HUGE_PAGE;
        let budget = STEP_BYTES.min(self.store.free_bytes() / 2);
        let mut ranges = self.store.free_ranges_at_least(SMALLEST_RANGE);
        ranges.sort_unstable();
        let (mut blocks, mut taken, mut next) = (Vec::new(), 0, None);
        for (offset, len) in ranges {
            let start = offset.max(from).div_ceil(HUGE_PAGE) * HUGE_PAGE;
            let stop = (offset + len).min(end) / HUGE_PAGE * HUGE_PAGE;
            if stop <= start {
                continue;
            }
            if taken >= budget {
                next = Some(start);
                break;
            }
            let n = (stop - start).min(budget - taken) / HUGE_PAGE * HUGE_PAGE;
            if n == 0 {
                next = Some(start);
                break;
            }
            if self.store.take_free(start, n) {
                blocks.push((start, n));
                taken += n;
            }
            if start + n < stop {
                next = Some(start + n);
                break;
            }
        }
        if blocks.is_empty() {
            return None;
        }
        Some(GiveBack {
            arena: self.arena.clone(),
            blocks,
            next,
        })
    }

    /// A step that did not finish: its blocks are free again.
    pub fn abandon_give_back(&mut self, blocks: &[(u64, u64)]) {
        for &(offset, len) in blocks {
            self.store.put_back_free(offset, len);
        }
        self.space.notify_waiters();
    }

    /// A step is done (`result`: what [`GiveBack::run`] returned): its
    /// blocks are free again, creates waiting for room are woken, and the
    /// next step, if any, is planned.
    pub fn finish_give_back(
        &mut self,
        step: GiveBack,
        result: Result<u64, crate::DaemonError>,
    ) -> Option<GiveBack> {
        self.abandon_give_back(&step.blocks);
        match result {
            Ok(bytes) => tracing::debug!(bytes, "free pages of the arena given back"),
            Err(e) => {
                tracing::warn!(error = %e, "free memory of the arena cannot be given back to the kernel; the store keeps it");
                self.give_back_memory = false;
                return None;
            }
        }
        self.plan_give_back(step.next?)
    }
}

#[cfg(test)]
#[path = "memory_tests.rs"]
mod tests;
