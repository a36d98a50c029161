//! The store's state machine: objects, clients, references, eviction, waiters
//! and subscribers. It does no I/O: every operation takes its inputs (time
//! included) as arguments and returns what the daemon must tell whom as
//! [`Effects`].

use crate::allocator::Allocator;
use crate::clients::ClientState;
use crate::error::StoreError;
use crate::events::{Effects, Event, EventKind, Notice};
use crate::lru::Lru;
use crate::object::{ClientId, Entry, Location, ObjectInfo, ObjectState};
use crate::policy::EvictionPolicy;
use crate::spill::{SpillRef, SpillTable, Spilled};
use crate::stats::{Stats, Usage};
use ferroplasma_protocol::layout::allocation_size;
use ferroplasma_protocol::IdHasher;
use ferroplasma_protocol::ObjectId;
use std::collections::{BTreeSet, HashMap};

/// Most bytes spilled beyond what an allocation needs, per batch (the batch
/// is also at most an eighth of the store).
pub const SPILL_BATCH_MAX: u64 = 4 << 20;

/// Outcome of a `delete` for one id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// Freed now.
    Deleted,
    /// Referenced or unsealed: freed when the last reference goes.
    Deferred,
    /// No such object.
    NotFound,
}

/// The object table of one store.
#[derive(Debug)]
pub struct Store {
    /// The capacity asked for, reported as is.
    capacity: u64,
    alloc: Allocator,
    objects: HashMap<ObjectId, Entry, IdHasher>,
    clients: HashMap<ClientId, ClientState, IdHasher>,
    next_client: ClientId,
    /// Which evictable objects go first (mechanism here, policy there).
    policy: Box<dyn EvictionPolicy>,
    waiters: HashMap<ObjectId, Vec<ClientId>, IdHasher>,
    subscribers: BTreeSet<ClientId>,
    evictions: u64,
    evicted_bytes: u64,
    /// Objects in memory that are sealed, and that someone references:
    /// counted as they change, so that `stats` costs O(1).
    sealed_count: u64,
    referenced_count: u64,
    /// Times memory was freed or an object became evictable: room may have
    /// come for a create that found none (see [`Store::room_made`]).
    room_made: u64,
    /// Spilled objects, when a spill directory is configured.
    spill: Option<SpillTable>,
    /// Readers that take references without asking (the shared table).
    readers: Option<std::sync::Arc<dyn crate::Readers>>,
}

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
    /// A store managing `capacity` bytes of one arena. The arena must hold
    /// at least `capacity` rounded up to 64 bytes (arenas are page-rounded),
    /// so that an object of exactly `capacity` bytes fits.
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity,
            alloc: Allocator::new(ferroplasma_protocol::layout::align_up(capacity)),
            objects: HashMap::default(),
            clients: HashMap::default(),
            next_client: 1,
            policy: Box::new(Lru::default()),
            waiters: HashMap::default(),
            subscribers: BTreeSet::new(),
            evictions: 0,
            evicted_bytes: 0,
            sealed_count: 0,
            referenced_count: 0,
            room_made: 0,
            spill: None,
            readers: None,
        }
    }

    /// A store that chooses what to evict with `policy` instead of
    /// [`Lru`].
    pub fn with_policy(capacity: u64, policy: Box<dyn EvictionPolicy>) -> Self {
        Self {
            policy,
            ..Self::new(capacity)
        }
    }

    /// A store that spills instead of evicting, into a directory that may
    /// hold `spill_limit` bytes (see [`Store::spill_plan`]).
    pub fn with_spill(capacity: u64, spill_limit: u64) -> Self {
        let mut s = Self::new(capacity);
        s.spill = Some(SpillTable::new(spill_limit));
        s
    }

    /// Whether spilling is on.
    /// Publishes readable objects to `readers` (the daemon's shared object
    /// table) from now on, and asks them before an object stops being
    /// readable.
    pub fn set_readers(&mut self, readers: std::sync::Arc<dyn crate::Readers>) {
        self.readers = Some(readers);
    }

    pub fn spills(&self) -> bool {
        self.spill.is_some()
    }

    /// Usable bytes, as configured.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Registers a new client connection.
    pub fn connect(&mut self) -> ClientId {
        let id = self.next_client;
        self.next_client += 1;
        self.clients.insert(id, ClientState::default());
        id
    }

    /// Forgets a client: aborts what it was creating, drops its references,
    /// its waits and its subscription.
    pub fn disconnect(&mut self, client: ClientId) -> Effects {
        let mut fx = Effects::default();
        let Some(mut state) = self.clients.remove(&client) else {
            return fx;
        };
        for id in &state.watching {
            self.drop_waiter(*id, client);
        }
        self.subscribers.remove(&client);
        for id in state.created {
            if let Some(e) = self.objects.get(&id) {
                if e.state == (ObjectState::Created { creator: client }) {
                    state.refs.remove(&id);
                    self.remove_object(id, false, &mut fx);
                }
            }
        }
        for (id, n) in state.refs {
            for _ in 0..n {
                self.drop_ref(id, &mut fx);
            }
        }
        fx
    }

    /// Allocates an unsealed object for `client`, evicting least recently
    /// used objects if needed. The creator holds one reference.
    pub fn create(
        &mut self,
        client: ClientId,
        id: ObjectId,
        data_size: u64,
        metadata_size: u64,
        now_us: i64,
    ) -> Result<(Location, Effects), StoreError> {
        let (location, need, fx) = self.allocate(id, data_size, metadata_size)?;
        self.objects.insert(
            id,
            Entry {
                location,
                alloc_size: need,
                state: ObjectState::Created { creator: client },
                ref_count: 1,
                create_time_us: now_us,
                seal_time_us: None,
                delete_pending: false,
                evictable: false,
                spilling: false,
                restoring: false,
            },
        );
        self.referenced_count += 1;
        let c = self.clients.entry(client).or_default();
        c.created.insert(id);
        *c.refs.entry(id).or_insert(0) += 1;
        Ok((location, fx))
    }

    /// Room for a new object `id` (which must not exist yet): its location,
    /// its allocation's size, and the effects of the evictions that made
    /// the room.
    fn allocate(
        &mut self,
        id: ObjectId,
        data_size: u64,
        metadata_size: u64,
    ) -> Result<(Location, u64, Effects), StoreError> {
        if self.exists(&id) {
            return Err(StoreError::ObjectExists(id));
        }
        let mut fx = Effects::default();
        let need = allocation_size(data_size, metadata_size);
        if data_size.saturating_add(metadata_size) > self.capacity {
            return Err(StoreError::StoreFull {
                requested: data_size.saturating_add(metadata_size),
                free: self.alloc.free(),
                evictable: self.policy.bytes(),
                capacity: self.capacity,
            });
        }
        let offset = self.make_room(need, &mut fx)?;
        let location = Location {
            arena: 0,
            offset,
            data_size,
            metadata_size,
        };
        Ok((location, need, fx))
    }

    /// Creates `id` sealed and unreferenced in one step, for bytes that are
    /// already at hand (a copy pulled from another member): `write` puts
    /// them at the new location before the object becomes visible (before
    /// its waiters hear of it and before readers may take it). The same as
    /// a [`Store::create`], [`Store::seal`] and [`Store::release`] by one
    /// client, without that client's bookkeeping in between.
    pub fn create_sealed(
        &mut self,
        id: ObjectId,
        data_size: u64,
        metadata_size: u64,
        now_us: i64,
        write: impl FnOnce(&Location),
    ) -> Result<Effects, StoreError> {
        let (location, need, mut fx) = self.allocate(id, data_size, metadata_size)?;
        write(&location);
        self.objects.insert(
            id,
            Entry {
                location,
                alloc_size: need,
                state: ObjectState::Sealed,
                ref_count: 0,
                create_time_us: now_us,
                seal_time_us: Some(now_us),
                delete_pending: false,
                evictable: false,
                spilling: false,
                restoring: false,
            },
        );
        self.sealed_count += 1;
        self.made_visible(id, location, 0, &mut fx);
        Ok(fx)
    }

    /// Makes an object immutable and visible; wakes its waiters.
    pub fn seal(
        &mut self,
        client: ClientId,
        id: ObjectId,
        now_us: i64,
    ) -> Result<Effects, StoreError> {
        let e = self.creator_entry(client, id)?;
        e.state = ObjectState::Sealed;
        e.seal_time_us = Some(now_us);
        let (loc, refs) = (e.location, e.ref_count);
        self.sealed_count += 1;
        if let Some(c) = self.clients.get_mut(&client) {
            c.created.remove(&id);
        }
        let mut fx = Effects::default();
        self.made_visible(id, loc, refs, &mut fx);
        Ok(fx)
    }

    /// A sealed object (`refs` references) just became visible: its waiters
    /// and subscribers hear of it, and readers may take it.
    fn made_visible(&mut self, id: ObjectId, loc: Location, refs: u64, fx: &mut Effects) {
        for w in self.waiters.remove(&id).unwrap_or_default() {
            if let Some(c) = self.clients.get_mut(&w) {
                c.watching.remove(&id);
            }
            fx.push(w, Notice::Sealed(id));
        }
        self.publish(
            Event {
                kind: EventKind::Sealed,
                id,
                data_size: loc.data_size,
                metadata_size: loc.metadata_size,
            },
            fx,
        );
        if refs == 0 {
            self.became_unreferenced(id, fx);
        }
        if let Some(r) = &self.readers {
            if self.objects.get(&id).is_some_and(|e| e.is_readable()) {
                r.readable(id, loc);
            }
        }
    }

    /// Discards an unsealed object of `client`'s.
    pub fn abort(&mut self, client: ClientId, id: ObjectId) -> Result<Effects, StoreError> {
        self.creator_entry(client, id)?;
        let mut fx = Effects::default();
        if let Some(c) = self.clients.get_mut(&client) {
            c.created.remove(&id);
            c.refs.remove(&id);
        }
        self.remove_object(id, false, &mut fx);
        Ok(fx)
    }

    /// Takes a reference on a sealed object; `None` if absent or unsealed.
    pub fn get(&mut self, client: ClientId, id: ObjectId) -> Option<Location> {
        let e = self.objects.get_mut(&id)?;
        if !e.is_readable() {
            return None;
        }
        if std::mem::take(&mut e.evictable) {
            self.policy.remove(&id);
        }
        if e.ref_count == 0 {
            self.referenced_count += 1;
        }
        e.ref_count += 1;
        let loc = e.location;
        if let Some(r) = &self.readers {
            r.readable(id, loc);
        }
        *self
            .clients
            .entry(client)
            .or_default()
            .refs
            .entry(id)
            .or_insert(0) += 1;
        Some(loc)
    }

    /// [`Store::get`] for many ids at once (one client lookup for the batch).
    pub fn get_many(&mut self, client: ClientId, ids: &[ObjectId]) -> Vec<Option<Location>> {
        let refs = &mut self.clients.entry(client).or_default().refs;
        ids.iter()
            .map(|id| {
                let e = self.objects.get_mut(id)?;
                if !e.is_readable() {
                    return None;
                }
                if std::mem::take(&mut e.evictable) {
                    self.policy.remove(id);
                }
                if e.ref_count == 0 {
                    self.referenced_count += 1;
                }
                e.ref_count += 1;
                *refs.entry(*id).or_insert(0) += 1;
                if let Some(r) = &self.readers {
                    r.readable(*id, e.location);
                }
                Some(e.location)
            })
            .collect()
    }

    /// Asks to be told (a [`Notice::Sealed`]) when `id` is sealed.
    pub fn watch(&mut self, client: ClientId, id: ObjectId) {
        let c = self.clients.entry(client).or_default();
        if c.watching.insert(id) {
            self.waiters.entry(id).or_default().push(client);
        }
    }

    /// Tells every client watching `id` to look again (a
    /// [`Notice::Sealed`]), and forgets their watches: for a spilled object
    /// that cannot be brought back, so that they learn why.
    pub fn wake_waiters(&mut self, id: ObjectId) -> Effects {
        let mut fx = Effects::default();
        for w in self.waiters.remove(&id).unwrap_or_default() {
            if let Some(c) = self.clients.get_mut(&w) {
                c.watching.remove(&id);
            }
            fx.push(w, Notice::Sealed(id));
        }
        fx
    }

    /// Withdraws a [`Store::watch`].
    pub fn unwatch(&mut self, client: ClientId, id: ObjectId) {
        if let Some(c) = self.clients.get_mut(&client) {
            if c.watching.remove(&id) {
                self.drop_waiter(id, client);
            }
        }
    }

    /// Drops one of `client`'s references to `id`.
    pub fn release(&mut self, client: ClientId, id: ObjectId) -> Result<Effects, StoreError> {
        let c = self
            .clients
            .get_mut(&client)
            .ok_or(StoreError::NotHeld(id))?;
        match c.refs.get_mut(&id) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                c.refs.remove(&id);
            }
            None => return Err(StoreError::NotHeld(id)),
        }
        let mut fx = Effects::default();
        self.drop_ref(id, &mut fx);
        Ok(fx)
    }

    /// Whether `id` is sealed here, in memory or spilled (and not being deleted).
    pub fn contains(&self, id: &ObjectId) -> bool {
        self.is_spilled(id)
            || self
                .objects
                .get(id)
                .is_some_and(|e| e.is_sealed() && !e.delete_pending)
    }

    /// Whether the id is taken: by an object in any state, spilled included.
    pub fn exists(&self, id: &ObjectId) -> bool {
        self.objects.contains_key(id) || self.is_spilled(id)
    }

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
            || self.alloc.free() + self.policy.bytes() < need
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
        for id in self.policy.victims() {
            if fits && planned >= batch {
                break;
            }
            let e = &self.objects[&id];
            sim.free_range(e.location.offset, e.alloc_size);
            planned += e.alloc_size;
            plan.push(SpillVictim {
                id,
                offset: e.location.offset,
                len: e.alloc_size,
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
            if let Some(e) = self.objects.get_mut(&v.id) {
                e.spilling = true;
                if std::mem::take(&mut e.evictable) {
                    self.policy.remove(&v.id);
                }
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
            e.spilling = false;
            if e.ref_count > 0 {
                continue; // read meanwhile: stays in memory
            }
            if e.delete_pending {
                self.remove_object(v.id, true, &mut fx);
                continue;
            }
            let e = self.objects.remove(&v.id).expect("present");
            self.sealed_count -= 1;
            self.alloc.free_range(e.location.offset, e.alloc_size);
            self.room_made += 1;
            batch.push((
                v.id,
                Spilled {
                    at: SpillRef {
                        segment,
                        offset: off,
                        len: e.alloc_size,
                    },
                    data_size: e.location.data_size,
                    metadata_size: e.location.metadata_size,
                    create_time_us: e.create_time_us,
                    construct_us: e.seal_time_us.map(|t| t - e.create_time_us),
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
            e.spilling = false;
            if e.ref_count == 0 {
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
        let entry = Entry {
            location,
            alloc_size: need,
            state: ObjectState::Sealed,
            ref_count: 0,
            create_time_us: s.create_time_us,
            seal_time_us: s.construct_us.map(|c| s.create_time_us + c),
            delete_pending: false,
            evictable: false,
            spilling: false,
            restoring: true,
        };
        self.objects.insert(id, entry);
        self.sealed_count += 1;
        Ok((location, s.at, fx))
    }

    /// When `id` was sealed (µs since the epoch), in memory or spilled.
    pub fn sealed_at_us(&self, id: &ObjectId) -> Option<i64> {
        if let Some(e) = self.objects.get(id) {
            return e.seal_time_us;
        }
        let s = self.spill.as_ref()?.objects.get(id)?;
        s.construct_us.map(|c| s.create_time_us + c)
    }

    /// Where a readable object (sealed, in memory, not being deleted or
    /// restored) lies, without taking a reference: valid only until the
    /// next change to the store, so the caller reads its bytes before
    /// letting anything else at the store (under the same lock).
    pub fn sealed_location(&self, id: &ObjectId) -> Option<Location> {
        self.objects
            .get(id)
            .filter(|e| e.is_readable())
            .map(|e| e.location)
    }

    /// Whether `id` is being brought back from the spill directory.
    pub fn is_restoring(&self, id: &ObjectId) -> bool {
        self.objects.get(id).is_some_and(|e| e.restoring)
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
        let Some(e) = self.objects.get_mut(&id).filter(|e| e.restoring) else {
            return fx;
        };
        e.restoring = false;
        let keep = read && !e.delete_pending;
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
                e.ref_count = granted;
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

    /// Deletes `id` now, or once it is unreferenced and sealed.
    pub fn delete(&mut self, id: ObjectId) -> (DeleteOutcome, Effects) {
        if self.is_spilled(&id) {
            return (DeleteOutcome::Deleted, self.forget_spilled(id));
        }
        let mut fx = Effects::default();
        if !self.objects.contains_key(&id) {
            return (DeleteOutcome::NotFound, fx);
        }
        self.retire(id);
        let Some(e) = self.objects.get_mut(&id) else {
            return (DeleteOutcome::NotFound, fx);
        };
        if e.is_sealed() && e.ref_count == 0 && !e.spilling && !e.restoring {
            self.remove_object(id, true, &mut fx);
            (DeleteOutcome::Deleted, fx)
        } else {
            e.delete_pending = true;
            (DeleteOutcome::Deferred, fx)
        }
    }

    /// Evicts least recently used objects until objects of at least `bytes`
    /// (data + metadata, as Plasma counted) are gone or nothing evictable is
    /// left. Returns `(their data + metadata bytes, objects evicted)`.
    pub fn evict(&mut self, bytes: u64) -> (u64, u64, Effects) {
        self.refresh_recency();
        let mut fx = Effects::default();
        let (mut freed, mut count) = (0, 0);
        while freed < bytes {
            let Some(id) = self.next_victim() else {
                break;
            };
            if self.retire(id) {
                continue; // a client holds it: in use, not evicted
            }
            freed += self
                .objects
                .get(&id)
                .map_or(0, |e| e.location.data_size + e.location.metadata_size);
            self.evict_one(id, &mut fx);
            count += 1;
        }
        (freed, count, fx)
    }

    /// Turns `client` into a subscriber of seal and delete events.
    pub fn subscribe(&mut self, client: ClientId) {
        self.subscribers.insert(client);
    }

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
            .map(|(id, e)| ObjectInfo {
                id: *id,
                location: e.location,
                ref_count: e.ref_count + held.get(id).copied().unwrap_or(0),
                state: e.state,
                create_time_us: e.create_time_us,
                construct_duration_us: e.seal_time_us.map(|s| s - e.create_time_us),
                delete_pending: e.delete_pending,
                spilled: false,
            })
            .chain(spilled.map(|(id, s)| ObjectInfo {
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
            }))
            .collect()
    }

    /// Capacity, bytes used and objects: what a cluster member tells its
    /// peers in every heartbeat. O(1), as [`Store::stats`] is.
    pub fn usage(&self) -> Usage {
        Usage {
            capacity: self.capacity,
            used: self.alloc.used(),
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
            used: self.alloc.used(),
            objects: self.objects.len() as u64,
            sealed_objects: self.sealed_count,
            referenced_objects: self.referenced_count,
            clients: self.clients.len() as u64,
            evictions: self.evictions,
            evicted_bytes: self.evicted_bytes,
            largest_free_block: self.alloc.largest_free(),
            free_blocks: self.alloc.free_ranges() as u64,
            fragmentation: self.alloc.fragmentation(),
            evictable_bytes: self.policy.bytes(),
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
            .filter_map(|id| self.objects.get(id).filter(|e| e.evictable))
            .map(|e| e.alloc_size)
            .sum()
    }

    /// How many of `ids` are objects here that nobody holds a reference
    /// to (objects held through the readers' table only, when `ids` are
    /// the objects held there): O(ids).
    pub fn unreferenced_among(&self, ids: &[ObjectId]) -> u64 {
        ids.iter()
            .filter(|id| self.objects.get(id).is_some_and(|e| e.ref_count == 0))
            .count() as u64
    }

    // ------------------------------------------------------------ internals

    fn creator_entry(&mut self, client: ClientId, id: ObjectId) -> Result<&mut Entry, StoreError> {
        let e = self
            .objects
            .get_mut(&id)
            .ok_or(StoreError::ObjectNotFound(id))?;
        match e.state {
            ObjectState::Sealed => Err(StoreError::AlreadySealed(id)),
            ObjectState::Created { creator } if creator != client => {
                Err(StoreError::NotCreator(id))
            }
            ObjectState::Created { .. } => Ok(e),
        }
    }

    /// Finds `need` contiguous bytes, evicting LRU objects while that can help.
    /// Objects released through the readers' table since the last call
    /// move to the back of the eviction order, as a release over the socket
    /// does (the daemon calls it before [`Store::spill_plan`] too).
    pub fn refresh_recency(&mut self) {
        let Some(r) = &self.readers else {
            return;
        };
        for id in r.released() {
            if let Some(e) = self.objects.get(&id) {
                if e.evictable {
                    self.policy.remove(&id);
                    self.policy.add(id, e.alloc_size);
                }
            }
        }
    }

    /// The refusal of an allocation of `need` bytes, with the figures as
    /// they are now: after a pass over the eviction order, objects found
    /// held through the readers' table are references, not evictable.
    fn full(&self, need: u64) -> StoreError {
        StoreError::StoreFull {
            requested: need,
            free: self.alloc.free(),
            evictable: self.policy.bytes(),
            capacity: self.capacity,
        }
    }

    fn make_room(&mut self, need: u64, fx: &mut Effects) -> Result<u64, StoreError> {
        if need > self.alloc.capacity() || self.alloc.free() + self.policy.bytes() < need {
            return Err(self.full(need));
        }
        if self.alloc.largest_free() < need {
            self.refresh_recency();
        }
        loop {
            if let Some(offset) = self.alloc.allocate(need) {
                return Ok(offset);
            }
            if self.spill.is_some() {
                // With a spill directory, room is made by spilling (the
                // daemon does it first), never by dropping objects.
                return Err(self.full(need));
            }
            match self.next_victim() {
                Some(id) => {
                    if !self.retire(id) {
                        self.evict_one(id, fx);
                    }
                }
                None => return Err(self.full(need)),
            }
        }
    }

    /// The policy's first victim that is really evictable: an id it names
    /// by mistake (in use, unsealed, unknown) is skipped, so no policy can
    /// make the store free memory in use.
    fn next_victim(&self) -> Option<ObjectId> {
        let objects = &self.objects;
        self.policy
            .victims()
            .find(|id| objects.get(id).is_some_and(|e| e.evictable))
    }

    /// Takes `id` out of the readers' table before it stops being readable;
    /// the holds clients took on it become references. True when someone
    /// holds it now (it must stay).
    fn retire(&mut self, id: ObjectId) -> bool {
        let Some(r) = &self.readers else {
            return false;
        };
        let adopted = r.unreadable(id);
        let mut held = false;
        for (client, n) in adopted {
            let Some(c) = self.clients.get_mut(&client) else {
                continue; // gone: its references went with it
            };
            let Some(e) = self.objects.get_mut(&id) else {
                return false;
            };
            *c.refs.entry(id).or_insert(0) += u64::from(n);
            if e.ref_count == 0 {
                self.referenced_count += 1;
            }
            e.ref_count += u64::from(n);
            if std::mem::take(&mut e.evictable) {
                self.policy.remove(&id);
            }
            held = true;
        }
        held
    }

    fn evict_one(&mut self, id: ObjectId, fx: &mut Effects) -> u64 {
        let size = self.objects.get(&id).map_or(0, |e| e.alloc_size);
        self.remove_object(id, true, fx);
        self.evictions += 1;
        self.evicted_bytes += size;
        size
    }

    fn drop_ref(&mut self, id: ObjectId, fx: &mut Effects) {
        let Some(e) = self.objects.get_mut(&id) else {
            return;
        };
        if e.ref_count == 1 {
            self.referenced_count -= 1;
        }
        e.ref_count = e.ref_count.saturating_sub(1);
        if e.ref_count == 0 && e.is_sealed() {
            self.became_unreferenced(id, fx);
        }
    }

    /// A sealed object lost its last reference: free it if a delete is
    /// pending, else make it evictable.
    fn became_unreferenced(&mut self, id: ObjectId, fx: &mut Effects) {
        let Some(e) = self.objects.get_mut(&id) else {
            return;
        };
        if e.spilling || e.restoring {
            return; // finish_spill, abort_spill or finish_restore decides
        }
        if e.delete_pending {
            self.remove_object(id, true, fx);
        } else if !e.evictable {
            e.evictable = true;
            self.policy.add(id, e.alloc_size);
            self.room_made += 1;
        }
    }

    fn remove_object(&mut self, id: ObjectId, announce: bool, fx: &mut Effects) {
        let Some(e) = self.objects.remove(&id) else {
            return;
        };
        if e.evictable {
            self.policy.remove(&id);
        }
        if e.is_sealed() {
            self.sealed_count -= 1;
        }
        if e.ref_count > 0 {
            self.referenced_count -= 1;
        }
        self.alloc.free_range(e.location.offset, e.alloc_size);
        self.room_made += 1;
        if !e.is_sealed() {
            fx.aborted.push(id);
        } else if announce {
            self.publish_deleted(id, fx);
        }
    }

    fn publish_deleted(&self, id: ObjectId, fx: &mut Effects) {
        let event = Event {
            kind: EventKind::Deleted,
            id,
            data_size: 0,
            metadata_size: 0,
        };
        self.publish(event, fx);
    }

    fn publish(&self, event: Event, fx: &mut Effects) {
        for &s in &self.subscribers {
            fx.push(s, Notice::Event(event));
        }
    }

    fn drop_waiter(&mut self, id: ObjectId, client: ClientId) {
        if let Some(v) = self.waiters.get_mut(&id) {
            v.retain(|&c| c != client);
            if v.is_empty() {
                self.waiters.remove(&id);
            }
        }
    }
}
