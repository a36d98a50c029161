//! The store's state machine: objects, clients, references, eviction, waiters
//! and subscribers. It does no I/O: every operation takes its inputs (time
//! included) as arguments and returns what the daemon must tell whom as
//! [`Effects`].

use crate::allocator::Allocator;
use crate::clients::ClientState;
use crate::dense::DenseTable;
use crate::error::StoreError;
use crate::events::{Effects, Event, EventKind, Notice};
use crate::object::{ClientId, Entry, Location, ObjectState, MAX_METADATA, MAX_REFS};
use crate::policy::EvictionPolicy;
use crate::spill::SpillTable;
use ferroplasma_protocol::layout::allocation_size;
use ferroplasma_protocol::IdHasher;
use ferroplasma_protocol::ObjectId;
use std::collections::{BTreeSet, HashMap};

mod eviction;
mod leases;
mod listing;
mod queries;
mod spilling;
pub use spilling::{SpillVictim, SPILL_BATCH_MAX};

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
    /// Every object in memory, sealed or not (spilled ones are in `spill`).
    objects: DenseTable<Entry>,
    clients: HashMap<ClientId, ClientState, IdHasher>,
    next_client: ClientId,
    /// Which evictable objects go first (mechanism here, policy there):
    /// `None` for the built-in order, least recently released first, kept
    /// as the list through `objects` (see `eviction.rs`).
    policy: Option<Box<dyn EvictionPolicy>>,
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
    /// Where clients publish the tops of their open leases (`leases.rs`).
    lease_tops: Option<std::sync::Arc<dyn crate::LeaseTops>>,
    /// Bytes allocated that hold no object: the store's own
    /// ([`Store::reserve`]) and leases' room no object took yet. Not
    /// counted as used in stats.
    reserved: u64,
}

impl Store {
    /// A store managing `capacity` bytes of one arena. The arena must hold
    /// at least `capacity` rounded up to 64 bytes (arenas are page-rounded),
    /// so that an object of exactly `capacity` bytes fits.
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity,
            alloc: Allocator::new(ferroplasma_protocol::layout::align_up(capacity)),
            objects: DenseTable::default(),
            clients: HashMap::default(),
            next_client: 1,
            policy: None,
            waiters: HashMap::default(),
            subscribers: BTreeSet::new(),
            evictions: 0,
            evicted_bytes: 0,
            sealed_count: 0,
            referenced_count: 0,
            room_made: 0,
            spill: None,
            readers: None,
            lease_tops: None,
            reserved: 0,
        }
    }

    /// A store that chooses what to evict with `policy` instead of its
    /// built-in order (least recently released first, the order of
    /// [`Lru`](crate::Lru)).
    pub fn with_policy(capacity: u64, policy: Box<dyn EvictionPolicy>) -> Self {
        Self {
            policy: Some(policy),
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
                if e.state() == (ObjectState::Created { creator: client }) {
                    state.refs.remove(&id);
                    self.remove_object(id, false, &mut fx);
                }
            }
        }
        for (id, n) in state.refs {
            // All at once: a client may have held billions (holds adopted).
            self.drop_refs(id, n, &mut fx);
        }
        for lease in state.leases {
            self.free_lease(lease);
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
        let (location, fx) = self.allocate(id, data_size, metadata_size)?;
        self.objects
            .insert(Entry::created(id, location, client, now_us));
        self.referenced_count += 1;
        let c = self.clients.entry(client).or_default();
        c.created.insert(id);
        *c.refs.entry(id).or_insert(0) += 1;
        Ok((location, fx))
    }

    /// Room for a new object `id` (which must not exist yet): its location
    /// and the effects of the evictions that made the room.
    fn allocate(
        &mut self,
        id: ObjectId,
        data_size: u64,
        metadata_size: u64,
    ) -> Result<(Location, Effects), StoreError> {
        if self.exists(&id) {
            return Err(StoreError::ObjectExists(id));
        }
        if metadata_size > MAX_METADATA {
            return Err(StoreError::MetadataTooLarge {
                size: metadata_size,
                limit: MAX_METADATA,
            });
        }
        let mut fx = Effects::default();
        let need = allocation_size(data_size, metadata_size);
        if data_size.saturating_add(metadata_size) > self.capacity {
            return Err(StoreError::StoreFull {
                requested: data_size.saturating_add(metadata_size),
                free: self.alloc.free(),
                evictable: self.evictable_bytes(),
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
        Ok((location, fx))
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
        let (location, mut fx) = self.allocate(id, data_size, metadata_size)?;
        write(&location);
        self.objects
            .insert(Entry::sealed(id, location, now_us, now_us));
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
        e.seal(now_us);
        let (loc, refs) = (e.location(), e.refs());
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
            if self.objects.get(&id).is_some_and(|e| e.is_readable()) && !r.readable(id, loc) {
                // Full or crowded: rebuilt larger (which publishes it too).
                self.resize_readers(true);
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
        let loc = self.take_ref(&id)?;
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
        let mut refs = std::mem::take(&mut self.clients.entry(client).or_default().refs);
        let found = ids
            .iter()
            .map(|id| {
                let loc = self.take_ref(id)?;
                *refs.entry(*id).or_insert(0) += 1;
                Some(loc)
            })
            .collect();
        self.clients.entry(client).or_default().refs = refs;
        found
    }

    /// One more reference to a readable object (the client's books aside):
    /// it stops being evictable and readers may take it.
    fn take_ref(&mut self, id: &ObjectId) -> Option<Location> {
        let pos = self.objects.position(id)?;
        let e = self.objects.at(pos);
        if !e.is_readable() || e.refs() >= MAX_REFS {
            // (2^32 − 1 references held at once: no more until some go.)
            return None;
        }
        self.not_evictable(pos);
        let e = self.objects.at_mut(pos);
        if e.refs() == 0 {
            self.referenced_count += 1;
        }
        e.add_refs(1);
        let loc = e.location();
        if let Some(r) = &self.readers {
            let _ = r.readable(*id, loc);
        }
        Some(loc)
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
                .is_some_and(|e| e.is_sealed() && !e.delete_pending())
    }

    /// Plasma's contains: [`Store::contains`], and also true for a sealed
    /// object whose delete waits for its last reference.
    pub fn contains_deleting(&self, id: &ObjectId) -> bool {
        self.is_spilled(id) || self.objects.get(id).is_some_and(|e| e.is_sealed())
    }

    /// Whether the id is taken: by an object in any state, spilled included.
    pub fn exists(&self, id: &ObjectId) -> bool {
        self.objects.contains_key(id) || self.is_spilled(id)
    }

    /// When `id` was sealed (µs since the epoch), in memory or spilled.
    pub fn sealed_at_us(&self, id: &ObjectId) -> Option<i64> {
        if let Some(e) = self.objects.get(id) {
            return e.seal_time_us();
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
            .map(Entry::location)
    }

    /// Deletes `id` now, or once it is unreferenced and sealed.
    pub fn delete(&mut self, id: ObjectId) -> (DeleteOutcome, Effects) {
        if self.is_spilled(&id) {
            return (DeleteOutcome::Deleted, self.forget_spilled(id));
        }
        let mut fx = Effects::default();
        // Looked up once: retiring the object from the readers' table moves
        // no entry, so the position holds until the removal.
        let Some(pos) = self.objects.position(&id) else {
            return (DeleteOutcome::NotFound, fx);
        };
        self.retire(id);
        let e = self.objects.at_mut(pos);
        if e.is_sealed() && e.refs() == 0 && !e.spilling() && !e.restoring() {
            self.remove_at(pos, true, &mut fx);
            (DeleteOutcome::Deleted, fx)
        } else {
            e.set_delete_pending(true);
            (DeleteOutcome::Deferred, fx)
        }
    }

    /// Turns `client` into a subscriber of seal and delete events.
    pub fn subscribe(&mut self, client: ClientId) {
        self.subscribers.insert(client);
    }

    // ------------------------------------------------------------ internals

    fn creator_entry(&mut self, client: ClientId, id: ObjectId) -> Result<&mut Entry, StoreError> {
        let e = self
            .objects
            .get_mut(&id)
            .ok_or(StoreError::ObjectNotFound(id))?;
        match e.state() {
            ObjectState::Sealed => Err(StoreError::AlreadySealed(id)),
            ObjectState::Created { creator } if creator != client => {
                Err(StoreError::NotCreator(id))
            }
            ObjectState::Created { .. } => Ok(e),
        }
    }

    fn drop_ref(&mut self, id: ObjectId, fx: &mut Effects) {
        self.drop_refs(id, 1, fx);
    }

    /// `n` references fewer (at most as many as it has).
    fn drop_refs(&mut self, id: ObjectId, n: u64, fx: &mut Effects) {
        let Some(e) = self.objects.get_mut(&id) else {
            return;
        };
        if n == 0 {
            return;
        }
        let had = e.refs();
        if had > 0 && had <= n {
            self.referenced_count -= 1;
        }
        e.drop_refs(n);
        if e.refs() == 0 && e.is_sealed() {
            self.became_unreferenced(id, fx);
        }
    }

    /// A sealed object lost its last reference: free it if a delete is
    /// pending, else make it evictable.
    fn became_unreferenced(&mut self, id: ObjectId, fx: &mut Effects) {
        let Some(pos) = self.objects.position(&id) else {
            return;
        };
        let e = self.objects.at(pos);
        if e.spilling() || e.restoring() {
            return; // finish_spill, abort_spill or finish_restore decides
        }
        if e.delete_pending() {
            self.remove_object(id, true, fx);
        } else if !e.evictable() {
            self.make_evictable(pos);
            self.room_made += 1;
        }
    }

    fn remove_object(&mut self, id: ObjectId, announce: bool, fx: &mut Effects) {
        if let Some(pos) = self.objects.position(&id) {
            self.remove_at(pos, announce, fx);
        }
    }

    /// [`Store::remove_object`] of the entry at `pos`.
    fn remove_at(&mut self, pos: u32, announce: bool, fx: &mut Effects) {
        self.not_evictable(pos);
        let e = self.objects.remove_at(pos);
        let id = e.id;
        if e.is_sealed() {
            self.sealed_count -= 1;
        }
        if e.refs() > 0 {
            self.referenced_count -= 1;
        }
        self.alloc.free_range(e.location().offset, e.alloc_size());
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
