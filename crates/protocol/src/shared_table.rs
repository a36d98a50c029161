//! The object table in shared memory: how a client takes a reference on a
//! sealed object without asking the store (docs/protocol.md, "Reads without
//! a round trip").
//!
//! Two regions, both created by the store:
//! - the **table** (mapped read-only by every client: the descriptor it
//!   gets cannot be mapped writable): a header, then [`Slot`]s. Each slot
//!   describes one sealed, in-memory object (id, offset, sizes) under a
//!   sequence lock; an object's slot lies within [`PROBES`] slots of its
//!   id's home slot, found with a hash keyed per store. Each slot also
//!   says, as a home, how far its objects lie (its *reach*): a client
//!   looks no further, so an id that is not there costs one slot's read.
//! - a **holds** region per client (mapped read-write by that client only):
//!   one [`AtomicU32`] per slot, the number of references the client holds
//!   on the object in that slot, taken without asking the store.
//!
//! The protocol (hazard-pointer style):
//! - a client finds the slot, adds one to its hold on it, and then reads
//!   the slot again: if it has not changed, the object is its to read
//!   ([`take`]); if it has, it takes the hold back and asks the store;
//! - the store, before it frees, evicts or spills an object, first *retires*
//!   its slot (the sequence number moves on) and only then reads every
//!   client's hold on that slot; a client that holds it is given store
//!   references for those holds instead ([`adopt`]: the [`ADOPTED`] bit is
//!   set), and the object stays;
//! - a client gives a hold back by taking one off ([`give_back`]); when the
//!   store had adopted its holds, it also releases one reference over the
//!   socket.
//!
//! Both sides write, then issue a sequentially consistent fence, then read
//! what the other wrote: of a client's hold and the store's retirement, at
//! least one sees the other. So an object is never freed while a client
//! holds it (`tests/table_model.rs` checks every interleaving with loom).
//!
//! A client can write only its own holds; the store reads them as untrusted
//! numbers (capped at [`MAX_HOLDS`]). A client that lies pins objects for
//! itself, as one that never releases would.

#[cfg(ferroplasma_loom)]
use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
#[cfg(not(ferroplasma_loom))]
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use crate::ObjectId;

/// Slots an object may lie from its home slot in a table without reaches
/// (an older store), and the fewest slots a table has.
pub const PROBES: usize = 16;
/// Slots an object may lie from its home slot where the store keeps each
/// home's reach ([`FEATURE_REACH`]): a reader looks only as far as the
/// reach, so a long window costs nothing where it is not used, and a table
/// three quarters full still finds a slot for every object.
pub const MAX_REACH: usize = 128;
/// Bytes of the table header and of each slot.
pub const SLOT_BYTES: usize = 64;
/// The table's magic number ("fptable1").
pub const MAGIC: u64 = u64::from_le_bytes(*b"fptable1");
/// Set in a hold when the store turned it into store references.
pub const ADOPTED: u32 = 1 << 31;
/// The most holds the store honours per client and slot.
pub const MAX_HOLDS: u32 = 1 << 20;

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

/// The number of holds (not adopted) in a hold word.
pub fn held(h: &AtomicU32) -> u32 {
    let v = h.load(Ordering::Relaxed);
    if v & ADOPTED != 0 {
        0
    } else {
        v.min(MAX_HOLDS)
    }
}

/// Where a slot's reach lies in its `state` word (the state is the low 32
/// bits).
pub const REACH_SHIFT: u32 = 32;

/// Slot states.
pub const EMPTY: u32 = 0;
/// A sealed object in memory, readable.
pub const SEALED: u32 = 1;
/// No longer readable through the table (freed, evicted, spilled, deleted).
pub const RETIRED: u32 = 2;

/// The table header (the first [`SLOT_BYTES`] of the table).
#[derive(Debug)]
#[repr(C, align(64))]
pub struct Header {
    /// [`MAGIC`].
    pub magic: AtomicU64,
    /// Number of slots after the header.
    pub slots: AtomicU64,
    /// The hash key of this store.
    pub key: AtomicU64,
    /// What this store's table does beyond the first layout
    /// ([`FEATURE_REACH`], [`FEATURE_COUNTS`], [`FEATURE_REPLACED`]); a
    /// store that does not set a bit leaves it 0.
    pub features: AtomicU64,
    /// Non-zero once the store has moved every object of this table into
    /// another, larger or smaller (its number of slots): a client asks for
    /// the new one (`AttachTable`) when an id is not found here. Present
    /// when the store sets [`FEATURE_REPLACED`].
    pub replaced: AtomicU64,
}

/// In [`Header::features`]: the store keeps each home slot's reach
/// ([`Slot::set_reach`]). Without it (an older store), every reach reads 0
/// and a reader must look at the whole window.
pub const FEATURE_REACH: u64 = 1;

/// In [`Header::features`]: each client's holds region ends with its
/// [`COUNTS`] (and is [`holds_region_len`] long). Without it (an older
/// store, whose regions end after the ring), a client counts nothing.
pub const FEATURE_COUNTS: u64 = 2;

/// In [`Header::features`]: the store replaces the table when it fills or
/// empties (it moves every object into a new one, sets [`Header::replaced`]
/// here, and hands the new one to clients that ask with `AttachTable`).
/// Without it (an older store), the table never changes.
pub const FEATURE_REPLACED: u64 = 4;

/// One slot: an object's id, where its bytes lie and a sequence number
/// (odd while the store writes the slot).
#[derive(Debug)]
#[repr(C, align(64))]
pub struct Slot {
    /// Sequence lock: odd while being written; moves on with every write.
    pub seq: AtomicU64,
    /// The id's 20 bytes in three words (the last 4 bytes zero).
    pub id: [AtomicU64; 3],
    /// [`EMPTY`], [`SEALED`] or [`RETIRED`] (low 32 bits), and the slot's
    /// reach as a home (bits 32 up, see [`Slot::set_reach`]).
    pub state: AtomicU64,
    /// Offset of the data in the arena.
    pub offset: AtomicU64,
    /// Data bytes.
    pub data_size: AtomicU64,
    /// Metadata bytes.
    pub metadata_size: AtomicU64,
}

#[cfg(not(ferroplasma_loom))]
const _: () = assert!(std::mem::size_of::<Slot>() == SLOT_BYTES);
#[cfg(not(ferroplasma_loom))]
const _: () = assert!(std::mem::size_of::<Header>() == SLOT_BYTES);

/// A consistent reading of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    /// The sequence number it was read at (even).
    pub seq: u64,
    /// The id's words.
    pub id: [u64; 3],
    /// The state.
    pub state: u32,
    /// How many slots from this one, as a home, hold its objects (0:
    /// none); written outside the sequence lock, so only a hint.
    pub reach: u32,
    /// Offset of the data.
    pub offset: u64,
    /// Data bytes.
    pub data_size: u64,
    /// Metadata bytes.
    pub metadata_size: u64,
}

/// The id as the three words a slot stores.
pub fn id_words(id: &ObjectId) -> [u64; 3] {
    let b = &id.0;
    let w = |r: std::ops::Range<usize>| {
        let mut a = [0u8; 8];
        a[..r.len()].copy_from_slice(&b[r]);
        u64::from_le_bytes(a)
    };
    [w(0..8), w(8..16), w(16..20)]
}

/// The id a slot's three words hold (the inverse of [`id_words`]).
pub fn id_of_words(words: &[u64; 3]) -> ObjectId {
    let mut b = [0u8; 20];
    b[..8].copy_from_slice(&words[0].to_le_bytes());
    b[8..16].copy_from_slice(&words[1].to_le_bytes());
    b[16..].copy_from_slice(&words[2].to_le_bytes()[..4]);
    ObjectId(b)
}

/// A hint to load the cache line at `p`; never faults, never changes
/// memory. Batched work on many slots (a client's batched get, the store
/// publishing a batch of pulled objects) issues one for every line it will
/// touch first, so the cache misses overlap instead of coming one by one.
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // Safety: a prefetch is a hint: it reads no memory the program can
    // observe and cannot fault, whatever `p` is.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// The id's home slot in a table of `slots` slots under `key`.
pub fn home(words: &[u64; 3], key: u64, slots: usize) -> usize {
    // Three rounds of a 64-bit finalizer (SplitMix64's), keyed: a client
    // cannot aim ids at one window without knowing the store's key.
    let mut h = key;
    for w in words {
        h ^= *w;
        h = h.wrapping_add(0x9e37_79b9_7f4a_7c15);
        h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^= h >> 31;
    }
    (h % slots.max(1) as u64) as usize
}

/// The slots an id may lie in, home first.
pub fn window(words: &[u64; 3], key: u64, slots: usize) -> impl Iterator<Item = usize> {
    window_from(home(words, key, slots), slots)
}

/// The window of slots from the home slot `start`, home first (the slot
/// `k` steps from home is the `k`-th).
pub fn window_from(start: usize, slots: usize) -> impl Iterator<Item = usize> {
    window_of(start, slots, PROBES)
}

/// The first `len` slots from the home slot `start` (at most the table).
pub fn window_of(start: usize, slots: usize, len: usize) -> impl Iterator<Item = usize> {
    (0..len.min(slots)).map(move |i| (start + i) % slots)
}

impl Slot {
    /// A new, empty slot (tests and the loom model; the store's slots are
    /// zeroed shared memory).
    pub fn new() -> Self {
        Self {
            seq: AtomicU64::new(0),
            id: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
            state: AtomicU64::new(0),
            offset: AtomicU64::new(0),
            data_size: AtomicU64::new(0),
            metadata_size: AtomicU64::new(0),
        }
    }

    /// Reads the slot consistently; `None` if the store kept writing it.
    pub fn read(&self) -> Option<View> {
        // (Under the model checker, fewer tries: each one multiplies the
        // interleavings to explore, and giving up is a legal outcome.)
        const TRIES: usize = if cfg!(ferroplasma_loom) { 2 } else { 64 };
        for _ in 0..TRIES {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                #[cfg(ferroplasma_loom)]
                loom::thread::yield_now();
                continue;
            }
            let word = self.state.load(Ordering::Relaxed);
            let v = View {
                seq: s1,
                id: [
                    self.id[0].load(Ordering::Relaxed),
                    self.id[1].load(Ordering::Relaxed),
                    self.id[2].load(Ordering::Relaxed),
                ],
                state: word as u32,
                reach: (word >> REACH_SHIFT) as u32,
                offset: self.offset.load(Ordering::Relaxed),
                data_size: self.data_size.load(Ordering::Relaxed),
                metadata_size: self.metadata_size.load(Ordering::Relaxed),
            };
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s1 {
                return Some(v);
            }
        }
        None
    }

    /// Store side: publishes a sealed object in this slot.
    pub fn publish(&self, id: &[u64; 3], offset: u64, data_size: u64, metadata_size: u64) {
        self.write(|s| {
            for (w, v) in s.id.iter().zip(id) {
                w.store(*v, Ordering::Relaxed);
            }
            s.offset.store(offset, Ordering::Relaxed);
            s.data_size.store(data_size, Ordering::Relaxed);
            s.metadata_size.store(metadata_size, Ordering::Relaxed);
            s.set_state(SEALED);
        });
    }

    /// Store side: records this slot's reach as a home: the objects whose
    /// home it is lie in the `reach` slots from it (0: there are none).
    /// Written outside the sequence lock (the object in this slot, whoever's
    /// home it is, stays readable): a reader takes it as a hint, and an id
    /// it misses is asked of the store. The store raises it before it
    /// publishes an object further out, and lowers it after it retires the
    /// furthest one.
    pub fn set_reach(&self, reach: u32) {
        let state = self.state.load(Ordering::Relaxed) & u64::from(u32::MAX);
        self.state
            .store(state | (u64::from(reach) << REACH_SHIFT), Ordering::Release);
    }

    /// The state, keeping the reach (the store is the only writer).
    fn set_state(&self, state: u32) {
        let reach = self.state.load(Ordering::Relaxed) & !u64::from(u32::MAX);
        self.state
            .store(reach | u64::from(state), Ordering::Relaxed);
    }

    /// Store side: retires the slot (no new hold on its object can be
    /// validated from here on), then fences: the caller reads the holds
    /// next ([`adopt`]).
    pub fn retire(&self) {
        self.write(|s| s.set_state(RETIRED));
        fence(Ordering::SeqCst);
    }

    fn write(&self, f: impl FnOnce(&Self)) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1) | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        f(self);
        self.seq.store((s | 1).wrapping_add(1), Ordering::Release);
    }
}

impl Default for Slot {
    fn default() -> Self {
        Self::new()
    }
}

/// What [`take`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// A hold on the object in this slot: read it, then [`give_back`].
    Held(usize, View),
    /// Not in the table (absent, not sealed, spilled, or not published):
    /// ask the store.
    Absent,
    /// In the table, but no hold could be taken (the store adopted this
    /// client's holds on the slot and they are not all given back yet, or
    /// the slot changed under the client): ask the store.
    Busy,
    /// The slot changed under the client after it took a hold, and the
    /// store adopted that hold meanwhile: release one reference to the
    /// object over the socket, then ask the store.
    ReleaseThenAsk,
}

/// Client side: takes a hold on the sealed object `id` without asking the
/// store; `reach`: the store keeps the homes' reach ([`FEATURE_REACH`]).
pub fn take(slots: &[Slot], holds: &[AtomicU32], key: u64, id: &ObjectId, reach: bool) -> Take {
    let (i, v) = match find(slots, key, &id_words(id), reach) {
        Ok(Some(found)) => found,
        Ok(None) => return Take::Absent,
        Err(Changing) => return Take::Busy,
    };
    let Some(h) = holds.get(i) else {
        return Take::Busy;
    };
    let mut cur = h.load(Ordering::Relaxed);
    loop {
        if cur & ADOPTED != 0 || cur >= MAX_HOLDS {
            return Take::Busy;
        }
        match h.compare_exchange_weak(cur, cur + 1, Ordering::SeqCst, Ordering::Relaxed) {
            Ok(_) => break,
            Err(x) => cur = x,
        }
    }
    fence(Ordering::SeqCst);
    if slots[i].seq.load(Ordering::Acquire) == v.seq {
        return Take::Held(i, v);
    }
    // Changed meanwhile (retired, perhaps reused): give the hold back.
    if give_back(h) {
        Take::ReleaseThenAsk
    } else {
        Take::Busy
    }
}

/// A slot the store kept writing while it was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Changing;

/// The slot where the sealed object with id `words` is published, and a
/// consistent reading of it; `None` if it is not in the table. Looks at
/// the id's home slot, then only as far as that slot's reach (with
/// `reach`: the store keeps it, [`FEATURE_REACH`]) or the whole window.
pub fn find(
    slots: &[Slot],
    key: u64,
    words: &[u64; 3],
    reach: bool,
) -> Result<Option<(usize, View)>, Changing> {
    let start = home(words, key, slots.len());
    let Some(first) = slots.get(start) else {
        return Ok(None); // a table of no slots
    };
    let first = first.read().ok_or(Changing)?;
    let limit = if reach {
        (first.reach as usize).min(MAX_REACH)
    } else {
        PROBES
    };
    for (k, i) in window_of(start, slots.len(), limit).enumerate() {
        let v = if k == 0 {
            first
        } else {
            slots[i].read().ok_or(Changing)?
        };
        if v.state == SEALED && v.id == *words {
            return Ok(Some((i, v)));
        }
    }
    Ok(None)
}

/// Client side: gives one hold back. True when the store had adopted the
/// holds: the caller then releases one reference to the object over the
/// socket.
pub fn give_back(h: &AtomicU32) -> bool {
    let mut cur = h.load(Ordering::Relaxed);
    loop {
        let adopted = cur & ADOPTED != 0;
        let n = cur & !ADOPTED;
        if n == 0 {
            return false; // nothing held (a bug, or a store that cleared it)
        }
        let next = if adopted && n == 1 { 0 } else { cur - 1 };
        match h.compare_exchange_weak(cur, next, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return adopted,
            Err(x) => cur = x,
        }
    }
}

/// Store side, after [`Slot::retire`]: turns a client's holds on the slot
/// into store references. Returns how many it adopted (0: none held).
pub fn adopt(h: &AtomicU32) -> u32 {
    let mut cur = h.load(Ordering::Acquire);
    loop {
        if cur == 0 || cur & ADOPTED != 0 {
            // None held, or adopted before for an earlier object (those are
            // store references already; no hold was taken since).
            return 0;
        }
        match h.compare_exchange_weak(cur, cur | ADOPTED, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return cur.min(MAX_HOLDS),
            Err(x) => cur = x,
        }
    }
}
