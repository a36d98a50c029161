//! Making room: evicting the objects the policy names, least recently
//! released first, skipping (and adopting) those readers hold through the
//! shared table, and the refusal when nothing more can go; and the
//! eviction order itself.
//!
//! The order is kept where it costs least: with the built-in policy (least
//! recently released first, `Store::new`) it is the list through the
//! object table (`crate::dense`), so an evictable object costs no second
//! copy of its id and no second lookup; a policy given to
//! `Store::with_policy` keeps its own books by id.

use super::Store;
use crate::dense::MAX_ENTRIES;
use crate::error::StoreError;
use crate::events::Effects;
use crate::object::ClientId;
use ferroplasma_protocol::fast_writes::LEASE_BYTES;
use ferroplasma_protocol::ObjectId;

impl Store {
    /// The object at `pos` of the table became evictable: it joins the
    /// back of the order.
    pub(super) fn make_evictable(&mut self, pos: u32) {
        let e = self.objects.at_mut(pos);
        e.set_evictable(true);
        match &mut self.policy {
            None => self.objects.push_back_at(pos),
            Some(p) => p.add(e.id, e.alloc_size()),
        }
    }

    /// The object at `pos` of the table is no longer evictable (if it was).
    pub(super) fn not_evictable(&mut self, pos: u32) {
        let e = self.objects.at_mut(pos);
        if !e.take_evictable() {
            return;
        }
        match &mut self.policy {
            None => {
                self.objects.unlink(pos);
            }
            Some(p) => p.remove(&e.id),
        }
    }

    /// Bytes of the evictable objects.
    pub(super) fn evictable_bytes(&self) -> u64 {
        match &self.policy {
            None => self.objects.list_weight(),
            Some(p) => p.bytes(),
        }
    }

    /// The evictable objects, first victim first.
    pub(super) fn victims(&self) -> Box<dyn Iterator<Item = ObjectId> + '_> {
        match &self.policy {
            None => Box::new(self.objects.list().map(|e| e.id)),
            Some(p) => p.victims(),
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
            freed += self.objects.get(&id).map_or(0, |e| e.bytes());
            self.evict_one(id, &mut fx);
            count += 1;
        }
        (freed, count, fx)
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
            let Some(pos) = self.objects.position(&id) else {
                continue;
            };
            if self.objects.at(pos).evictable() {
                self.not_evictable(pos);
                self.make_evictable(pos);
            }
        }
    }

    /// The refusal of an allocation of `need` bytes, with the figures as
    /// they are now: after a pass over the eviction order, objects found
    /// held through the readers' table are references, not evictable.
    pub(super) fn full(&self, need: u64) -> StoreError {
        StoreError::StoreFull {
            requested: need,
            free: self.alloc.free(),
            evictable: self.evictable_bytes(),
            capacity: self.capacity,
        }
    }

    pub(super) fn make_room(&mut self, need: u64, fx: &mut Effects) -> Result<u64, StoreError> {
        if self.alloc.largest_free() < need && need > LEASE_BYTES {
            // Room for a large object: leased room nobody allocated goes
            // first, before any object. (For one of a lease's size or less,
            // eviction comes first: closing every client's lease for each
            // small create or lease of a full store would send every
            // client back for a new lease each time.)
            self.close_leases();
        }
        let short = |s: &Self| s.alloc.free() + s.evictable_bytes() < need;
        if need > self.alloc.capacity()
            || (short(self) && (self.close_leases() == 0 || short(self)))
        {
            return Err(self.full(need));
        }
        if self.objects.len() >= MAX_ENTRIES {
            // About 4.29 billion objects, a third of a terabyte of tables:
            // the table's positions are 32-bit, so the store is full.
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
                // Nothing left to evict: leased room nobody allocated, as
                // the last resort.
                None if self.close_leases() > 0 => {}
                None => return Err(self.full(need)),
            }
        }
    }

    /// The policy's first victim that is really evictable: an id it names
    /// by mistake (in use, unsealed, unknown) is skipped, so no policy can
    /// make the store free memory in use.
    pub(super) fn next_victim(&self) -> Option<ObjectId> {
        let objects = &self.objects;
        self.victims()
            .find(|id| objects.get(id).is_some_and(|e| e.evictable()))
    }

    /// Takes `id` out of the readers' table before it stops being readable;
    /// the holds clients took on it become references. True when someone
    /// holds it now (it must stay).
    pub(super) fn retire(&mut self, id: ObjectId) -> bool {
        let Some(r) = &self.readers else {
            return false;
        };
        let adopted = r.unreadable(id);
        let mut held = false;
        for (client, n) in adopted {
            held |= self.adopt(id, client, n);
        }
        held
    }

    /// `client` held `id` `n` times through the readers' table, and the
    /// table gave those holds up: they become references. True when they
    /// did (the client is still here).
    fn adopt(&mut self, id: ObjectId, client: ClientId, n: u32) -> bool {
        let Some(c) = self.clients.get_mut(&client) else {
            return false; // gone: its references went with it
        };
        let Some(pos) = self.objects.position(&id) else {
            return false;
        };
        // As many as the entry's count has room for (2^32 − 1 in all): a
        // client that claims more holds than that loses the rest, which it
        // then cannot release (NotHeld), and the object is never pinned
        // past its references.
        let e = self.objects.at_mut(pos);
        let was = e.refs();
        let added = e.add_refs(u64::from(n));
        if added == 0 {
            return false;
        }
        *c.refs.entry(id).or_insert(0) += added;
        if was == 0 {
            self.referenced_count += 1;
        }
        self.not_evictable(pos);
        true
    }

    /// Rebuilds the readers' table when its size no longer suits the
    /// number of readable objects (`full`: a publish just found it full;
    /// otherwise only a table three quarters full or under an eighth full
    /// is rebuilt). Every readable object is published in the new table;
    /// the holds clients had in the old one become references. O(objects)
    /// when it happens (the objects grew by a fifth, or fell to an eighth of
    /// the slots): amortized O(1) per object, as a hash table's growth.
    pub fn resize_readers(&mut self, full: bool) {
        let Some(r) = self.readers.clone() else {
            return;
        };
        let Some(slots) = r.resize_for(self.sealed_count as usize, full) else {
            return;
        };
        let adopted = {
            let mut readable = self
                .objects
                .iter()
                .filter(|e| e.is_readable())
                .map(|e| (e.id, e.location()));
            r.rebuild(slots, &mut readable)
        };
        for (id, client, n) in adopted {
            self.adopt(id, client, n);
        }
    }

    pub(super) fn evict_one(&mut self, id: ObjectId, fx: &mut Effects) -> u64 {
        let size = self.objects.get(&id).map_or(0, |e| e.alloc_size());
        self.remove_object(id, true, fx);
        self.evictions += 1;
        self.evicted_bytes += size;
        size
    }
}
