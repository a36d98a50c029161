//! The memory of writes without a round trip, as the store holds it: the
//! area of claims, each client's ring, and the objects created through the
//! rings that are not sealed yet (the store's side of
//! `ferroplasma_protocol::fast_writes`; `fast_writes/mod.rs` takes the
//! records in).

use crate::arena::Arena;
use ferroplasma_protocol::fast_writes::{
    self as fw, Area, Record, RingHeader, AREA_BYTES, AREA_HEADER_BYTES, BUCKETS,
    RING_HEADER_BYTES, RING_RECORDS,
};
use ferroplasma_protocol::{IdHasher, ObjectId};
use ferroplasma_store::ClientId;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

/// The smallest store that offers writes without a round trip: a lease
/// (1 MiB) is then at most 1/32 of it.
pub const MIN_CAPACITY: u64 = 32 << 20;

/// The area and the rings.
#[derive(Debug)]
pub struct FastWrites {
    pub(super) arena: Arc<Arena>,
    pub(super) area_offset: u64,
    pub(super) rings: HashMap<ClientId, Ring, IdHasher>,
    pub(super) next_tag: u32,
    /// Where the store finds the tops of clients' open leases (shared with
    /// the store, `Store::set_lease_tops`).
    pub(super) tops: Arc<RingTops>,
    /// Objects created through a ring and not sealed yet, with their
    /// creator and its tag: their bucket stays claimed until the seal or
    /// abort is taken in, so no one else can take their id meanwhile, and
    /// they do not count as hidden.
    pub(super) unsealed: HashMap<ObjectId, (ClientId, u32), IdHasher>,
}

/// One client's ring, as the store keeps it.
#[derive(Debug)]
pub struct Ring {
    pub(super) offset: u64,
    pub(super) tag: u32,
    /// Records taken in.
    pub(super) tail: u64,
    /// Ids of this client's `CREATE` records the store turned down (taken
    /// already), until the client asks (`Settle`).
    pub(super) refused: HashSet<ObjectId, IdHasher>,
    /// The client broke the protocol: its records are no longer read.
    pub(super) broken: bool,
}

impl FastWrites {
    /// The area at `area_offset` of `arena` (zeroed here: the memory may
    /// have held an object before), and no rings yet.
    pub(crate) fn at(arena: Arc<Arena>, area_offset: u64) -> Self {
        arena.write(area_offset, &vec![0u8; AREA_BYTES]);
        Self {
            arena: arena.clone(),
            area_offset,
            rings: HashMap::default(),
            next_tag: 1,
            unsealed: HashMap::default(),
            tops: Arc::new(RingTops::new(arena.clone())),
        }
    }

    pub(super) fn area(&self) -> &Area {
        // Safety: `area_offset` was reserved in the store's allocator for
        // `AREA_BYTES` (64-byte aligned) inside the arena, which `self.arena`
        // keeps mapped; `Area` is a `repr(C)` block of atomics, valid for any
        // bytes, and every access to it is atomic.
        unsafe { &*(self.arena.ptr().add(self.area_offset as usize) as *const Area) }
    }

    pub(super) fn buckets(&self) -> &[AtomicU32] {
        // Safety: as for `area`: the claims follow the header inside the
        // reserved area, 4-byte aligned, and are only accessed atomically.
        unsafe {
            std::slice::from_raw_parts(
                self.arena
                    .ptr()
                    .add(self.area_offset as usize + AREA_HEADER_BYTES)
                    as *const AtomicU32,
                BUCKETS,
            )
        }
    }

    pub(super) fn ring_at(&self, offset: u64) -> (&RingHeader, &[Record]) {
        // Safety: each ring's `RING_BYTES` were reserved in the store's
        // allocator (64-byte aligned) inside the arena, which `self.arena`
        // keeps mapped; the header and records are `repr(C)` blocks of
        // atomics, valid for any bytes a client writes there.
        unsafe {
            let base = self.arena.ptr().add(offset as usize);
            (
                &*(base as *const RingHeader),
                std::slice::from_raw_parts(
                    base.add(RING_HEADER_BYTES) as *const Record,
                    RING_RECORDS,
                ),
            )
        }
    }
}

/// The store's way to the tops of clients' open leases
/// (`ferroplasma_store::LeaseTops`): each client's ring, where its client
/// publishes how far it allocated.
#[derive(Debug)]
pub struct RingTops {
    arena: Arc<Arena>,
    /// Each client's ring offset.
    rings: std::sync::Mutex<HashMap<ClientId, u64, IdHasher>>,
}

impl RingTops {
    pub(crate) fn new(arena: Arc<Arena>) -> Self {
        Self {
            arena,
            rings: Default::default(),
        }
    }

    fn rings(&self) -> std::sync::MutexGuard<'_, HashMap<ClientId, u64, IdHasher>> {
        self.rings.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `client`'s ring lies at `offset` (`None`: it has none any more).
    pub(crate) fn set(&self, client: ClientId, offset: Option<u64>) {
        match offset {
            Some(o) => self.rings().insert(client, o),
            None => self.rings().remove(&client),
        };
    }

    fn header(&self, offset: u64) -> &RingHeader {
        // Safety: as for `FastWrites::ring_at`: the ring's bytes were
        // reserved inside the arena, which `self.arena` keeps mapped, and
        // the header is a `repr(C)` block of atomics.
        unsafe { &*(self.arena.ptr().add(offset as usize) as *const RingHeader) }
    }

    /// `client`'s new lease starts at `start`.
    pub(crate) fn open(&self, client: ClientId, start: u64) {
        if let Some(&o) = self.rings().get(&client) {
            fw::open_lease(self.header(o), start);
        }
    }
}

impl ferroplasma_store::LeaseTops for RingTops {
    fn close(&self, client: ClientId) -> Option<u64> {
        let offset = *self.rings().get(&client)?;
        fw::close_lease(self.header(offset))
    }
}

/// Whether clients wrote records since the store last took them in,
/// looked at without the store's lock.
#[derive(Debug, Clone)]
pub struct DirtyProbe {
    pub(super) arena: Arc<Arena>,
    pub(super) area_offset: u64,
}

impl DirtyProbe {
    /// True when some ring has records the store has not taken in.
    pub fn dirty(&self) -> bool {
        // Safety: as for `FastWrites::area`: the area lies inside the arena,
        // which `self.arena` keeps mapped.
        let area = unsafe { &*(self.arena.ptr().add(self.area_offset as usize) as *const Area) };
        fw::is_dirty(area)
    }
}
