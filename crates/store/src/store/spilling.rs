//! Spilling and restoring, the state machine's side: which objects to
//! write out to make room ([`Store::spill_plan`]), the books while their
//! bytes are written ([`Store::begin_spill`], [`Store::finish_spill`],
//! [`Store::abort_spill`]) and read back ([`Store::begin_restore`],
//! [`Store::finish_restore`]), and spilled objects dropped. The daemon does
//! the file I/O (`ferroplasma_daemon::spill`).

use super::Store;
use crate::error::StoreError;
use crate::events::{Effects, Notice};
use crate::object::{Entry, Location};
use crate::spill::{SpillRef, Spilled};
use ferroplasma_protocol::layout::allocation_size;
use ferroplasma_protocol::ObjectId;

/// Most bytes spilled beyond what an allocation needs, per batch (the batch
/// is also at most an eighth of the store).
pub const SPILL_BATCH_MAX: u64 = 4 << 20;

/// An object to write out to make room: see [`Store::spill_plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpillVictim {
    /// The object.
    pub id: ObjectId,
    /// Where its allocation starts in the arena.
    pub offset: u64,
    /// Bytes of its allocation (data, padding, metadata).
    pub len: u64,
}

impl Store {
    /// Whether `id` is spilled (sealed, its bytes in the spill directory).
    pub fn is_spilled(&self, id: &ObjectId) -> bool {
        self.spill
            .as_ref()
            .is_some_and(|s| s.objects.contains_key(id))
    }

    /// Data and metadata sizes of a spilled object.
    pub fn spilled_sizes(&self, id: &ObjectId) -> Option<(u64, u64)> {
        let s = self.spill.as_ref()?.objects.get(id)?;
        Some((s.data_size, s.metadata_size))
    }

    /// The objects to spill so that an allocation for `data_size` and
    /// `metadata_size` fits: the least recently used evictable objects,
    /// oldest first, up to the one whose freeing makes the allocation
    /// succeed and on until an eighth of the store (at most
    /// [`SPILL_BATCH_MAX`]) is planned, so small objects leave in batches. Empty when it fits already, when spilling is off, or when even
    /// spilling every evictable object would not make it fit (the create
    /// then fails with [`StoreError::StoreFull`]).
    pub fn spill_plan(&self, data_size: u64, metadata_size: u64) -> Vec<SpillVictim> {
        let need = allocation_size(data_size, metadata_size);
        if self.spill.is_none()
            || need > self.alloc.capacity()
            || self.alloc.free() + self.evictable_bytes() < need
        {
            return Vec::new();
        }
        let mut sim = self.alloc.clone();
        if sim.allocate(need).is_some() {
            return Vec::new();
        }
        // Spill at least this much at a time, so that small objects go out
        // in batches (one segment file each) rather than one by one.
        let batch = (self.capacity / 8).min(SPILL_BATCH_MAX);
        let mut plan = Vec::new();
        let (mut planned, mut fits) = (0, false);
        for id in self.victims() {
            if fits && planned >= batch {
                break;
            }
            let Some(e) = self.objects.get(&id) else {
                continue;
            };
            sim.free_range(e.location().offset, e.alloc_size());
            planned += e.alloc_size();
            plan.push(SpillVictim {
                id,
                offset: e.location().offset,
                len: e.alloc_size(),
            });
            fits = fits || sim.allocate(need).is_some();
        }
        if fits {
            plan
        } else {
            Vec::new()
        }
    }

    /// Starts spilling the victims of a [`Store::spill_plan`]: reserves
    /// their room in the spill directory (`Err(StoreError::SpillFull)` past
    /// its limit) and pins them: until [`Store::finish_spill`] or
    /// [`Store::abort_spill`] they stay in memory, readable, but are not
    /// evicted, freed or planned again. Returns the segment to write.
    pub fn begin_spill(&mut self, victims: &[SpillVictim]) -> Result<u64, StoreError> {
        let bytes: u64 = victims.iter().map(|v| v.len).sum();
        let s = self.spill.as_mut().ok_or(StoreError::SpillFull {
            requested: bytes,
            used: 0,
            limit: 0,
        })?;
        let segment = s.reserve(bytes).ok_or(StoreError::SpillFull {
            requested: bytes,
            used: s.used + s.reserved,
            limit: s.limit,
        })?;
        for v in victims {
            if let Some(pos) = self.objects.position(&v.id) {
                self.objects.at_mut(pos).set_spilling(true);
                self.not_evictable(pos);
            }
        }
        Ok(segment)
    }

    /// The victims were written to `segment` (the i-th at `offsets[i]`):
    /// those still unreferenced leave memory for the spill directory; one
    /// referenced meanwhile stays in memory, one deleted meanwhile goes.
    /// `dead_segments` names the segment if none of them was left to spill.
    pub fn finish_spill(
        &mut self,
        segment: u64,
        victims: &[SpillVictim],
        offsets: &[u64],
    ) -> Effects {
        let mut fx = Effects::default();
        let bytes: u64 = victims.iter().map(|v| v.len).sum();
        let mut batch = Vec::with_capacity(victims.len());
        for (v, &off) in victims.iter().zip(offsets) {
            if !self.objects.contains_key(&v.id) {
                continue;
            }
            self.retire(v.id);
            let Some(e) = self.objects.get_mut(&v.id) else {
                continue;
            };
            e.set_spilling(false);
            if e.refs() > 0 {
                continue; // read meanwhile: stays in memory
            }
            if e.delete_pending() {
                self.remove_object(v.id, true, &mut fx);
                continue;
            }
            let e = self.objects.remove(&v.id).expect("present");
            self.sealed_count -= 1;
            self.alloc.free_range(e.location().offset, e.alloc_size());
            self.room_made += 1;
            batch.push((
                v.id,
                Spilled {
                    at: SpillRef {
                        segment,
                        offset: off,
                        len: e.alloc_size(),
                    },
                    data_size: e.data_size(),
                    metadata_size: e.location().metadata_size,
                    create_time_us: e.create_time_us(),
                    construct_us: e.seal_time_us().map(|t| t - e.create_time_us()),
                },
            ));
        }
        if let Some(s) = self.spill.as_mut() {
            if !s.add_segment(segment, bytes, batch) {
                fx.dead_segments.push(segment);
            }
        }
        fx
    }

    /// Writing the segment failed: the victims stay in memory (evictable
    /// again, or gone if deleted meanwhile) and its room is given back.
    pub fn abort_spill(&mut self, victims: &[SpillVictim]) -> Effects {
        let mut fx = Effects::default();
        if let Some(s) = self.spill.as_mut() {
            s.cancel(victims.iter().map(|v| v.len).sum());
        }
        for v in victims {
            let Some(e) = self.objects.get_mut(&v.id) else {
                continue;
            };
            e.set_spilling(false);
            if e.refs() == 0 {
                self.became_unreferenced(v.id, &mut fx);
            }
        }
        fx
    }

    /// Starts bringing a spilled object back: allocates its memory and
    /// enters it as *restoring*: counted as sealed (`contains` says yes),
    /// but not readable, evictable, spillable or freed until
    /// [`Store::finish_restore`]. The daemon copies the bytes from the
    /// returned `SpillRef` into the returned location meanwhile, and removes
    /// the effects' dead segments only after that read. Spill room first
    /// with [`Store::spill_plan`], or this may evict.
    pub fn begin_restore(
        &mut self,
        id: ObjectId,
    ) -> Result<(Location, SpillRef, Effects), StoreError> {
        let (data_size, metadata_size) = self
            .spilled_sizes(&id)
            .ok_or(StoreError::ObjectNotFound(id))?;
        let mut fx = Effects::default();
        let need = allocation_size(data_size, metadata_size);
        let offset = self.make_room(need, &mut fx)?;
        let (s, dead) = self
            .spill
            .as_mut()
            .and_then(|t| t.take(&id))
            .expect("checked above");
        fx.dead_segments.extend(dead);
        if let Some(t) = self.spill.as_mut() {
            t.restored_total += 1;
        }
        let location = Location {
            arena: 0,
            offset,
            data_size,
            metadata_size,
        };
        // Spilled objects were sealed: construct_us is always there.
        let sealed_at = s.create_time_us + s.construct_us.unwrap_or(0);
        let mut entry = Entry::sealed(id, location, s.create_time_us, sealed_at);
        entry.set_restoring(true);
        self.objects.insert(entry);
        self.sealed_count += 1;
        Ok((location, s.at, fx))
    }

    /// Whether `id` is being brought back from the spill directory.
    pub fn is_restoring(&self, id: &ObjectId) -> bool {
        self.objects.get(id).is_some_and(|e| e.restoring())
    }

    /// Ends a [`Store::begin_restore`]. When the bytes were read back
    /// (`read` true), every client waiting for `id` is handed a reference
    /// to it at once, with a [`Notice::Restored`] (the reference is theirs
    /// to release), so that no other restore can spill it again before they
    /// take it; with no waiter it becomes evictable. When they could not be
    /// read, or it was deleted meanwhile, it is dropped (its waiters go on
    /// waiting, as for any absent object, and are told with a
    /// [`Notice::Sealed`] so that gets that do not wait can answer).
    pub fn finish_restore(&mut self, id: ObjectId, read: bool) -> Effects {
        let mut fx = Effects::default();
        let Some(e) = self.objects.get_mut(&id).filter(|e| e.restoring()) else {
            return fx;
        };
        e.set_restoring(false);
        let keep = read && !e.delete_pending();
        let waiters = self.waiters.remove(&id).unwrap_or_default();
        if !keep {
            self.remove_object(id, true, &mut fx);
        }
        let mut granted = 0;
        for w in waiters {
            let Some(c) = self.clients.get_mut(&w) else {
                continue;
            };
            c.watching.remove(&id);
            if keep {
                *c.refs.entry(id).or_insert(0) += 1;
                granted += 1;
                fx.push(w, Notice::Restored(id));
            } else {
                fx.push(w, Notice::Sealed(id));
            }
        }
        if !keep {
            return fx;
        }
        if granted == 0 {
            self.became_unreferenced(id, &mut fx);
        } else {
            self.referenced_count += 1;
            if let Some(e) = self.objects.get_mut(&id) {
                e.set_refs(granted);
            }
        }
        fx
    }

    /// Brings a spilled object back in one step, for callers that read its
    /// bytes synchronously: [`Store::begin_restore`] then, once `read`
    /// copied them, [`Store::finish_restore`].
    pub fn restore(
        &mut self,
        id: ObjectId,
        read: impl FnOnce(Location, SpillRef) -> bool,
    ) -> Result<Effects, StoreError> {
        let (loc, at, mut fx) = self.begin_restore(id)?;
        let ok = read(loc, at);
        fx.extend(self.finish_restore(id, ok));
        Ok(fx)
    }

    /// Drops a spilled object whose bytes could not be read back.
    pub fn forget_spilled(&mut self, id: ObjectId) -> Effects {
        let mut fx = Effects::default();
        if let Some((_, dead)) = self.spill.as_mut().and_then(|t| t.take(&id)) {
            fx.dead_segments.extend(dead);
            self.publish_deleted(id, &mut fx);
        }
        fx
    }

    /// Drops every spilled object at once: their segment files are gone
    /// (the spill directory was removed under the store). Subscribers hear
    /// each as deleted; returns how many there were and their bytes.
    pub fn forget_all_spilled(&mut self) -> (u64, u64, Effects) {
        let mut fx = Effects::default();
        let Some(t) = self.spill.as_mut() else {
            return (0, 0, fx);
        };
        let ids: Vec<ObjectId> = t.objects.keys().copied().collect();
        let mut bytes = 0;
        for id in &ids {
            if let Some((s, _file_gone_already)) = t.take(id) {
                bytes += s.data_size + s.metadata_size;
            }
        }
        for id in &ids {
            self.publish_deleted(*id, &mut fx);
        }
        (ids.len() as u64, bytes, fx)
    }
}
