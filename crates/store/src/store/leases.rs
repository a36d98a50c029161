//! Leases (writes without a round trip): ranges of the arena a client
//! allocates its small objects in itself, one after another, telling the
//! store of each through its ring. The store takes each in with
//! [`Store::take_in`]; from then on it is an object like any other (freed
//! alone when deleted or evicted: the client never writes behind its
//! allocation point). What no object took (objects the store turned down,
//! the unused end) is freed when the lease ends.

use super::Store;
use crate::allocator::Allocator;
use crate::error::StoreError;
use crate::events::Effects;
use crate::lease::Lease;
use crate::object::{ClientId, Entry, Location, MAX_METADATA};
use ferroplasma_protocol::layout::allocation_size;
use ferroplasma_protocol::ObjectId;

impl Store {
    /// Leases `size` bytes (64-byte aligned) to `client`, evicting as a
    /// create would; the lease's offset. With `closable`, the client
    /// publishes how far it allocated ([`crate::LeaseTops`]), and the store
    /// may close the lease to take its rest back.
    pub fn lease(
        &mut self,
        client: ClientId,
        size: u64,
        closable: bool,
    ) -> Result<(u64, Effects), StoreError> {
        let size = Allocator::rounded(size);
        let (offset, fx) = self.reserve(size)?;
        let leases = &mut self.clients.entry(client).or_default().leases;
        // The client allocates in its newest lease only.
        for l in leases.iter_mut() {
            l.open = false;
        }
        leases.push(Lease {
            start: offset,
            end: offset + size,
            next: offset,
            holes: Vec::new(),
            open: closable,
        });
        Ok((offset, fx))
    }

    /// Where clients publish how far they allocated in their open leases:
    /// with it, the store takes the unused rest of open leases back when
    /// it has no room (before it evicts anything).
    pub fn set_lease_tops(&mut self, tops: std::sync::Arc<dyn crate::LeaseTops>) {
        self.lease_tops = Some(tops);
    }

    /// Closes every open lease and frees what its client had not allocated
    /// yet: room that is free but leased, taken back when an allocation
    /// finds no room. A top that does not lie between what the store took
    /// in and the lease's end (a client that broke the protocol) leaves
    /// the lease as it was. The bytes taken back.
    pub(super) fn close_leases(&mut self) -> u64 {
        let Some(tops) = self.lease_tops.clone() else {
            return 0;
        };
        let mut freed = 0;
        for (&client, c) in self.clients.iter_mut() {
            let Some(l) = c.leases.iter_mut().find(|l| l.open) else {
                continue;
            };
            l.open = false;
            let Some(top) = tops.close(client) else {
                continue;
            };
            if top < l.next || top > l.end || top % 64 != 0 {
                continue;
            }
            if top < l.end {
                self.alloc.free_range(top, l.end - top);
                self.reserved -= l.end - top;
                freed += l.end - top;
                l.end = top;
            }
        }
        if freed > 0 {
            self.room_made += 1;
        }
        freed
    }

    /// Memory for the store's own use (not an object), evicting as a
    /// create would: given back with [`Store::unreserve`].
    pub fn reserve(&mut self, size: u64) -> Result<(u64, Effects), StoreError> {
        let mut fx = Effects::default();
        let size = Allocator::rounded(size);
        let offset = self.make_room(size, &mut fx)?;
        self.reserved += size;
        Ok((offset, fx))
    }

    /// Gives back memory taken with [`Store::reserve`].
    pub fn unreserve(&mut self, offset: u64, size: u64) {
        self.alloc.free_range(offset, Allocator::rounded(size));
        self.reserved -= Allocator::rounded(size);
        self.room_made += 1;
    }

    /// Ends `client`'s lease that starts at `start`: what no object took is
    /// free again. False when there is no such lease.
    pub fn end_lease(&mut self, client: ClientId, start: u64) -> bool {
        let Some(c) = self.clients.get_mut(&client) else {
            return false;
        };
        let Some(i) = c.leases.iter().position(|l| l.start == start) else {
            return false;
        };
        let lease = c.leases.swap_remove(i);
        self.free_lease(lease);
        true
    }

    pub(super) fn free_lease(&mut self, mut lease: Lease) {
        if lease.next < lease.end {
            lease.holes.push((lease.next, lease.end - lease.next));
        }
        for (offset, len) in lease.holes {
            self.alloc.free_range(offset, len);
            self.reserved -= len;
        }
        self.room_made += 1;
    }

    /// Takes in an object `client` created in one of its leases: unsealed,
    /// the creator holding one reference, as after [`Store::create`].
    /// `ObjectExists` when the id is taken (its room stays the lease's
    /// until the lease ends: the client may still be writing it);
    /// `OutsideLease` when it does not lie after the lease's last object
    /// and inside the lease (a client that does not follow the protocol).
    pub fn take_in(
        &mut self,
        client: ClientId,
        id: ObjectId,
        location: Location,
        now_us: i64,
    ) -> Result<(), StoreError> {
        let need = Allocator::rounded(allocation_size(location.data_size, location.metadata_size));
        let end = location.offset.saturating_add(need);
        let outside = StoreError::OutsideLease {
            id,
            offset: location.offset,
            end,
        };
        if location.metadata_size > MAX_METADATA || location.offset % 64 != 0 {
            return Err(outside);
        }
        let c = self.clients.entry(client).or_default();
        let Some(lease) = c
            .leases
            .iter_mut()
            .find(|l| l.next <= location.offset && end <= l.end)
        else {
            return Err(outside);
        };
        if self.objects.contains_key(&id)
            || self
                .spill
                .as_ref()
                .is_some_and(|s| s.objects.contains_key(&id))
        {
            return Err(StoreError::ObjectExists(id));
        }
        if location.offset > lease.next {
            lease.holes.push((lease.next, location.offset - lease.next));
        }
        lease.next = end;
        self.reserved -= need;
        c.created.insert(id);
        *c.refs.entry(id).or_insert(0) += 1;
        self.objects
            .insert(Entry::created(id, location, client, now_us));
        self.referenced_count += 1;
        Ok(())
    }

    /// Ids the store has, in memory (in any state) or spilled: with the
    /// number its readers' table shows, how many it does not.
    pub fn ids_held(&self) -> u64 {
        self.objects.len() as u64 + self.spill.as_ref().map_or(0, |s| s.objects.len() as u64)
    }

    /// How many leases `client` holds now.
    pub fn leases_of(&self, client: ClientId) -> usize {
        self.clients.get(&client).map_or(0, |c| c.leases.len())
    }

    /// Whether anyone waits to hear of seals now (a waiting get, a
    /// subscriber): clients that seal without a round trip then ring.
    pub fn wants_seals(&self) -> bool {
        !self.waiters.is_empty() || !self.subscribers.is_empty()
    }
}
