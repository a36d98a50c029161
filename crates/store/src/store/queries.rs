//! What the store reports without changing anything: the sealed objects
//! for a new subscriber, `list`, usage and `stats` (O(1) counters), and
//! the figures `stats` corrects with the holds of the shared table.

use super::Store;
use crate::events::{Event, EventKind};
use crate::object::{Location, ObjectInfo, ObjectState};
use crate::stats::{Stats, Usage};
use ferroplasma_protocol::ObjectId;
use std::collections::HashMap;

impl Store {
    /// A seal event for every sealed object (spilled ones included, not
    /// those being deleted), oldest seal first: what a new subscriber that
    /// asks for the objects already there is told.
    pub fn sealed_events(&self) -> Vec<Event> {
        let mut sealed: Vec<(i64, Event)> = self
            .list()
            .into_iter()
            .filter(|o| o.state == ObjectState::Sealed && !o.delete_pending)
            .map(|o| {
                let sealed_at = o.create_time_us + o.construct_duration_us.unwrap_or(0);
                let e = Event {
                    kind: EventKind::Sealed,
                    id: o.id,
                    data_size: o.location.data_size,
                    metadata_size: o.location.metadata_size,
                };
                (sealed_at, e)
            })
            .collect();
        sealed.sort_by_key(|(at, e)| (*at, e.id.0));
        sealed.into_iter().map(|(_, e)| e).collect()
    }

    /// Every object, sealed or not, spilled ones included.
    pub fn list(&self) -> Vec<ObjectInfo> {
        let spilled = self.spill.iter().flat_map(|t| t.objects.iter());
        let held: HashMap<ObjectId, u64> = self
            .readers
            .as_ref()
            .map(|r| r.held().into_iter().collect())
            .unwrap_or_default();
        self.objects
            .iter()
            .map(|e| row(e, held.get(&e.id).copied().unwrap_or(0)))
            .chain(spilled.map(|(id, s)| spilled_row(id, s)))
            .collect()
    }

    /// Capacity, bytes used and objects: what a cluster member tells its
    /// peers in every heartbeat. O(1), as [`Store::stats`] is.
    pub fn usage(&self) -> Usage {
        Usage {
            capacity: self.capacity,
            used: self.alloc.used() - self.reserved,
            objects: self.objects.len() as u64,
        }
    }

    /// Counters and memory figures, each kept as objects change: O(1).
    /// `referenced_objects` counts the references this store knows of; the
    /// objects held only through the readers' table are not in it (the
    /// daemon scans the clients' holds off its thread and adds them with
    /// [`Store::unreferenced_among`]).
    pub fn stats(&self) -> Stats {
        Stats {
            capacity: self.capacity,
            used: self.alloc.used() - self.reserved,
            objects: self.objects.len() as u64,
            sealed_objects: self.sealed_count,
            referenced_objects: self.referenced_count,
            clients: self.clients.len() as u64,
            evictions: self.evictions,
            evicted_bytes: self.evicted_bytes,
            largest_free_block: self.alloc.largest_free(),
            free_blocks: self.alloc.free_ranges() as u64,
            fragmentation: self.alloc.fragmentation(),
            evictable_bytes: self.evictable_bytes(),
            spilled_objects: self.spill.as_ref().map_or(0, |t| t.objects.len() as u64),
            spilled_bytes: self.spill.as_ref().map_or(0, |t| t.live_bytes()),
            spill_dir_bytes: self.spill.as_ref().map_or(0, |t| t.used),
            spill_segments: self.spill.as_ref().map_or(0, |t| t.segment_count() as u64),
            spills: self.spill.as_ref().map_or(0, |t| t.spilled_total),
            restores: self.spill.as_ref().map_or(0, |t| t.restored_total),
            awaited_objects: self.waiters.len() as u64,
        }
    }

    /// A count that grows whenever memory is freed or an object becomes
    /// evictable: a create refused for space can only succeed after it
    /// changed, so a caller that parked creates tries them again only then.
    pub fn room_made(&self) -> u64 {
        self.room_made
    }

    /// Bytes of `ids` counted as evictable (objects held through the
    /// readers' table only, when `ids` are the objects held there: they
    /// cannot be evicted while held, so `stats` takes them off): O(ids).
    pub fn evictable_bytes_among(&self, ids: &[ObjectId]) -> u64 {
        ids.iter()
            .filter_map(|id| self.objects.get(id).filter(|e| e.evictable()))
            .map(|e| e.alloc_size())
            .sum()
    }

    /// How many of `ids` are objects here that nobody holds a reference
    /// to (objects held through the readers' table only, when `ids` are
    /// the objects held there): O(ids).
    pub fn unreferenced_among(&self, ids: &[ObjectId]) -> u64 {
        ids.iter()
            .filter(|id| self.objects.get(id).is_some_and(|e| e.refs() == 0))
            .count() as u64
    }

    /// Arena bytes freed since the store started (only grows).
    pub fn freed_bytes(&self) -> u64 {
        self.alloc.freed()
    }

    /// Arena bytes allocated since the store started (only grows but for
    /// ranges taken and put back to give their pages back).
    pub fn allocated_bytes(&self) -> u64 {
        self.alloc.freed() + self.alloc.used()
    }

    /// The free ranges of the arena of at least `min` bytes, as (offset,
    /// size): no object lies there, so their pages may be given back.
    pub fn free_ranges_at_least(&self, min: u64) -> Vec<(u64, u64)> {
        self.alloc.free_ranges_at_least(min)
    }

    /// Arena bytes free now.
    pub fn free_bytes(&self) -> u64 {
        self.alloc.free()
    }

    /// Where the arena's touched memory ends: no object ever lay above it.
    pub fn touched_end(&self) -> u64 {
        self.alloc.touched_end()
    }

    /// Reserves a free range of the arena (no object is put there until
    /// [`Store::put_back_free`]), for its pages to be given back to the
    /// kernel meanwhile. False when it is not free.
    pub fn take_free(&mut self, offset: u64, size: u64) -> bool {
        self.alloc.take(offset, size)
    }

    /// Ends a [`Store::take_free`]: the range is free again.
    pub fn put_back_free(&mut self, offset: u64, size: u64) {
        self.alloc.put_back(offset, size);
    }
}

/// A row of `list` for an object in memory, `held` more times through the
/// readers' table.
pub(super) fn row(e: &crate::object::Entry, held: u64) -> ObjectInfo {
    ObjectInfo {
        id: e.id,
        location: e.location(),
        ref_count: e.refs() + held,
        state: e.state(),
        create_time_us: e.create_time_us(),
        construct_duration_us: e.seal_time_us().map(|s| s - e.create_time_us()),
        delete_pending: e.delete_pending(),
        spilled: false,
    }
}

/// A row of `list` for a spilled object.
pub(super) fn spilled_row(id: &ObjectId, s: &crate::spill::Spilled) -> ObjectInfo {
    ObjectInfo {
        id: *id,
        location: Location {
            arena: 0,
            offset: 0,
            data_size: s.data_size,
            metadata_size: s.metadata_size,
        },
        ref_count: 0,
        state: ObjectState::Sealed,
        create_time_us: s.create_time_us,
        construct_duration_us: s.construct_us,
        delete_pending: false,
        spilled: true,
    }
}
