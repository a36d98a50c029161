//! The store's state machine: objects, clients, references, eviction, waiters
//! and subscribers. It does no I/O: every operation takes its inputs (time
//! included) as arguments and returns what the daemon must tell whom as
//! [`Effects`].

use crate::allocator::Allocator;
use crate::clients::ClientState;
use crate::error::StoreError;
use crate::events::{Effects, Event, EventKind, Notice};
use crate::lru::LruQueue;
use crate::object::{ClientId, Entry, Location, ObjectInfo, ObjectState};
use crate::stats::Stats;
use ferroplasma_protocol::layout::allocation_size;
use ferroplasma_protocol::IdHasher;
use ferroplasma_protocol::ObjectId;
use std::collections::{BTreeSet, HashMap};

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
    clients: HashMap<ClientId, ClientState>,
    next_client: ClientId,
    lru: LruQueue,
    waiters: HashMap<ObjectId, Vec<ClientId>, IdHasher>,
    subscribers: BTreeSet<ClientId>,
    evictions: u64,
    evicted_bytes: u64,
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
            clients: HashMap::new(),
            next_client: 1,
            lru: LruQueue::default(),
            waiters: HashMap::default(),
            subscribers: BTreeSet::new(),
            evictions: 0,
            evicted_bytes: 0,
        }
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
        if self.objects.contains_key(&id) {
            return Err(StoreError::ObjectExists(id));
        }
        let mut fx = Effects::default();
        let need = allocation_size(data_size, metadata_size);
        if data_size.saturating_add(metadata_size) > self.capacity {
            return Err(StoreError::StoreFull {
                requested: data_size.saturating_add(metadata_size),
                free: self.alloc.free(),
                evictable: self.lru.bytes(),
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
                lru_tick: None,
            },
        );
        let c = self.clients.entry(client).or_default();
        c.created.insert(id);
        *c.refs.entry(id).or_insert(0) += 1;
        Ok((location, fx))
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
        if let Some(c) = self.clients.get_mut(&client) {
            c.created.remove(&id);
        }
        let mut fx = Effects::default();
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
            &mut fx,
        );
        if refs == 0 {
            self.became_unreferenced(id, &mut fx);
        }
        Ok(fx)
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
        if !e.is_sealed() || e.delete_pending {
            return None;
        }
        if let Some(tick) = e.lru_tick.take() {
            self.lru.remove(tick);
        }
        e.ref_count += 1;
        let loc = e.location;
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
                if !e.is_sealed() || e.delete_pending {
                    return None;
                }
                if let Some(tick) = e.lru_tick.take() {
                    self.lru.remove(tick);
                }
                e.ref_count += 1;
                *refs.entry(*id).or_insert(0) += 1;
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

    /// Whether `id` is sealed here (and not being deleted).
    pub fn contains(&self, id: &ObjectId) -> bool {
        self.objects
            .get(id)
            .is_some_and(|e| e.is_sealed() && !e.delete_pending)
    }

    /// Deletes `id` now, or once it is unreferenced and sealed.
    pub fn delete(&mut self, id: ObjectId) -> (DeleteOutcome, Effects) {
        let mut fx = Effects::default();
        let Some(e) = self.objects.get_mut(&id) else {
            return (DeleteOutcome::NotFound, fx);
        };
        if e.is_sealed() && e.ref_count == 0 {
            self.remove_object(id, true, &mut fx);
            (DeleteOutcome::Deleted, fx)
        } else {
            e.delete_pending = true;
            (DeleteOutcome::Deferred, fx)
        }
    }

    /// Evicts least recently used objects until at least `bytes` are freed
    /// or nothing evictable is left. Returns `(bytes freed, objects evicted)`.
    pub fn evict(&mut self, bytes: u64) -> (u64, u64, Effects) {
        let mut fx = Effects::default();
        let (mut freed, mut count) = (0, 0);
        while freed < bytes {
            let Some(id) = self.lru.oldest() else { break };
            freed += self.evict_one(id, &mut fx);
            count += 1;
        }
        (freed, count, fx)
    }

    /// Turns `client` into a subscriber of seal and delete events.
    pub fn subscribe(&mut self, client: ClientId) {
        self.subscribers.insert(client);
    }

    /// Every object, sealed or not.
    pub fn list(&self) -> Vec<ObjectInfo> {
        self.objects
            .iter()
            .map(|(id, e)| ObjectInfo {
                id: *id,
                location: e.location,
                ref_count: e.ref_count,
                state: e.state,
                create_time_us: e.create_time_us,
                construct_duration_us: e.seal_time_us.map(|s| s - e.create_time_us),
                delete_pending: e.delete_pending,
            })
            .collect()
    }

    /// Counters and memory figures.
    pub fn stats(&self) -> Stats {
        Stats {
            capacity: self.capacity,
            used: self.alloc.used(),
            objects: self.objects.len() as u64,
            sealed_objects: self.objects.values().filter(|e| e.is_sealed()).count() as u64,
            referenced_objects: self.objects.values().filter(|e| e.ref_count > 0).count() as u64,
            clients: self.clients.len() as u64,
            evictions: self.evictions,
            evicted_bytes: self.evicted_bytes,
            largest_free_block: self.alloc.largest_free(),
            free_blocks: self.alloc.free_ranges() as u64,
            fragmentation: self.alloc.fragmentation(),
            evictable_bytes: self.lru.bytes(),
        }
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
    fn make_room(&mut self, need: u64, fx: &mut Effects) -> Result<u64, StoreError> {
        let full = StoreError::StoreFull {
            requested: need,
            free: self.alloc.free(),
            evictable: self.lru.bytes(),
            capacity: self.capacity,
        };
        if need > self.alloc.capacity() || self.alloc.free() + self.lru.bytes() < need {
            return Err(full);
        }
        loop {
            if let Some(offset) = self.alloc.allocate(need) {
                return Ok(offset);
            }
            match self.lru.oldest() {
                Some(id) => {
                    self.evict_one(id, fx);
                }
                None => return Err(full),
            }
        }
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
        if e.delete_pending {
            self.remove_object(id, true, fx);
        } else if e.lru_tick.is_none() {
            e.lru_tick = Some(self.lru.push(id, e.alloc_size));
        }
    }

    fn remove_object(&mut self, id: ObjectId, announce: bool, fx: &mut Effects) {
        let Some(e) = self.objects.remove(&id) else {
            return;
        };
        if let Some(tick) = e.lru_tick {
            self.lru.remove(tick);
        }
        self.alloc.free_range(e.location.offset, e.alloc_size);
        if announce && e.is_sealed() {
            self.publish(
                Event {
                    kind: EventKind::Deleted,
                    id,
                    data_size: 0,
                    metadata_size: 0,
                },
                fx,
            );
        }
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
