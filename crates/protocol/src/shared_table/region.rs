//! A client's holds region beyond its holds: the ring of recent releases
//! and the counts of requests the table answered (docs/protocol.md,
//! "Accounting" and "Counts"). Where each lies, and how each side writes
//! and reads it.

#[cfg(ferroplasma_loom)]
use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(not(ferroplasma_loom))]
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Entries of the ring of recent releases after a client's holds: the
/// client records each slot it gives a hold back on, and the store drains
/// the ring before it picks objects to evict (least recently released
/// first, as for releases sent over the socket).
pub const RING: usize = 1024;

/// Bytes of a client's holds region for a table of `slots` slots: the holds,
/// then (64-byte aligned) the ring's head counter and its entries, then
/// (64-byte aligned) the client's [counts](COUNTS).
pub fn holds_region_len(slots: usize) -> usize {
    counts_offset(slots) + 64
}

/// Requests a client answered from the table without asking the store, by
/// kind: u64s at [`counts_offset`] in its holds region, which only it
/// writes ([`count`]). The store adds them to its request metrics; releases
/// need no count of their own (the ring's head counts them). Untrusted: a
/// client can inflate them (the store takes at most 2^32 of growth per
/// look), never lower them. Present when the store sets [`FEATURE_COUNTS`].
pub const COUNTS: usize = 2;
/// Index among the [`COUNTS`]: gets every object of which the table served.
pub const COUNT_GET: usize = 0;
/// Index among the [`COUNTS`]: contains the table answered alone.
pub const COUNT_CONTAINS: usize = 1;

/// Where a client's [`COUNTS`] start in its holds region.
pub fn counts_offset(slots: usize) -> usize {
    (ring_offset(slots) + 8 + RING * 4).div_ceil(64) * 64
}

/// Client side: one more request of kind `which` answered from the table.
/// A relaxed add on the client's own cache line: a few nanoseconds beside
/// a read of the table.
pub fn count(counts: &[AtomicU64], which: usize) {
    if let Some(c) = counts.get(which) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Where the ring's head (a u64) starts in the holds region.
pub fn ring_offset(slots: usize) -> usize {
    (slots * 4).div_ceil(64) * 64
}

/// Client side: records that a hold on `slot` was given back.
pub fn record_release(head: &AtomicU64, ring: &[AtomicU32], slot: usize) {
    let h = head.fetch_add(1, Ordering::Relaxed);
    if let Some(e) = ring.get(h as usize % RING) {
        e.store(slot as u32 + 1, Ordering::Release);
    }
}

/// Store side: the slots released since `tail` (untrusted: bounded to the
/// ring's size, out-of-range slots dropped); returns them and the new tail.
pub fn drain_releases(
    head: &AtomicU64,
    ring: &[AtomicU32],
    tail: u64,
    slots: usize,
) -> (Vec<usize>, u64) {
    let h = head.load(Ordering::Acquire);
    let from = if h < tail || h - tail > RING as u64 {
        h.saturating_sub(RING as u64)
    } else {
        tail
    };
    let out = (from..h)
        .filter_map(|t| ring.get(t as usize % RING))
        .map(|e| e.load(Ordering::Acquire) as usize)
        .filter(|&v| v >= 1 && v <= slots)
        .map(|v| v - 1)
        .collect();
    (out, h)
}
