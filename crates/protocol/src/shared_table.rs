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
//! The rest of a client's holds region (its ring of releases and its
//! counts) is in `region`.
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
/// Bytes of the table header; the slots follow it.
pub const HEADER_BYTES: usize = 64;
/// Bytes of each slot: 40 (a 64-byte slot before "fptable2"), so that a
/// store of millions pays 53–64 B of table per object at the 62.5–75% of
/// its slots it keeps taken.
pub const SLOT_BYTES: usize = 40;
/// Bytes of a table of `slots` slots.
pub fn table_len(slots: usize) -> usize {
    HEADER_BYTES + slots * SLOT_BYTES
}
/// The table's magic number ("fptable2": 40-byte slots; a client that
/// knows only "fptable1" does not read this table and asks the store).
pub const MAGIC: u64 = u64::from_le_bytes(*b"fptable2");
/// Set in a hold when the store turned it into store references.
pub const ADOPTED: u32 = 1 << 31;
/// The most holds the store honours per client and slot.
pub const MAX_HOLDS: u32 = 1 << 20;

mod region;
pub use region::{
    count, counts_offset, drain_releases, holds_region_len, record_release, ring_offset, COUNTS,
    COUNT_CONTAINS, COUNT_GET, RING,
};

/// The number of holds (not adopted) in a hold word.
pub fn held(h: &AtomicU32) -> u32 {
    let v = h.load(Ordering::Relaxed);
    if v & ADOPTED != 0 {
        0
    } else {
        v.min(MAX_HOLDS)
    }
}

/// Where a slot's reach lies in its `state` word (the state is the low 8
/// bits).
pub const REACH_SHIFT: u32 = 8;

/// Bits of a slot's location word for the offset in 64-byte units (an
/// arena of up to 16 TiB).
const OFFSET_BITS: u32 = 38;
/// Bits for the data size (an object of up to 1 TiB).
const DATA_BITS: u32 = 40;
/// Bits for the metadata size (up to 256 KiB).
const METADATA_BITS: u32 = 18;
const _: () = assert!(OFFSET_BITS + DATA_BITS + METADATA_BITS == 96);

/// Whether an object at `offset` with these sizes fits a slot's 96-bit
/// location: its offset 64-byte aligned and under 16 TiB, its data under
/// 1 TiB, its metadata under 256 KiB. The store does not publish one that
/// does not; clients get it through the socket.
pub fn fits(offset: u64, data_size: u64, metadata_size: u64) -> bool {
    offset % 64 == 0
        && offset / 64 < 1 << OFFSET_BITS
        && data_size < 1 << DATA_BITS
        && metadata_size < 1 << METADATA_BITS
}

fn pack_location(offset: u64, data_size: u64, metadata_size: u64) -> [u32; 3] {
    let v = u128::from(offset / 64)
        | u128::from(data_size) << OFFSET_BITS
        | u128::from(metadata_size) << (OFFSET_BITS + DATA_BITS);
    [v as u32, (v >> 32) as u32, (v >> 64) as u32]
}

fn unpack_location(w: [u32; 3]) -> (u64, u64, u64) {
    let v = u128::from(w[0]) | u128::from(w[1]) << 32 | u128::from(w[2]) << 64;
    let field = |shift: u32, bits: u32| ((v >> shift) & ((1u128 << bits) - 1)) as u64;
    (
        field(0, OFFSET_BITS) * 64,
        field(OFFSET_BITS, DATA_BITS),
        field(OFFSET_BITS + DATA_BITS, METADATA_BITS),
    )
}

/// Slot states.
pub const EMPTY: u32 = 0;
/// The state's bits in a slot's `state` word.
const STATE_MASK: u32 = (1 << REACH_SHIFT) - 1;
/// A sealed object in memory, readable.
pub const SEALED: u32 = 1;
/// No longer readable through the table (freed, evicted, spilled, deleted).
pub const RETIRED: u32 = 2;

/// The table header (the first [`HEADER_BYTES`] of the table).
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
/// (odd while the store writes the slot); ten 32-bit words.
///
/// The sequence number is 32 bits, as the Linux kernel's sequence counts
/// are: a reader is fooled only if the store rewrites the one slot it is
/// reading 2^31 times between two of its loads, and each rewrite is a
/// whole create, seal and delete through the store.
#[derive(Debug)]
#[repr(C)]
pub struct Slot {
    /// Sequence lock: odd while being written; moves on with every write.
    pub seq: AtomicU32,
    /// [`EMPTY`], [`SEALED`] or [`RETIRED`] (low 8 bits), and the slot's
    /// reach as a home (bits 8 up, see [`Slot::set_reach`]).
    pub state: AtomicU32,
    /// The id's 20 bytes, little-endian words.
    pub id: [AtomicU32; 5],
    /// Offset of the data in 64-byte units (38 bits), data bytes (40 bits)
    /// and metadata bytes (18 bits), little-endian ([`fits`]).
    pub location: [AtomicU32; 3],
}

#[cfg(not(ferroplasma_loom))]
const _: () = assert!(std::mem::size_of::<Slot>() == SLOT_BYTES);
#[cfg(not(ferroplasma_loom))]
const _: () = assert!(std::mem::size_of::<Header>() == HEADER_BYTES);

/// A consistent reading of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    /// The sequence number it was read at (even).
    pub seq: u32,
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

/// The id's three words (as [`id_words`]) from a slot's five 32-bit words.
fn words_of(w: [u32; 5]) -> [u64; 3] {
    let pair = |lo: u32, hi: u32| u64::from(lo) | u64::from(hi) << 32;
    [pair(w[0], w[1]), pair(w[2], w[3]), u64::from(w[4])]
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
            seq: AtomicU32::new(0),
            state: AtomicU32::new(0),
            id: std::array::from_fn(|_| AtomicU32::new(0)),
            location: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }

    /// Hints the CPU to load the slot (its first and last byte: a 40-byte
    /// slot may cross a cache line).
    #[cfg(not(ferroplasma_loom))]
    #[inline(always)]
    pub fn prefetch(&self) {
        prefetch(self.seq.as_ptr());
        prefetch(self.location[2].as_ptr());
    }

    /// Store side (the only writer): the state, without the sequence lock.
    pub fn state_now(&self) -> u32 {
        self.state.load(Ordering::Relaxed) & STATE_MASK
    }

    /// Store side (the only writer): the reach, without the sequence lock.
    pub fn reach_now(&self) -> u32 {
        self.state.load(Ordering::Relaxed) >> REACH_SHIFT
    }

    /// Store side (the only writer): the id's words, without the sequence
    /// lock.
    pub fn words_now(&self) -> [u64; 3] {
        words_of(self.id.each_ref().map(|w| w.load(Ordering::Relaxed)))
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
            let id = words_of(self.id.each_ref().map(|w| w.load(Ordering::Relaxed)));
            let (offset, data_size, metadata_size) =
                unpack_location(self.location.each_ref().map(|w| w.load(Ordering::Relaxed)));
            let v = View {
                seq: s1,
                id,
                state: word & STATE_MASK,
                reach: word >> REACH_SHIFT,
                offset,
                data_size,
                metadata_size,
            };
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s1 {
                return Some(v);
            }
        }
        None
    }

    /// Store side: publishes a sealed object in this slot; false (and the
    /// slot untouched) when its location does not [fit](fits) a slot.
    #[must_use]
    pub fn publish(&self, id: &[u64; 3], offset: u64, data_size: u64, metadata_size: u64) -> bool {
        if !fits(offset, data_size, metadata_size) {
            return false;
        }
        let words = [
            id[0] as u32,
            (id[0] >> 32) as u32,
            id[1] as u32,
            (id[1] >> 32) as u32,
            id[2] as u32,
        ];
        let location = pack_location(offset, data_size, metadata_size);
        self.write(|s| {
            for (w, v) in s.id.iter().zip(words) {
                w.store(v, Ordering::Relaxed);
            }
            for (w, v) in s.location.iter().zip(location) {
                w.store(v, Ordering::Relaxed);
            }
            s.set_state(SEALED);
        });
        true
    }

    /// Store side: records this slot's reach as a home: the objects whose
    /// home it is lie in the `reach` slots from it (0: there are none).
    /// Written outside the sequence lock (the object in this slot, whoever's
    /// home it is, stays readable): a reader takes it as a hint, and an id
    /// it misses is asked of the store. The store raises it before it
    /// publishes an object further out, and lowers it after it retires the
    /// furthest one.
    pub fn set_reach(&self, reach: u32) {
        debug_assert!(reach as usize <= MAX_REACH);
        let state = self.state.load(Ordering::Relaxed) & STATE_MASK;
        self.state
            .store(state | (reach << REACH_SHIFT), Ordering::Release);
    }

    /// The state, keeping the reach (the store is the only writer).
    fn set_state(&self, state: u32) {
        let reach = self.state.load(Ordering::Relaxed) & !STATE_MASK;
        self.state.store(reach | state, Ordering::Relaxed);
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
