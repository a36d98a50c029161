//! A best-fit range allocator over one arena.
//!
//! Free ranges are kept twice: by offset (to find neighbours and coalesce in
//! O(log n)) and by `(size, offset)` (to find the smallest range that fits in
//! O(log n)). Best fit, lowest offset first, means freed memory (whose pages
//! are already touched and fast to write) is reused before the untouched tail
//! of the arena. Every offset and size is a multiple of 64.

use ferroplasma_protocol::layout::{align_up, ALIGNMENT};
use std::collections::{BTreeMap, BTreeSet};

/// Allocates 64-byte-aligned ranges of `[0, capacity)`.
#[derive(Debug, Clone)]
pub struct Allocator {
    capacity: u64,
    by_offset: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
    used: u64,
    /// Bytes freed since the allocator was made (only grows).
    freed: u64,
    /// The highest end of any allocation so far: memory above it was never
    /// handed out, so its pages were never touched.
    touched_end: u64,
}

impl Allocator {
    /// An allocator over `capacity` bytes (rounded down to a multiple of 64).
    pub fn new(capacity: u64) -> Self {
        let capacity = capacity & !(ALIGNMENT - 1);
        let mut a = Self {
            capacity,
            by_offset: BTreeMap::new(),
            by_size: BTreeSet::new(),
            used: 0,
            freed: 0,
            touched_end: 0,
        };
        if capacity > 0 {
            a.insert_free(0, capacity);
        }
        a
    }

    /// Usable bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes currently allocated.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Bytes currently free.
    pub fn free(&self) -> u64 {
        self.capacity - self.used
    }

    /// The size of the largest free range.
    pub fn largest_free(&self) -> u64 {
        self.by_size.last().map_or(0, |&(s, _)| s)
    }

    /// Bytes freed since the allocator was made: a change means memory
    /// came back (the daemon then gives large free ranges' pages back to
    /// the kernel).
    pub fn freed(&self) -> u64 {
        self.freed
    }

    /// The free ranges of at least `min` bytes, as (offset, size).
    pub fn free_ranges_at_least(&self, min: u64) -> Vec<(u64, u64)> {
        self.by_size
            .range((min, 0)..)
            .map(|&(size, offset)| (offset, size))
            .collect()
    }

    /// Number of free ranges.
    pub fn free_ranges(&self) -> usize {
        self.by_offset.len()
    }

    /// `1 - largest_free / free`: 0 when all free memory is one range.
    pub fn fragmentation(&self) -> f64 {
        let free = self.free();
        if free == 0 {
            0.0
        } else {
            1.0 - self.largest_free() as f64 / free as f64
        }
    }

    /// The size an allocation of `size` bytes really takes.
    pub fn rounded(size: u64) -> u64 {
        align_up(size).max(ALIGNMENT)
    }

    /// Allocates `size` bytes (rounded up to 64); the offset, or `None` when
    /// no free range is large enough.
    pub fn allocate(&mut self, size: u64) -> Option<u64> {
        let size = Self::rounded(size);
        let &(found, offset) = self.by_size.range((size, 0)..).next()?;
        self.remove_free(offset, found);
        if found > size {
            self.insert_free(offset + size, found - size);
        }
        self.used += size;
        self.touched_end = self.touched_end.max(offset + size);
        Some(offset)
    }

    /// The highest end of any allocation so far: free memory above it has
    /// never held an object.
    pub fn touched_end(&self) -> u64 {
        self.touched_end
    }

    /// Takes `[offset, offset + size)` out of the free memory, where it
    /// lies inside one free range, so that nothing is allocated there until
    /// [`Allocator::put_back`]: the daemon gives such a range's pages back
    /// to the kernel without holding the store. False (nothing taken) when
    /// the range is not free or not 64-byte aligned.
    pub fn take(&mut self, offset: u64, size: u64) -> bool {
        if size == 0 || offset % ALIGNMENT != 0 || size % ALIGNMENT != 0 {
            return false;
        }
        let Some((&o, &s)) = self.by_offset.range(..=offset).next_back() else {
            return false;
        };
        if o + s < offset + size {
            return false;
        }
        self.remove_free(o, s);
        if offset > o {
            self.insert_free(o, offset - o);
        }
        if o + s > offset + size {
            self.insert_free(offset + size, o + s - (offset + size));
        }
        self.used += size;
        true
    }

    /// Returns a range taken with [`Allocator::take`]. It held no object,
    /// so it does not count as freed.
    pub fn put_back(&mut self, offset: u64, size: u64) {
        self.free_range(offset, size);
        self.freed -= size;
    }

    /// Returns a range given by [`Allocator::allocate`]; merges it with free
    /// neighbours.
    ///
    /// # Panics
    /// Never on correct use; debug builds assert the range was allocated.
    pub fn free_range(&mut self, offset: u64, size: u64) {
        let size = Self::rounded(size);
        debug_assert!(offset + size <= self.capacity);
        debug_assert!(!self.overlaps_free(offset, size), "double free at {offset}");
        self.used -= size;
        self.freed += size;
        let (mut start, mut len) = (offset, size);
        if let Some((&prev_off, &prev_len)) = self.by_offset.range(..offset).next_back() {
            if prev_off + prev_len == offset {
                self.remove_free(prev_off, prev_len);
                start = prev_off;
                len += prev_len;
            }
        }
        if let Some(&next_len) = self.by_offset.get(&(offset + size)) {
            self.remove_free(offset + size, next_len);
            len += next_len;
        }
        self.insert_free(start, len);
    }

    /// Free ranges as `(offset, size)`, by offset.
    pub fn free_list(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_offset.iter().map(|(&o, &s)| (o, s))
    }

    fn overlaps_free(&self, offset: u64, size: u64) -> bool {
        if let Some((&o, &s)) = self.by_offset.range(..offset + size).next_back() {
            return o + s > offset;
        }
        false
    }

    fn insert_free(&mut self, offset: u64, size: u64) {
        self.by_offset.insert(offset, size);
        self.by_size.insert((size, offset));
    }

    fn remove_free(&mut self, offset: u64, size: u64) {
        self.by_offset.remove(&offset);
        self.by_size.remove(&(size, offset));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn allocates_aligned_and_coalesces() {
        let mut a = Allocator::new(1024);
        let x = a.allocate(1).unwrap();
        let y = a.allocate(100).unwrap();
        let z = a.allocate(64).unwrap();
        assert_eq!((x, y, z), (0, 64, 192));
        assert_eq!(a.used(), 256);
        a.free_range(y, 100);
        assert_eq!(a.free_ranges(), 2);
        a.free_range(x, 1);
        a.free_range(z, 64);
        assert_eq!(a.free_ranges(), 1);
        assert_eq!(a.largest_free(), 1024);
        assert_eq!(a.used(), 0);
    }

    #[test]
    fn best_fit_reuses_freed_memory_before_the_tail() {
        let mut a = Allocator::new(1 << 20);
        let small = a.allocate(4096).unwrap();
        let _keep = a.allocate(64).unwrap();
        a.free_range(small, 4096);
        assert_eq!(a.allocate(1000), Some(small));
    }

    #[test]
    fn whole_capacity_fits_and_then_nothing() {
        let mut a = Allocator::new(4096);
        assert_eq!(a.allocate(4096), Some(0));
        assert_eq!(a.allocate(1), None);
        assert_eq!(a.fragmentation(), 0.0);
    }

    #[test]
    fn a_taken_range_is_not_allocated_until_put_back() {
        let mut a = Allocator::new(1 << 20);
        let x = a.allocate(4096).unwrap();
        assert_eq!(a.touched_end(), 4096);
        // Inside the free tail: taken, split around, counted as used.
        assert!(a.take(8192, 65536));
        assert_eq!(a.free_ranges(), 2);
        assert_eq!(a.used(), 4096 + 65536);
        // Not free, not inside one free range, not aligned: refused.
        assert!(!a.take(x, 64));
        assert!(!a.take(8192, 64));
        assert!(!a.take(4096, 8192));
        assert!(!a.take(100_032, 100));
        // The hole is skipped: a large allocation lands beyond it.
        let y = a.allocate(65536 + 4096).unwrap();
        assert!(y >= 8192 + 65536, "allocated {y} inside the taken range");
        let freed = a.freed();
        a.put_back(8192, 65536);
        assert_eq!(a.freed(), freed, "putting back frees no object");
        assert_eq!(a.used(), 4096 + 65536 + 4096);
        a.free_range(y, 65536 + 4096);
        a.free_range(x, 4096);
        assert_eq!((a.free_ranges(), a.largest_free()), (1, 1 << 20));
        assert_eq!(a.touched_end(), y + 65536 + 4096);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(u64),
        Free(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u64..5000).prop_map(Op::Alloc),
            (0usize..64).prop_map(Op::Free),
        ]
    }

    /// The largest gap between allocated ranges, computed from scratch.
    fn model_largest_gap(cap: u64, live: &[(u64, u64)]) -> u64 {
        let mut v = live.to_vec();
        v.sort();
        let (mut cursor, mut best) = (0u64, 0u64);
        for (o, s) in v {
            best = best.max(o - cursor);
            cursor = o + s;
        }
        best.max(cap - cursor)
    }

    proptest! {
        #[test]
        fn behaves_like_the_model(cap in 64u64..40_000, ops in proptest::collection::vec(op(), 1..200)) {
            let mut a = Allocator::new(cap);
            let cap = a.capacity();
            let mut live: Vec<(u64, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc(n) => {
                        let size = Allocator::rounded(n);
                        let fits = model_largest_gap(cap, &live) >= size;
                        match a.allocate(n) {
                            Some(off) => {
                                prop_assert!(fits);
                                prop_assert_eq!(off % 64, 0);
                                prop_assert!(off + size <= cap);
                                for &(o, s) in &live {
                                    prop_assert!(off + size <= o || o + s <= off, "overlap");
                                }
                                live.push((off, size));
                            }
                            None => prop_assert!(!fits, "refused although a gap fits"),
                        }
                    }
                    Op::Free(i) => {
                        if !live.is_empty() {
                            let (o, s) = live.swap_remove(i % live.len());
                            a.free_range(o, s);
                        }
                    }
                }
                let used: u64 = live.iter().map(|&(_, s)| s).sum();
                prop_assert_eq!(a.used(), used);
                prop_assert_eq!(a.largest_free(), model_largest_gap(cap, &live));
                // Coalesced: no two free ranges touch.
                let free: Vec<_> = a.free_list().collect();
                for w in free.windows(2) {
                    prop_assert!(w[0].0 + w[0].1 < w[1].0);
                }
                prop_assert_eq!(free.iter().map(|&(_, s)| s).sum::<u64>(), cap - used);
            }
        }
    }
}
