//! Writes without a round trip, the store's side (docs/protocol.md,
//! "Writes without a round trip"; the protocol is
//! `ferroplasma_protocol::fast_writes`): the area of claims in the arena,
//! each client's ring, and taking the rings' records in.
//!
//! Every section of the store's lock starts with [`Shared::enter`] (the
//! epoch turns odd, then the rings are drained: whatever a client did
//! before the store looked is taken in before anything else) and ends with
//! [`Shared::leave`] (the count of ids the table does not show, whether
//! anyone waits for seals, a last drain, the epoch even again).

pub(crate) mod rings;

use crate::instruments::Op;
use crate::shared::{now_us, Shared};
use ferroplasma_protocol::fast_writes::{
    self as fw, Entry, AREA_BYTES, BUCKETS, RING_BYTES, RING_HEADER_BYTES, RING_RECORDS,
};
use ferroplasma_protocol::ObjectId;
use ferroplasma_store::{ClientId, Effects, Location, StoreError};
use rings::Ring;
pub(crate) use rings::{DirtyProbe, FastWrites, MIN_CAPACITY};
use std::collections::HashSet;

/// The most leases one client holds at once (one it allocates in, and
/// full ones whose objects are still being written): a client cannot
/// take the store's memory a lease at a time.
pub const MAX_LEASES: usize = 16;

/// How often the store looks for records nobody made it take in: every
/// 2 ms while clients write, every 20 ms once [`BUSY_LOOKS`] looks in a row
/// found none (an idle store with writing clients connected wakes 50 times
/// a second, not 500).
pub const LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(2);
/// The slower pace, once clients stopped writing.
pub const IDLE_LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(20);
/// Looks (at [`LOOK_EVERY`]) without records before the pace slows: 100 ms.
pub const BUSY_LOOKS: u32 = 50;

/// The wait before the next look, after `idle_looks` looks in a row found
/// no records.
pub fn next_look(idle_looks: u32) -> std::time::Duration {
    match idle_looks < BUSY_LOOKS {
        true => LOOK_EVERY,
        false => IDLE_LOOK_EVERY,
    }
}

/// Why a `Lease` is refused.
#[derive(Debug)]
pub enum GrantError {
    /// This store does not offer writes without a round trip.
    Off,
    /// This client broke the protocol before.
    Broken,
    /// This client holds [`MAX_LEASES`] leases already.
    TooMany,
    /// No room.
    Store(StoreError),
}

/// What a `Lease` request is answered with.
#[derive(Debug, Clone, Copy)]
pub struct Granted {
    pub area_offset: u64,
    pub ring_offset: u64,
    pub tag: u32,
    pub lease: Option<(u64, u64)>,
}

impl Shared {
    /// Where the area goes: past the memory the store allocates from,
    /// where the arena was made that much larger (`server`); else out of
    /// that memory.
    fn fast_area(&mut self) -> Result<u64, StoreError> {
        let past = ferroplasma_protocol::layout::align_up(self.store.capacity());
        if past + AREA_BYTES as u64 <= self.arena.size() {
            return Ok(past);
        }
        let (offset, fx) = self.store.reserve(AREA_BYTES as u64)?;
        self.deliver(fx);
        Ok(offset)
    }

    /// A probe of whether clients wrote records (for a timer that takes
    /// them in when nobody else makes the store look).
    pub fn dirty_probe(&self) -> Option<DirtyProbe> {
        self.fast.as_ref().map(|f| DirtyProbe {
            arena: f.arena.clone(),
            area_offset: f.area_offset,
        })
    }

    /// Turns writes without a round trip on (a store with a shared table;
    /// on a cluster member, for ids the store handed out: `take_in`).
    /// False, with a warning, when the area does not fit.
    pub fn enable_fast_writes(&mut self) -> bool {
        if self.table.is_none() || self.store.capacity() < MIN_CAPACITY {
            return false;
        }
        match self.fast_area() {
            Ok(offset) => {
                let f = FastWrites::at(self.arena.clone(), offset);
                // Inside this section of the lock, as if on from its start.
                fw::begin(f.area());
                self.store.set_lease_tops(f.tops.clone());
                self.fast = Some(f);
                true
            }
            Err(e) => {
                tracing::warn!("writes without a round trip are off: {e}");
                false
            }
        }
    }

    /// The start of a section of the lock.
    pub(crate) fn enter(&mut self) {
        if let Some(f) = &self.fast {
            fw::begin(f.area());
            self.drain_rings();
        }
    }

    /// The end of a section of the lock.
    pub(crate) fn leave(&mut self) {
        if self.fast.is_none() {
            return;
        }
        loop {
            self.publish_fast_state();
            if !self.drain_rings() {
                break;
            }
        }
        if let Some(f) = &self.fast {
            fw::end(f.area());
        }
    }

    fn publish_fast_state(&self) {
        let Some(f) = &self.fast else { return };
        let shown = self.table.as_ref().map_or(0, |t| t.published());
        let claimed = f.unsealed.len() as u64;
        let hidden = self.store.ids_held().saturating_sub(shown + claimed);
        fw::publish_state(f.area(), hidden, self.store.wants_seals());
    }

    /// Takes in every ring's new records; true if there were any.
    pub(crate) fn drain_rings(&mut self) -> bool {
        let Some(f) = &mut self.fast else {
            return false;
        };
        let mut work = Vec::new();
        for (&client, ring) in &f.rings {
            if ring.broken {
                continue;
            }
            let (header, _) = f.ring_at(ring.offset);
            match fw::pending(header, ring.tail, RING_RECORDS) {
                Some(0) => {}
                Some(n) => work.push((client, n)),
                None => work.push((client, u64::MAX)),
            }
        }
        if work.is_empty() {
            return false;
        }
        let mut fx = Effects::default();
        for (client, n) in work {
            self.drain_ring(client, n, &mut fx);
        }
        self.deliver(fx);
        true
    }

    fn drain_ring(&mut self, client: ClientId, n: u64, fx: &mut Effects) {
        let Some(f) = &mut self.fast else { return };
        let Some(ring) = f.rings.get(&client) else {
            return;
        };
        let (offset, tag, tail) = (ring.offset, ring.tag, ring.tail);
        if n == u64::MAX {
            return self.break_ring(client, "its ring's head is past its end".into());
        }
        let now = now_us();
        // Counted once per drain (a metric's lookup costs more than a record).
        let mut counted = [0u64; 4];
        for at in tail..tail + n {
            let f = self.fast.as_ref().expect("on");
            let (_, records) = f.ring_at(offset);
            let e = fw::read(records, at);
            if let Some(c) = (e.kind as usize)
                .checked_sub(1)
                .and_then(|k| counted.get_mut(k))
            {
                *c += 1;
            }
            if let Err(why) = self.take_in(client, tag, e, now, fx) {
                return self.break_ring(client, why);
            }
        }
        counted[1] += counted[3];
        for (op, n) in [Op::create, Op::seal, Op::abort].into_iter().zip(counted) {
            if n > 0 {
                self.instruments.through_ring(op, n);
            }
        }
        let f = self.fast.as_mut().expect("on");
        let (header, _) = f.ring_at(offset);
        fw::taken(header, tail + n);
        if let Some(r) = f.rings.get_mut(&client) {
            r.tail = tail + n;
        }
    }

    /// One record. An error is a client that broke the protocol.
    fn take_in(
        &mut self,
        client: ClientId,
        tag: u32,
        e: Entry,
        now: i64,
        fx: &mut Effects,
    ) -> Result<(), String> {
        // The client's clock orders what one drain takes in (a late
        // subscriber hears of existing objects in seal order); the store's
        // when the client's is off by more than a second ahead or an hour
        // behind.
        let t = e.time_us as i64;
        let now = if (now - 3_600_000_000..=now + 1_000_000).contains(&t) {
            t
        } else {
            now
        };
        match e.kind {
            fw::CREATE => {
                // A cluster member's ids are claimed cluster-wide: through a
                // ring, only those it handed this client (`crate::shared::handed`)
                // and that it did not create otherwise meanwhile (two threads
                // of one client creating one id). Any other is turned down as
                // taken: the client hears it at `Settle`.
                if self.cluster_client.is_some() && !self.take_handed(client, &e.id) {
                    let f = self.fast.as_mut().expect("on");
                    fw::clear_claim(&f.buckets()[fw::bucket_of(&e.id)], tag);
                    if let Some(r) = f.rings.get_mut(&client) {
                        r.refused.insert(e.id);
                    }
                    return Ok(());
                }
                let loc = Location {
                    arena: 0,
                    offset: e.offset,
                    data_size: e.data_size,
                    metadata_size: e.metadata_size,
                };
                let r = self.store.take_in(client, e.id, loc, now);
                let f = self.fast.as_mut().expect("on");
                match r {
                    Ok(()) => {
                        // The claim stays until the seal or abort.
                        f.unsealed.insert(e.id, (client, tag));
                        Ok(())
                    }
                    Err(StoreError::ObjectExists(id)) => {
                        fw::clear_claim(&f.buckets()[fw::bucket_of(&e.id)], tag);
                        if let Some(r) = f.rings.get_mut(&client) {
                            r.refused.insert(id);
                        }
                        Ok(())
                    }
                    Err(err) => {
                        fw::clear_claim(&f.buckets()[fw::bucket_of(&e.id)], tag);
                        // A handed id's claim goes back with the ring.
                        if self.cluster_client.is_some() && !self.store.exists(&e.id) {
                            fx.aborted.push(e.id);
                        }
                        Err(err.to_string())
                    }
                }
            }
            fw::SEAL => {
                let r = self.store.seal(client, e.id, now);
                self.ended(client, e.id, r, "seal", fx)
            }
            fw::ABORT => {
                let r = self.store.abort(client, e.id);
                self.ended(client, e.id, r, "abort", fx)
            }
            fw::SEAL_RELEASE => {
                let r = self.store.seal(client, e.id, now).and_then(|mut more| {
                    more.extend(self.store.release(client, e.id)?);
                    Ok(more)
                });
                self.ended(client, e.id, r, "seal", fx)
            }
            k => Err(format!("a record of unknown kind {k}")),
        }
    }

    /// A `SEAL` or `ABORT` (`what`) taken in with result `r`.
    fn ended(
        &mut self,
        client: ClientId,
        id: ObjectId,
        r: Result<Effects, StoreError>,
        what: &str,
        fx: &mut Effects,
    ) -> Result<(), String> {
        match r {
            Ok(more) => {
                fx.extend(more);
                self.unclaim(client, &id);
                Ok(())
            }
            // Of an object the store turned down: the client hears at Settle.
            Err(StoreError::ObjectNotFound(_) | StoreError::NotCreator(_))
                if self.was_refused(client, &id) =>
            {
                Ok(())
            }
            Err(e) => Err(format!("{what}: {e}")),
        }
    }

    /// `client`'s object `id` is no longer unsealed (sealed, aborted): its
    /// bucket's claim goes.
    fn unclaim(&mut self, client: ClientId, id: &ObjectId) {
        let Some(f) = &mut self.fast else { return };
        if let Some(&(c, tag)) = f.unsealed.get(id) {
            if c == client {
                f.unsealed.remove(id);
                fw::clear_claim(&f.buckets()[fw::bucket_of(id)], tag);
            }
        }
    }

    fn was_refused(&self, client: ClientId, id: &ObjectId) -> bool {
        self.fast
            .as_ref()
            .and_then(|f| f.rings.get(&client))
            .is_some_and(|r| r.refused.contains(id))
    }

    fn break_ring(&mut self, client: ClientId, why: String) {
        tracing::warn!(
            client,
            "a client broke the protocol of writes without a round trip ({why}); its ring is \
             no longer read"
        );
        if let Some(r) = self.fast.as_mut().and_then(|f| f.rings.get_mut(&client)) {
            r.broken = true;
        }
    }

    /// A `Lease`: this client's ring (made the first time), its leases in
    /// `ended` ended, and a new lease of `size` bytes (none for 0), which
    /// the store may close to take its rest back when the client said it
    /// publishes its top (`bumps_top`).
    pub fn grant(
        &mut self,
        client: ClientId,
        size: u64,
        ended: &[u64],
        bumps_top: bool,
    ) -> Result<Granted, GrantError> {
        let Some(f) = &self.fast else {
            return Err(GrantError::Off);
        };
        let area_offset = f.area_offset;
        if !f.rings.contains_key(&client) {
            let (offset, fx) = self
                .store
                .reserve(RING_BYTES as u64)
                .map_err(GrantError::Store)?;
            self.deliver(fx);
            self.arena.write(offset, &[0u8; RING_HEADER_BYTES]);
            let f = self.fast.as_mut().expect("on");
            let tag = f.next_tag;
            f.next_tag = f.next_tag.checked_add(1).unwrap_or(1);
            f.tops.set(client, Some(offset));
            f.rings.insert(
                client,
                Ring {
                    offset,
                    tag,
                    tail: 0,
                    refused: HashSet::default(),
                    broken: false,
                },
            );
        }
        for &start in ended {
            self.store.end_lease(client, start);
        }
        let lease = match size {
            0 => None,
            _ if self.store.leases_of(client) >= MAX_LEASES => return Err(GrantError::TooMany),
            n => {
                let n = n.min(fw::LEASE_BYTES);
                let (offset, fx) = self
                    .store
                    .lease(client, n, bumps_top)
                    .map_err(GrantError::Store)?;
                self.deliver(fx);
                // Written before the client hears of the lease.
                self.fast.as_ref().expect("on").tops.open(client, offset);
                Some((offset, ferroplasma_store::allocator::Allocator::rounded(n)))
            }
        };
        let ring = &self.fast.as_ref().expect("on").rings[&client];
        if ring.broken {
            return Err(GrantError::Broken);
        }
        Ok(Granted {
            area_offset,
            ring_offset: ring.offset,
            tag: ring.tag,
            lease,
        })
    }

    /// A `Settle`: whether the store took in this client's `CREATE` of `id`
    /// (its ring was drained when the lock was taken). `ObjectExists` when
    /// it turned it down.
    pub fn settle(&mut self, client: ClientId, id: ObjectId) -> Result<(), StoreError> {
        let refused = self
            .fast
            .as_mut()
            .and_then(|f| f.rings.get_mut(&client))
            .is_some_and(|r| r.refused.remove(&id));
        match refused {
            true => Err(StoreError::ObjectExists(id)),
            false => Ok(()),
        }
    }

    /// A connection ends: its claim (if it died claiming) is cleared and
    /// its ring given back (its records were taken in when the lock was
    /// taken; its leases go with the store's `disconnect`).
    pub(crate) fn forget_ring(&mut self, client: ClientId) {
        let Some(f) = &mut self.fast else { return };
        let Some(ring) = f.rings.remove(&client) else {
            return;
        };
        f.tops.set(client, None);
        // Its unsealed objects were aborted with its connection.
        let mine: Vec<ObjectId> = f
            .unsealed
            .iter()
            .filter(|(_, &(c, _))| c == client)
            .map(|(id, _)| *id)
            .collect();
        for id in mine {
            f.unsealed.remove(&id);
            fw::clear_claim(&f.buckets()[fw::bucket_of(&id)], ring.tag);
        }
        let (header, _) = f.ring_at(ring.offset);
        let claiming = header.claiming.load(std::sync::atomic::Ordering::Acquire) as usize;
        if (1..=BUCKETS).contains(&claiming) {
            fw::clear_claim(&f.buckets()[claiming - 1], ring.tag);
        }
        self.store.unreserve(ring.offset, RING_BYTES as u64);
    }
}
