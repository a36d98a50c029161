//! Writes without a round trip: the layout and both sides of the protocol
//! by which a client creates, writes and seals small objects in memory the
//! store leased it, telling the store through a ring instead of a message
//! (docs/protocol.md, "Writes without a round trip").
//!
//! Three pieces of shared memory, all inside the arena (which clients of
//! the store's own user map read-write already):
//!
//! - the **area**, one per store: an [`Area`] header (the store's `epoch`,
//!   odd while it holds its lock; `hidden`, how many ids the store has that
//!   the shared table does not show; the doorbell words), then [`BUCKETS`]
//!   32-bit **claims**, one per bucket of ids;
//! - a **ring** per client: a [`RingHeader`] (the client's `head`, the
//!   store's `tail`) and [`RING_RECORDS`] records of 64 bytes
//!   ([`Record`]): create, seal, abort;
//! - **leases**: ranges of the arena a client allocates its objects in,
//!   the open one's top published in the ring header ([`bump`]) so that
//!   the store can close it and take its unused rest back when it needs
//!   the room ([`close_lease`]).
//!
//! A create on the fast path ([`claim`], [`push`], [`settled_alone`]):
//! 1. the client claims the id's bucket (compare-and-swap from 0 to its
//!    tag); a bucket claimed by anyone goes the slow way (a `Create`);
//! 2. it writes a `CREATE` record and moves its ring's head on (the store
//!    may now see it), then issues a sequentially consistent fence;
//! 3. it reads the store's `epoch` (even: the store is not inside its
//!    lock), `hidden` (0), the shared table (the id is not there), `hidden`
//!    again and the epoch again (unchanged). Then no one else can have
//!    created the id: the create is done.
//!
//! Otherwise it asks the store (`Settle`), which decides from the record.
//! The store, on its side ([`begin`]), makes its epoch odd, fences, and
//! only then reads the rings: either it sees the record (and takes it in
//! before anything else it does under the lock), or the client sees the
//! odd or changed epoch. It clears a claim after it took the record in.
//! Two clients creating one id cannot both hold its bucket's claim; the
//! second one goes the slow way, after the first one's object is in the
//! store (hidden, or in the table).
//!
//! The loom model `tests/fast_writes_model.rs` checks that two creators of
//! one id (fast, fast or slow) never both succeed, over every interleaving.

#[cfg(ferroplasma_loom)]
use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
#[cfg(not(ferroplasma_loom))]
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use crate::ObjectId;

/// Buckets of ids, each with a claim word.
pub const BUCKETS: usize = 1 << 16;
/// Bytes of the area's header; the claims follow it.
pub const AREA_HEADER_BYTES: usize = 128;
/// Bytes of the whole area.
pub const AREA_BYTES: usize = AREA_HEADER_BYTES + 4 * BUCKETS;
/// Records in each client's ring.
pub const RING_RECORDS: usize = 1024;
/// Bytes of a ring's header; the records follow it.
pub const RING_HEADER_BYTES: usize = 128;
/// Bytes of a record.
pub const RECORD_BYTES: usize = 64;
/// Bytes of a whole ring.
pub const RING_BYTES: usize = RING_HEADER_BYTES + RING_RECORDS * RECORD_BYTES;
/// The largest object (data and metadata, laid out) created on the fast
/// path; larger ones take the round trip, which costs little next to
/// writing them.
pub const MAX_FAST_OBJECT: u64 = 64 << 10;
/// Bytes of a lease.
pub const LEASE_BYTES: u64 = 1 << 20;

/// Record kinds.
pub const CREATE: u64 = 1;
/// The object is sealed.
pub const SEAL: u64 = 2;
/// The object is discarded (never sealed).
pub const ABORT: u64 = 3;
/// The object is sealed and its creator's reference given back at once
/// (a create-and-seal or put: the creator keeps no reference).
pub const SEAL_RELEASE: u64 = 4;

/// The store's words, then the clients' doorbell, a cache line each.
#[repr(C)]
#[derive(Debug)]
pub struct Area {
    /// Odd while the store holds its lock (it changes the table, its
    /// objects and `hidden` only then).
    pub epoch: AtomicU64,
    /// Ids the store has in memory or spilled that the shared table does
    /// not show (unsealed, being deleted, spilled): while not 0, a
    /// client cannot tell from the table that an id is free.
    pub hidden: AtomicU64,
    /// Non-zero while someone waits for a seal (a `Get` waiting, a
    /// subscriber): a client that seals then rings the doorbell.
    pub want_doorbell: AtomicU32,
    _store: [u32; 11],
    /// Set by a client that rang the doorbell (sent an empty `Release`);
    /// cleared by the store when it drains the rings.
    pub doorbell: AtomicU32,
    /// Set by a client that wrote records; cleared by the store when it
    /// drains the rings. The store looks at it every few milliseconds and
    /// takes the records in when set, so that other clients find new
    /// objects in the shared table soon even when nobody asks the store.
    pub dirty: AtomicU32,
    _clients: [u32; 14],
}

/// A client's ring: its head (records written), the bucket it is claiming
/// (so that the store can clear a claim of a client that died before its
/// record), and the store's tail (records taken in).
#[repr(C)]
#[derive(Debug)]
pub struct RingHeader {
    /// Records written so far (the client's; release ordering).
    pub head: AtomicU64,
    /// 1 + the bucket the client is claiming now, 0 when none.
    pub claiming: AtomicU32,
    _pad: u32,
    /// Where the client allocates next in its open lease ([`bump`]); the
    /// store sets it when it grants a lease ([`open_lease`]) and may swap
    /// in [`CLOSED`] to take the rest of the lease back ([`close_lease`]).
    pub lease_top: AtomicU64,
    _client: [u64; 5],
    /// Records taken in so far (the store's).
    pub tail: AtomicU64,
    _store: [u64; 7],
}

/// One record: eight 64-bit words (kind, the id in three words, offset,
/// data size, metadata size, the client's clock).
#[repr(C)]
#[derive(Debug)]
pub struct Record {
    /// The words.
    pub words: [AtomicU64; 8],
}

#[cfg(not(ferroplasma_loom))]
const _: () = assert!(std::mem::size_of::<Area>() == AREA_HEADER_BYTES);
const _: () = assert!(BUCKETS <= 1 << 16);
#[cfg(not(ferroplasma_loom))]
const _: () = assert!(std::mem::size_of::<RingHeader>() == RING_HEADER_BYTES);
#[cfg(not(ferroplasma_loom))]
const _: () = assert!(std::mem::size_of::<Record>() == RECORD_BYTES);

impl Area {
    /// A zeroed area header (tests and the loom model).
    pub fn new() -> Self {
        Self {
            epoch: AtomicU64::new(0),
            hidden: AtomicU64::new(0),
            want_doorbell: AtomicU32::new(0),
            _store: [0; 11],
            doorbell: AtomicU32::new(0),
            dirty: AtomicU32::new(0),
            _clients: [0; 14],
        }
    }
}

impl Default for Area {
    fn default() -> Self {
        Self::new()
    }
}

impl RingHeader {
    /// A zeroed ring header (tests and the loom model).
    pub fn new() -> Self {
        Self {
            head: AtomicU64::new(0),
            claiming: AtomicU32::new(0),
            _pad: 0,
            lease_top: AtomicU64::new(0),
            _client: [0; 5],
            tail: AtomicU64::new(0),
            _store: [0; 7],
        }
    }
}

impl Default for RingHeader {
    fn default() -> Self {
        Self::new()
    }
}

impl Record {
    /// A zeroed record (tests and the loom model).
    pub fn new() -> Self {
        Self {
            words: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Default for Record {
    fn default() -> Self {
        Self::new()
    }
}

/// What a record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// [`CREATE`], [`SEAL`], [`ABORT`] or [`SEAL_RELEASE`] (anything else:
    /// a malformed record).
    pub kind: u64,
    /// The object.
    pub id: ObjectId,
    /// Where its data starts in the arena (`CREATE` only).
    pub offset: u64,
    /// Its data bytes (`CREATE` only).
    pub data_size: u64,
    /// Its metadata bytes (`CREATE` only).
    pub metadata_size: u64,
    /// When the client made the record, in µs since the Unix epoch (the
    /// object's create or seal time; the store keeps its own clock when
    /// this one is far off).
    pub time_us: u64,
}

/// The client's clock for [`Entry::time_us`].
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The bucket of `id`: all 20 bytes (ids that share a prefix, or differ
/// only in a counter at the end, fall in different buckets), as three
/// little-endian words (the last one 4 bytes) through SplitMix64's
/// finalizer, in turn, the top 16 bits.
pub fn bucket_of(id: &ObjectId) -> usize {
    let w = crate::shared_table::id_words(id);
    let mut h = 0u64;
    for x in w {
        h = mix(h ^ x);
    }
    (h >> 48) as usize % BUCKETS
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Client side, step 1: claims `bucket` for this client's `tag` (never 0).
/// False when it is claimed already (by anyone): the create goes the slow
/// way.
pub fn claim(bucket: &AtomicU32, ring: &RingHeader, index: usize, tag: u32) -> bool {
    ring.claiming.store(index as u32 + 1, Ordering::Relaxed);
    let won = bucket
        .compare_exchange(0, tag, Ordering::SeqCst, Ordering::Relaxed)
        .is_ok();
    if !won {
        ring.claiming.store(0, Ordering::Relaxed);
    }
    won
}

/// Client side: gives back a claim no record was written for (a lease or
/// a ring slot could not be had).
pub fn unclaim(bucket: &AtomicU32, ring: &RingHeader, tag: u32) {
    let _ = bucket.compare_exchange(tag, 0, Ordering::SeqCst, Ordering::Relaxed);
    ring.claiming.store(0, Ordering::Relaxed);
}

/// Client side, step 2: writes `e` as the next record and moves the head
/// on. False (nothing written) when the ring is full: the store has not
/// taken in the records before it yet.
pub fn push(ring: &RingHeader, records: &[Record], e: &Entry) -> bool {
    let head = ring.head.load(Ordering::Relaxed);
    let tail = ring.tail.load(Ordering::Acquire);
    if head.wrapping_sub(tail) >= records.len() as u64 {
        return false;
    }
    let r = &records[(head % records.len() as u64) as usize];
    let id = crate::shared_table::id_words(&e.id);
    let words = [
        e.kind,
        id[0],
        id[1],
        id[2],
        e.offset,
        e.data_size,
        e.metadata_size,
        e.time_us,
    ];
    for (w, v) in r.words.iter().zip(words) {
        w.store(v, Ordering::Relaxed);
    }
    ring.head.store(head + 1, Ordering::SeqCst);
    ring.claiming.store(0, Ordering::Relaxed);
    true
}

/// Client side, step 3: after [`push`] of a `CREATE`, whether the create
/// is settled without asking: the store is outside its lock and was
/// throughout, hides no id, and `in_table` (a look at the shared table:
/// `Some(true)` there, `Some(false)` not there, `None` cannot tell) does
/// not find the id. False: ask the store.
pub fn settled_alone(area: &Area, in_table: impl FnOnce() -> Option<bool>) -> bool {
    // The head was written; the store's epoch is read after it (Dekker:
    // the store writes its epoch, fences, then reads the heads).
    fence(Ordering::SeqCst);
    let e1 = area.epoch.load(Ordering::Acquire);
    if e1 % 2 == 1 || area.hidden.load(Ordering::Acquire) != 0 {
        return false;
    }
    if in_table() != Some(false) {
        return false;
    }
    if area.hidden.load(Ordering::Acquire) != 0 {
        return false;
    }
    fence(Ordering::Acquire);
    area.epoch.load(Ordering::Relaxed) == e1
}

/// Client side, after records: marks the rings as having some (one
/// store, only when not marked already, so the line is written rarely).
pub fn mark_dirty(area: &Area) {
    if area.dirty.load(Ordering::Relaxed) == 0 {
        area.dirty.store(1, Ordering::Relaxed);
    }
}

/// Store side: whether a client marked the rings since the last drain.
pub fn is_dirty(area: &Area) -> bool {
    area.dirty.load(Ordering::Relaxed) != 0
}

/// Client side, after a `SEAL` record: whether to ring the doorbell (the
/// store waits for seals, and no one rang since it last looked).
pub fn should_ring(area: &Area) -> bool {
    fence(Ordering::SeqCst);
    area.want_doorbell.load(Ordering::Relaxed) != 0 && area.doorbell.swap(1, Ordering::AcqRel) == 0
}

/// Store side: entering its lock. The epoch turns odd, and the rings are
/// read only after (the caller drains them next).
pub fn begin(area: &Area) {
    area.epoch.fetch_add(1, Ordering::SeqCst);
    fence(Ordering::SeqCst);
    area.doorbell.swap(0, Ordering::AcqRel);
    area.dirty.store(0, Ordering::Relaxed);
}

/// Store side: leaving its lock, with `hidden` ids the table does not
/// show and `want_doorbell` as it is now. The caller drains the rings once
/// more after setting `want_doorbell` and before calling [`end`].
pub fn publish_state(area: &Area, hidden: u64, want_doorbell: bool) {
    area.hidden.store(hidden, Ordering::Release);
    area.want_doorbell
        .store(u32::from(want_doorbell), Ordering::SeqCst);
    fence(Ordering::SeqCst);
}

/// Store side: the lock is let go; the epoch turns even.
pub fn end(area: &Area) {
    area.epoch.fetch_add(1, Ordering::Release);
}

/// Store side: the records of `ring` written since `tail` (what it took
/// in so far), at most [`RING_RECORDS`] (a head further on is a client's
/// lie: `None`).
pub fn pending(ring: &RingHeader, tail: u64, records: usize) -> Option<u64> {
    let head = ring.head.load(Ordering::Acquire);
    let n = head.wrapping_sub(tail);
    (n <= records as u64).then_some(n)
}

/// Store side: the record at position `at` (read as the client left it:
/// untrusted).
pub fn read(records: &[Record], at: u64) -> Entry {
    let r = &records[(at % records.len() as u64) as usize];
    let w: [u64; 8] = std::array::from_fn(|i| r.words[i].load(Ordering::Relaxed));
    Entry {
        kind: w[0],
        id: crate::shared_table::id_of_words(&[w[1], w[2], w[3]]),
        offset: w[4],
        data_size: w[5],
        metadata_size: w[6],
        time_us: w[7],
    }
}

/// [`RingHeader::lease_top`] of a lease the store closed.
pub const CLOSED: u64 = u64::MAX;

/// Client side: allocates `need` bytes at `at`, the top of its open lease.
/// False when the store closed the lease (it needed the room): nothing
/// more may be allocated in it.
pub fn bump(ring: &RingHeader, at: u64, need: u64) -> bool {
    ring.lease_top
        .compare_exchange(at, at + need, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}

/// Store side: the client's new lease starts at `start` (written before
/// the grant is answered).
pub fn open_lease(ring: &RingHeader, start: u64) {
    ring.lease_top.store(start, Ordering::Release);
}

/// Store side: closes the client's open lease; how far the client had
/// allocated in it (`None` when it was closed already). The client
/// allocates nothing past that any more, so the store may take the rest
/// back. The value comes from the client: check it lies in the lease.
pub fn close_lease(ring: &RingHeader) -> Option<u64> {
    Some(ring.lease_top.swap(CLOSED, Ordering::AcqRel)).filter(|&t| t != CLOSED)
}

/// Store side: records up to `tail` taken in.
pub fn taken(ring: &RingHeader, tail: u64) {
    ring.tail.store(tail, Ordering::Release);
}

/// Store side: clears the claim of `tag` on `bucket`, after taking in the
/// record it was for (or when its client is gone).
pub fn clear_claim(bucket: &AtomicU32, tag: u32) {
    let _ = bucket.compare_exchange(tag, 0, Ordering::SeqCst, Ordering::Relaxed);
}

#[cfg(all(test, not(ferroplasma_loom)))]
mod tests {
    use super::*;

    /// Ids that differ only in their last bytes (a counter after a common
    /// prefix, as many programs make them) spread over the buckets.
    #[test]
    fn ids_that_share_a_prefix_spread_over_the_buckets() {
        for at in [0, 8, 12, 16, 19] {
            let buckets: std::collections::HashSet<usize> = (0..1000u32)
                .map(|i| {
                    let mut id = [7u8; 20];
                    let b = i.to_le_bytes();
                    let n = (20 - at).min(4);
                    id[at..at + n].copy_from_slice(&b[..n]);
                    bucket_of(&ObjectId(id))
                })
                .collect();
            let want = if at == 19 { 250 } else { 980 };
            assert!(
                buckets.len() >= want,
                "counter at byte {at}: {} buckets",
                buckets.len()
            );
        }
    }
}
