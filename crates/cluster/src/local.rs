//! What the cluster needs of the local store, and how it gets it: the
//! [`LocalStore`] trait, which the daemon implements for its shared state
//! (and this crate's tests over a plain `ferroplasma_store::Store`).
//!
//! Each method takes the store's lock for all the ids it is given at once
//! (releasing it only to wait for room or for a restore), and an
//! implementation delivers the effects of what it changes (notices
//! to clients, spill segments to remove, the cluster's own notices) before
//! it returns. The cluster hears of seals, deletions and aborted creates
//! through the receiver handed to `Cluster::start`; the store client those
//! come from (the one that creates, holds and seals what the cluster
//! lands and serves) is the implementation's own.

use ferroplasma_protocol::{IdHasher, ObjectId};
use ferroplasma_store::{DeleteOutcome, Location, ObjectInfo, StoreError, Usage};
use std::collections::HashSet;
use std::sync::Arc;

/// The memory objects lie in (the daemon's arena).
pub trait Memory: Send + Sync + std::fmt::Debug {
    /// The `len` bytes at `offset`. The caller makes sure nothing writes
    /// them meanwhile (the object is sealed and held, or read under the
    /// store's lock).
    fn bytes(&self, offset: u64, len: u64) -> &[u8];

    /// The `len` bytes at `offset`, to write.
    ///
    /// # Safety
    ///
    /// Nothing else reads or writes them while the returned slice lives: an
    /// unsealed allocation of the cluster's own store client, that nothing
    /// frees meanwhile.
    #[allow(clippy::mut_from_ref)]
    unsafe fn region_mut(&self, offset: u64, len: u64) -> &mut [u8];
}

/// One object to allocate for a pull: its data comes later.
#[derive(Debug, Clone, Copy)]
pub struct NewObject<'a> {
    /// Its id.
    pub id: ObjectId,
    /// Data bytes to come.
    pub data_size: u64,
    /// Its metadata, written in at once.
    pub metadata: &'a [u8],
}

/// One object received whole, to create sealed with its bytes.
#[derive(Debug, Clone, Copy)]
pub struct Received<'a> {
    /// Its id.
    pub id: ObjectId,
    /// Its metadata.
    pub metadata: &'a [u8],
    /// Its data.
    pub data: &'a [u8],
}

/// Which objects [`LocalStore::pin`] copies out instead of holding.
#[derive(Debug, Clone, Copy)]
pub struct CopyOut {
    /// Objects (data and metadata) at most this large are copied.
    pub at_most: u64,
    /// Most bytes copied in one call (it holds the store's lock meanwhile).
    pub budget: u64,
}

/// One pinned object: where its bytes lie.
#[derive(Debug, Clone, Copy)]
pub struct PinnedObject {
    /// Whether its bytes were copied into [`Pinned::copies`] (the offsets
    /// are then into that buffer) instead of being held in memory.
    pub copied: bool,
    /// Data offset.
    pub offset: u64,
    /// Data size.
    pub data_size: u64,
    /// Metadata offset.
    pub metadata_offset: u64,
    /// Metadata size.
    pub metadata_size: u64,
}

/// Local sealed objects held (referenced) while they are sent, or copied
/// out (small ones: a copy costs less than a reference taken and given
/// back); dropping it gives the references back, all at once.
pub struct Pinned {
    /// The memory the held ones lie in.
    pub memory: Arc<dyn Memory>,
    /// One per id asked for, in order, up to where pinning stopped; `None`
    /// for an object that is not here.
    pub objects: Vec<Option<PinnedObject>>,
    /// The bytes (metadata, then data) of the copied ones.
    pub copies: Vec<u8>,
    /// Gives the references back.
    pub unpin: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl Pinned {
    /// The data of `o`, one of `self.objects`.
    pub fn data(&self, o: &PinnedObject) -> &[u8] {
        self.bytes(o.copied, o.offset, o.data_size)
    }

    /// The metadata of `o`, one of `self.objects`.
    pub fn metadata(&self, o: &PinnedObject) -> &[u8] {
        self.bytes(o.copied, o.metadata_offset, o.metadata_size)
    }

    fn bytes(&self, copied: bool, offset: u64, len: u64) -> &[u8] {
        if copied {
            &self.copies[offset as usize..(offset + len) as usize]
        } else {
            self.memory.bytes(offset, len)
        }
    }
}

impl std::fmt::Debug for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pinned")
            .field("objects", &self.objects)
            .finish_non_exhaustive()
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Some(f) = self.unpin.take() {
            f();
        }
    }
}

/// The local store, as the cluster uses it.
pub trait LocalStore: Send + Sync + std::fmt::Debug {
    /// The memory objects lie in.
    fn memory(&self) -> Arc<dyn Memory>;

    /// Capacity, bytes used and objects (O(1): sent in every heartbeat).
    fn usage(&self) -> Usage;

    /// Whether each id is in the store (sealed or not).
    fn exists(&self, ids: &[ObjectId]) -> Vec<bool>;

    /// Whether each id is sealed here (spilled counts).
    fn contains(&self, ids: &[ObjectId]) -> Vec<bool>;

    /// When each id was sealed here (µs since the epoch), if it is.
    fn sealed_at(&self, ids: &[ObjectId]) -> Vec<Option<i64>>;

    /// Every local object. With `claims`: under the same lock, drops from
    /// it the ids now in the store (a create that lands meanwhile is either
    /// listed or still claimed).
    fn list(&self, claims: Option<&mut HashSet<ObjectId, IdHasher>>) -> Vec<ObjectInfo>;

    /// Deletes each id (deferred while referenced); with `sealed_before`
    /// (µs since the epoch), only the copies sealed before then (a newer one
    /// is another object: `NotFound`).
    fn delete(&self, ids: &[ObjectId], sealed_before: Option<i64>) -> Vec<DeleteOutcome>;

    /// A claim of `id` was taken back: unless it is in the store now, the
    /// cluster hears of it as of an aborted create.
    fn give_up_claim(&self, id: ObjectId);

    /// The notices the store queued for the cluster that it has not
    /// reported as sent ([`LocalStore::updates_sent`]).
    fn updates_pending(&self) -> usize;

    /// Whether a notice about `id` is queued for the cluster and not sent.
    fn is_update_pending(&self, id: &ObjectId) -> bool;

    /// The cluster sent the updates of one notice about each of `ids`.
    fn updates_sent(&self, ids: &[ObjectId]);

    /// Allocates `objects` unsealed, their metadata written in, held by the
    /// cluster's store client; makes room (spills, waits for spills under
    /// way) as needed. `ObjectExists` for an id here already.
    fn allocate(&self, objects: &[NewObject<'_>]) -> Vec<Result<Location, StoreError>>;

    /// Lands one frame of a pull: creates `received` sealed with their
    /// bytes (making room as [`LocalStore::allocate`] does), and seals and
    /// lets go of `allocated` (from [`LocalStore::allocate`], their data
    /// written). Before the seals are delivered, `landed` is told the ids
    /// sealed. Returns what became of each of `received`, and whether each
    /// of `allocated` was sealed.
    fn land(
        &self,
        received: &[Received<'_>],
        allocated: &[ObjectId],
        landed: &mut dyn FnMut(&[ObjectId]),
    ) -> (Vec<Result<(), StoreError>>, Vec<bool>);

    /// Aborts allocations of [`LocalStore::allocate`] whose data did not come.
    fn abort(&self, ids: &[ObjectId]);

    /// Pins sealed objects for sending, in the order of `ids` (bringing
    /// spilled ones back first), and stops after the first object that
    /// brings the data pinned to `max_bytes` or more. Small ones are copied
    /// out, as `copy` says.
    fn pin(&self, ids: &[ObjectId], max_bytes: u64, copy: CopyOut) -> Pinned;

    /// Whether pinning any of `ids` has to read it back from disk first.
    fn is_spilled(&self, ids: &[ObjectId]) -> bool;
}
