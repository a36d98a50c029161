//! Memory the store gives back as objects go: the shared table shrinks
//! with the object count (`Store::resize_readers`), and the pages of large
//! free ranges of the arena go back to the kernel, so that a store emptied
//! of millions of objects holds about what an empty one does
//! (docs/operations.md, "Memory per object").

use super::Shared;

/// Pages are given back once this many more bytes were freed since the
/// last time: deletes of a few objects cost nothing.
const GIVE_BACK_AFTER: u64 = 16 << 20;
/// Free ranges smaller than this keep their pages (they are reused soon,
/// and the kernel gives back whole 2 MiB blocks only).
const SMALLEST_RANGE: u64 = 4 << 20;

impl Shared {
    /// Housekeeping, once a second: the shared table shrinks when deletes
    /// left it mostly empty, and the arena's free pages go back to the
    /// kernel. Each costs O(1) when there is nothing to do.
    pub fn tidy_memory(&mut self) {
        if self.table.is_some() {
            self.store.resize_readers(false);
        }
        let freed = self.store.freed_bytes();
        if !self.give_back_memory || freed < self.freed_given_back + GIVE_BACK_AFTER {
            return;
        }
        self.freed_given_back = freed;
        let mut bytes = 0;
        for (offset, len) in self.store.free_ranges_at_least(SMALLEST_RANGE) {
            match self.arena.give_back(offset, len) {
                Ok(n) => bytes += n,
                Err(e) => {
                    tracing::warn!(error = %e, "free memory of the arena cannot be given back to the kernel; the store keeps it");
                    self.give_back_memory = false;
                    return;
                }
            }
        }
        tracing::debug!(bytes, "free pages of the arena given back");
    }
}
