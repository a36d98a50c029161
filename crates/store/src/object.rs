//! One entry of the object table and its public summary.

use ferroplasma_protocol::layout::metadata_offset;
use ferroplasma_protocol::ObjectId;

/// Which client a connection is; assigned by the store.
pub type ClientId = u64;

/// Where an object's bytes lie in the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// Arena index (0 while the store has one arena).
    pub arena: u32,
    /// Offset of the data; 64-byte aligned.
    pub offset: u64,
    /// Data bytes.
    pub data_size: u64,
    /// Metadata bytes, starting at `offset + align64(data_size)`.
    pub metadata_size: u64,
}

impl Location {
    /// Offset of the metadata in the arena.
    pub fn metadata_offset(&self) -> u64 {
        self.offset + metadata_offset(self.data_size)
    }
}

/// Lifecycle state of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectState {
    /// Allocated, writable by its creator only, invisible to `get`.
    Created {
        /// The client that may write, seal or abort it.
        creator: ClientId,
    },
    /// Immutable and visible to every client.
    Sealed,
}

/// An object in the table.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub location: Location,
    pub alloc_size: u64,
    pub state: ObjectState,
    /// References held, summed over clients.
    pub ref_count: u64,
    pub create_time_us: i64,
    pub seal_time_us: Option<i64>,
    /// Delete requested while referenced or unsealed.
    pub delete_pending: bool,
    /// Handed to the eviction policy (sealed and unreferenced).
    pub evictable: bool,
    /// Being written to the spill directory: its memory stays (readable,
    /// not evictable, not freed) until the write is done.
    pub spilling: bool,
    /// Being read back from the spill directory: its memory is allocated
    /// but not filled yet (not readable, evictable or freed until the read
    /// is done).
    pub restoring: bool,
}

impl Entry {
    pub fn is_sealed(&self) -> bool {
        self.state == ObjectState::Sealed
    }

    /// Whether a get may take it: sealed, in memory, not being deleted.
    pub fn is_readable(&self) -> bool {
        self.is_sealed() && !self.delete_pending && !self.restoring
    }
}

/// A row of `list`.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectInfo {
    /// The id.
    pub id: ObjectId,
    /// Where it lies.
    pub location: Location,
    /// References held, over all clients.
    pub ref_count: u64,
    /// Created or sealed.
    pub state: ObjectState,
    /// Unix time of the create, µs.
    pub create_time_us: i64,
    /// µs from create to seal, `None` while unsealed.
    pub construct_duration_us: Option<i64>,
    /// Delete requested, waiting for references to go.
    pub delete_pending: bool,
    /// Its bytes are in the spill directory (a get brings them back).
    pub spilled: bool,
}
