//! One entry of the object table and its public summary.

use crate::dense::{Keyed, Links};
use ferroplasma_protocol::layout::{allocation_size, metadata_offset};
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

/// The most metadata bytes an object may have: 2^27 − 1 (128 MiB). The
/// entry keeps the metadata size in 27 bits of a word whose other 5 hold
/// its flags; a create asking for more is refused
/// ([`StoreError::MetadataTooLarge`](crate::StoreError::MetadataTooLarge)).
pub const MAX_METADATA: u64 = (1 << 27) - 1;

/// The most references an object may have at once: 2^32 − 1. A get past it
/// waits until some are released, holds a client claims past it are not
/// adopted, so the count is always exact.
pub const MAX_REFS: u64 = u32::MAX as u64;

/// An object in the table: 68 bytes (issue 38 asks for at most 150 per
/// object in all; the index adds about 8.4 bytes, see [`crate::dense`]).
/// What `Location`, the allocation's size and the [`ObjectState`] say is
/// kept once and computed from: 20 B id, 8 B links of the eviction order,
/// 8 B each for offset and data size, 4 B for the metadata size (27 bits)
/// and five flags, 4 B of references, 8 B of create time, and 8 B that hold
/// the creator while it is unsealed and the seal time after (the `SEALED`
/// flag says which). Packed to 4-byte alignment: no padding.
#[derive(Clone, Copy)]
#[repr(C, packed(4))]
pub(crate) struct Entry {
    pub id: ObjectId,
    /// Its place in the table's list (the built-in eviction order).
    links: Links,
    /// Offset of the data in the arena; 64-byte aligned.
    offset: u64,
    data_size: u64,
    /// Metadata bytes (low 27 bits) and the flags (`F_*`, high 5 bits).
    meta_flags: u32,
    /// References held, summed over clients ([`MAX_REFS`] at most).
    refs: u32,
    create_time_us: i64,
    /// While unsealed, the client that created it (the one that may write,
    /// seal or abort it); once sealed, when, µs.
    creator_or_sealed: i64,
}

/// Sealed: `creator_or_sealed` is the seal time.
const F_SEALED: u32 = 1 << 27;
/// Delete requested while referenced or unsealed.
const F_DELETE_PENDING: u32 = 1 << 28;
/// Sealed and unreferenced: in the eviction order (the table's list with
/// the built-in order, the policy's otherwise).
const F_EVICTABLE: u32 = 1 << 29;
/// Being written to the spill directory: its memory stays (readable, not
/// evictable, not freed) until the write is done.
const F_SPILLING: u32 = 1 << 30;
/// Being read back from the spill directory: its memory is allocated but
/// not filled yet (not readable, evictable or freed until the read is done).
const F_RESTORING: u32 = 1 << 31;

const _: () = assert!(std::mem::size_of::<Entry>() == 68);

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let id = self.id;
        f.debug_struct("Entry")
            .field("id", &id)
            .field("location", &self.location())
            .field("state", &self.state())
            .field("refs", &self.refs())
            .field("delete_pending", &self.delete_pending())
            .field("evictable", &self.evictable())
            .field("spilling", &self.spilling())
            .field("restoring", &self.restoring())
            .finish()
    }
}

impl Entry {
    /// A new object at `location`, unsealed, referenced once by its creator.
    /// Its metadata size must be at most [`MAX_METADATA`] (the store checks
    /// before it allocates).
    pub fn created(id: ObjectId, location: Location, creator: ClientId, now_us: i64) -> Self {
        debug_assert!(location.metadata_size <= MAX_METADATA);
        Self {
            id,
            links: Links::OUT,
            offset: location.offset,
            data_size: location.data_size,
            meta_flags: location.metadata_size.min(MAX_METADATA) as u32,
            refs: 1,
            create_time_us: now_us,
            creator_or_sealed: creator as i64,
        }
    }

    /// A sealed object at `location`, unreferenced.
    pub fn sealed(
        id: ObjectId,
        location: Location,
        create_time_us: i64,
        seal_time_us: i64,
    ) -> Self {
        let mut e = Self::created(id, location, 0, create_time_us);
        e.refs = 0;
        e.seal(seal_time_us);
        e
    }

    /// Marks it sealed at `now_us`.
    pub fn seal(&mut self, now_us: i64) {
        self.creator_or_sealed = now_us;
        self.meta_flags |= F_SEALED;
    }

    pub fn location(&self) -> Location {
        Location {
            arena: 0,
            offset: self.offset,
            data_size: self.data_size,
            metadata_size: u64::from(self.meta_flags) & MAX_METADATA,
        }
    }

    pub fn data_size(&self) -> u64 {
        self.data_size
    }

    /// Data and metadata bytes (without the padding between them).
    pub fn bytes(&self) -> u64 {
        let l = self.location();
        l.data_size + l.metadata_size
    }

    /// Bytes of its allocation (data, padding, metadata).
    pub fn alloc_size(&self) -> u64 {
        let l = self.location();
        allocation_size(l.data_size, l.metadata_size)
    }

    pub fn state(&self) -> ObjectState {
        if self.is_sealed() {
            ObjectState::Sealed
        } else {
            ObjectState::Created {
                creator: self.creator_or_sealed as ClientId,
            }
        }
    }

    pub fn create_time_us(&self) -> i64 {
        self.create_time_us
    }

    /// When it was sealed; `None` while unsealed.
    pub fn seal_time_us(&self) -> Option<i64> {
        self.is_sealed().then_some(self.creator_or_sealed)
    }

    pub fn is_sealed(&self) -> bool {
        self.flag(F_SEALED)
    }

    /// Whether a get may take it: sealed, in memory, not being deleted.
    pub fn is_readable(&self) -> bool {
        self.is_sealed() && !self.delete_pending() && !self.restoring()
    }

    /// References held, summed over clients.
    pub fn refs(&self) -> u64 {
        u64::from(self.refs)
    }

    /// Up to `n` more references, as many as fit under [`MAX_REFS`]: how
    /// many were added.
    pub fn add_refs(&mut self, n: u64) -> u64 {
        let added = n.min(MAX_REFS - u64::from(self.refs));
        self.refs += added as u32;
        added
    }

    /// `n` references fewer (stops at 0).
    pub fn drop_refs(&mut self, n: u64) {
        self.refs = u64::from(self.refs).saturating_sub(n) as u32;
    }

    /// Sets the count outright (the references granted to a restore's
    /// waiters, far fewer than [`MAX_REFS`]).
    pub fn set_refs(&mut self, n: u64) {
        self.refs = n.min(MAX_REFS) as u32;
    }

    pub fn delete_pending(&self) -> bool {
        self.flag(F_DELETE_PENDING)
    }

    pub fn set_delete_pending(&mut self, on: bool) {
        self.set_flag(F_DELETE_PENDING, on);
    }

    pub fn evictable(&self) -> bool {
        self.flag(F_EVICTABLE)
    }

    pub fn set_evictable(&mut self, on: bool) {
        self.set_flag(F_EVICTABLE, on);
    }

    /// Clears the evictable flag; whether it was set.
    pub fn take_evictable(&mut self) -> bool {
        let was = self.evictable();
        self.set_evictable(false);
        was
    }

    pub fn spilling(&self) -> bool {
        self.flag(F_SPILLING)
    }

    pub fn set_spilling(&mut self, on: bool) {
        self.set_flag(F_SPILLING, on);
    }

    pub fn restoring(&self) -> bool {
        self.flag(F_RESTORING)
    }

    pub fn set_restoring(&mut self, on: bool) {
        self.set_flag(F_RESTORING, on);
    }

    fn flag(&self, f: u32) -> bool {
        self.meta_flags & f != 0
    }

    fn set_flag(&mut self, f: u32, on: bool) {
        if on {
            self.meta_flags |= f;
        } else {
            self.meta_flags &= !f;
        }
    }
}

impl Keyed for Entry {
    fn id(&self) -> &ObjectId {
        &self.id
    }

    fn links(&self) -> Links {
        self.links
    }

    fn links_mut(&mut self) -> &mut Links {
        &mut self.links
    }

    fn weight(&self) -> u64 {
        self.alloc_size()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(metadata_size: u64) -> Entry {
        let loc = Location {
            arena: 0,
            offset: 1 << 40,
            data_size: (1 << 50) + 3,
            metadata_size,
        };
        Entry::created(ObjectId([7; 20]), loc, u64::MAX - 1, -5)
    }

    #[test]
    fn flags_sizes_and_the_creator_or_seal_word_keep_to_their_bits() {
        let mut e = entry(MAX_METADATA);
        assert_eq!(
            e.state(),
            ObjectState::Created {
                creator: u64::MAX - 1
            }
        );
        assert_eq!(e.seal_time_us(), None);
        let setters: [fn(&mut Entry, bool); 4] = [
            Entry::set_delete_pending,
            Entry::set_evictable,
            Entry::set_spilling,
            Entry::set_restoring,
        ];
        let getters: [fn(&Entry) -> bool; 4] = [
            Entry::delete_pending,
            Entry::evictable,
            Entry::spilling,
            Entry::restoring,
        ];
        for (k, set) in setters.iter().enumerate() {
            set(&mut e, true);
            for (j, get) in getters.iter().enumerate() {
                assert_eq!(get(&e), j == k, "flag {j} after setting flag {k}");
            }
            assert_eq!(e.location().metadata_size, MAX_METADATA);
            assert!(!e.is_sealed());
            set(&mut e, false);
        }
        e.seal(i64::MIN);
        assert_eq!(e.seal_time_us(), Some(i64::MIN), "any time, even the least");
        assert_eq!(e.state(), ObjectState::Sealed);
        assert_eq!(e.create_time_us(), -5);
        assert_eq!(e.location().offset, 1 << 40);
        assert_eq!(e.data_size(), (1 << 50) + 3);
        assert!(getters.iter().all(|g| !g(&e)));
        let mut small = entry(0);
        small.set_evictable(true);
        assert_eq!(small.location().metadata_size, 0);
        assert!(small.take_evictable() && !small.evictable());
    }

    #[test]
    fn references_are_counted_exactly_up_to_the_most_an_object_may_have() {
        let mut e = entry(0);
        assert_eq!(e.refs(), 1);
        e.drop_refs(1);
        e.drop_refs(1);
        assert_eq!(e.refs(), 0, "no count under zero");
        assert_eq!(e.add_refs(MAX_REFS - 2), MAX_REFS - 2);
        e.drop_refs(1);
        assert_eq!(e.refs(), MAX_REFS - 3, "still counted exactly");
        assert_eq!(e.add_refs(1 << 20), 3, "only as many as fit");
        assert_eq!(e.refs(), MAX_REFS);
        assert_eq!(e.add_refs(1), 0);
        e.drop_refs(1);
        assert_eq!(
            e.refs(),
            MAX_REFS - 1,
            "a full count goes down as any other"
        );
        assert_eq!(e.add_refs(5), 1);
        e.set_refs(u64::MAX);
        assert_eq!(e.refs(), MAX_REFS);
    }
}
