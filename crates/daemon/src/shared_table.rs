//! The store's side of the object table in shared memory
//! (`ferroplasma_protocol::shared_table`, docs/protocol.md "Reads without a round
//! trip"): publishes each sealed, in-memory object in a slot clients read
//! without asking; before the store frees, evicts, spills or deletes an
//! object it retires the slot and adopts the holds clients took on it.
//!
//! The table is one memfd mapped here read-write and handed to clients as a
//! read-only descriptor; it is sealed against new writers
//! (`F_SEAL_FUTURE_WRITE`), so the kernel refuses a writable mapping of it
//! however a client reopens it (`/proc/self/fd/N`). Each
//! client gets its own holds region, which only it and the store map.

use crate::arena::Arena;
use crate::DaemonError;
use ferroplasma_protocol::shared_table::{self, Header, Slot, SLOT_BYTES};
use ferroplasma_protocol::{IdHasher, ObjectId};
use ferroplasma_store::{ClientId, Location, Readers};
use memmap2::MmapRaw;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The published objects and every client's holds.
#[derive(Debug)]
pub struct SharedTable {
    table: Arena,
    /// The read-only descriptor every client gets.
    read_only: OwnedFd,
    slots: usize,
    key: u64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Published objects and their slots.
    index: HashMap<ObjectId, usize, IdHasher>,
    /// The object published in each slot.
    taken: Vec<Option<ObjectId>>,
    /// How far the object in each slot lies from its home slot.
    distance: Vec<u8>,
    /// Each slot's reach as a home (as written in the table).
    reach: Vec<u8>,
    /// Each connected client's holds region, and how far the store has
    /// read its ring of releases.
    holds: HashMap<ClientId, (Arc<MmapRaw>, u64)>,
    /// What each connected client has answered from the table, as counted
    /// into `answered` so far.
    counted: HashMap<ClientId, TableAnswers>,
    /// Requests answered from the table not yet taken by
    /// [`SharedTable::take_answered`].
    answered: TableAnswers,
}

/// The most one client's count may grow between two looks at it.
const MAX_GROWTH: u64 = 1 << 32;

/// Requests clients answered from the table without asking the store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableAnswers {
    /// Gets whose every object the table served.
    pub gets: u64,
    /// Contains the table answered alone.
    pub contains: u64,
    /// Objects given back through the table (the hold was the reference).
    pub releases: u64,
}

impl SharedTable {
    /// A table of `slots` slots (at least [`shared_table::PROBES`]).
    pub fn create(slots: usize) -> Result<Self, DaemonError> {
        let slots = slots.max(shared_table::PROBES);
        let table = Arena::create_store_writable(((slots + 1) * SLOT_BYTES) as u64)?;
        // Backed now (16 MiB by default, a few ms at start): every seal
        // publishes into a random slot, and a first touch of its page would
        // cost that seal a page fault.
        table.prefault();
        let mut k = [0u8; 8];
        getrandom::fill(&mut k)
            .map_err(|e| DaemonError::io("table hash key", std::io::Error::other(e.to_string())))?;
        let key = u64::from_le_bytes(k);
        let read_only = table.read_only_fd()?;
        let t = Self {
            table,
            read_only,
            slots,
            key,
            state: Mutex::new(State {
                taken: vec![None; slots],
                distance: vec![0; slots],
                reach: vec![0; slots],
                ..Default::default()
            }),
        };
        let h = t.header();
        h.slots.store(slots as u64, Ordering::Relaxed);
        h.key.store(key, Ordering::Relaxed);
        h.features.store(
            shared_table::FEATURE_REACH | shared_table::FEATURE_COUNTS,
            Ordering::Relaxed,
        );
        h.magic.store(shared_table::MAGIC, Ordering::Release);
        Ok(t)
    }

    /// Asks the CPU to start loading what publishing `ids` will touch (each
    /// id's home slot and its entry in the books), all at once: the store
    /// seals a frame of pulled objects one after another, and each publish
    /// would otherwise wait for its own cache misses (sealing a frame of 256
    /// pulled objects: 270 µs instead of 390 µs, medians of timestamps
    /// taken around the seals in `ferroplasma-bench-cluster --loopback`).
    pub fn prefetch(&self, ids: &[ObjectId]) {
        let st = self.lock();
        let slots = self.slots();
        for id in ids {
            let i = shared_table::home(&shared_table::id_words(id), self.key, self.slots);
            shared_table::prefetch(slots[i].seq.as_ptr());
            shared_table::prefetch(&st.taken[i]);
        }
    }

    fn header(&self) -> &Header {
        // Safety: the mapping is page-aligned and at least one header long;
        // `Header` is a `repr(C)` block of atomics, valid for any bytes
        // (zeroed memory included), and the mapping lives as long as `self`.
        unsafe { &*(self.table.ptr() as *const Header) }
    }

    fn slots(&self) -> &[Slot] {
        // Safety: as for `header`: the slots follow the header inside the
        // mapping (sized for `slots + 1` blocks of 64 bytes), `Slot` is a
        // `repr(C)` block of atomics valid for any bytes.
        unsafe {
            std::slice::from_raw_parts(self.table.ptr().add(SLOT_BYTES) as *const Slot, self.slots)
        }
    }

    fn holds_of(region: &MmapRaw, slots: usize) -> &[AtomicU32] {
        // Safety: the region was created `holds_region_len(slots)` long,
        // starting with `slots` u32s; `AtomicU32` is valid for any bytes;
        // the client may write them at any time, which atomics allow; the
        // borrow does not outlive the region.
        unsafe { std::slice::from_raw_parts(region.as_ptr() as *const AtomicU32, slots) }
    }

    fn ring_of(region: &MmapRaw, slots: usize) -> (&AtomicU64, &[AtomicU32]) {
        let at = shared_table::ring_offset(slots);
        // Safety: as for `holds_of`: the head (8 bytes, 64-byte aligned)
        // and `RING` u32s lie inside the region (`holds_region_len`), and
        // atomics are valid for any bytes the client writes.
        unsafe {
            let base = region.as_ptr().add(at);
            (
                &*(base as *const AtomicU64),
                std::slice::from_raw_parts(base.add(8) as *const AtomicU32, shared_table::RING),
            )
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The table's read-only descriptor, for clients.
    pub fn table_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.read_only.as_fd()
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.slots
    }

    /// Creates `client`'s holds region; returns its descriptor, the only
    /// one: the store keeps just the mapping, so a client costs the store
    /// one descriptor (its socket) once the handshake is sent.
    pub fn add_client(&self, client: ClientId) -> Result<OwnedFd, DaemonError> {
        // Sealed against resizing: a client that truncated it would fault
        // the store's next read of it.
        let region = Arena::create_fixed_size(shared_table::holds_region_len(self.slots) as u64)?;
        let (file, map) = region.into_parts();
        self.lock().holds.insert(client, (Arc::new(map), 0));
        Ok(OwnedFd::from(file))
    }

    /// Drops `client`'s holds region (it disconnected: the holds the store
    /// adopted were store references, released with the client's others).
    pub fn remove_client(&self, client: ClientId) {
        let mut st = self.lock();
        Self::count_answers(&mut st, client, self.slots);
        st.holds.remove(&client);
        st.counted.remove(&client);
    }

    /// The requests clients answered from the table since the last call
    /// (for the metrics, at each scrape): what each client's counts grew
    /// by. A count that went down (a client that wrote its own) adds
    /// nothing, so the totals only grow.
    pub fn take_answered(&self) -> TableAnswers {
        let mut st = self.lock();
        let clients: Vec<ClientId> = st.holds.keys().copied().collect();
        for c in clients {
            Self::count_answers(&mut st, c, self.slots);
        }
        std::mem::take(&mut st.answered)
    }

    fn count_answers(st: &mut State, client: ClientId, slots: usize) {
        let Some((region, _)) = st.holds.get(&client) else {
            return;
        };
        let now = Self::answers_of(region, slots);
        let seen = st.counted.entry(client).or_default();
        // Growth since the last look, capped (a client writes what it
        // likes: it may inflate the totals, by at most 2^32 a look, never
        // wrap them or make them go down).
        let grew = |now: u64, seen: &mut u64| {
            let d = now.saturating_sub(*seen).min(MAX_GROWTH);
            *seen = (*seen).max(now);
            d
        };
        let d = TableAnswers {
            gets: grew(now.gets, &mut seen.gets),
            contains: grew(now.contains, &mut seen.contains),
            releases: grew(now.releases, &mut seen.releases),
        };
        let a = &mut st.answered;
        a.gets = a.gets.saturating_add(d.gets);
        a.contains = a.contains.saturating_add(d.contains);
        a.releases = a.releases.saturating_add(d.releases);
    }

    /// A client's counts as it wrote them (untrusted numbers).
    fn answers_of(region: &MmapRaw, slots: usize) -> TableAnswers {
        // Safety: as for `holds_of`: `COUNTS` u64s at `counts_offset`
        // (64-byte aligned) lie inside the region (`holds_region_len`).
        let counts = unsafe {
            std::slice::from_raw_parts(
                region.as_ptr().add(shared_table::counts_offset(slots)) as *const AtomicU64,
                shared_table::COUNTS,
            )
        };
        let (head, _) = Self::ring_of(region, slots);
        TableAnswers {
            gets: counts[shared_table::COUNT_GET].load(Ordering::Relaxed),
            contains: counts[shared_table::COUNT_CONTAINS].load(Ordering::Relaxed),
            releases: head.load(Ordering::Relaxed),
        }
    }

    /// The clients' holds regions as they are now, to be scanned without
    /// the table's lock (and off the store's thread): `stats`.
    pub fn hold_scan(&self) -> HoldScan {
        HoldScan {
            regions: self.lock().holds.values().map(|(r, _)| r.clone()).collect(),
            slots: self.slots,
        }
    }

    /// The objects published in `slots` now (slots empty now are skipped).
    pub fn objects_in(&self, slots: &[usize]) -> Vec<ObjectId> {
        let st = self.lock();
        slots
            .iter()
            .filter_map(|&i| st.taken.get(i).copied().flatten())
            .collect()
    }
}

/// The holds regions of the clients connected when it was taken (a region
/// stays mapped while a scan has it, even if its client has gone).
#[derive(Debug)]
pub struct HoldScan {
    regions: Vec<Arc<MmapRaw>>,
    slots: usize,
}

impl HoldScan {
    /// The slots at least one client holds: one pass over each region,
    /// O(clients × slots), without any lock. A moment's view: holds taken
    /// or released meanwhile may or may not be seen.
    pub fn held_slots(&self) -> Vec<usize> {
        let mut held = vec![false; self.slots];
        for region in &self.regions {
            for (i, h) in SharedTable::holds_of(region, self.slots).iter().enumerate() {
                if shared_table::held(h) > 0 {
                    held[i] = true;
                }
            }
        }
        held.iter()
            .enumerate()
            .filter_map(|(i, &h)| h.then_some(i))
            .collect()
    }
}

impl Readers for SharedTable {
    fn readable(&self, id: ObjectId, loc: Location) {
        let mut st = self.lock();
        if st.index.contains_key(&id) {
            return;
        }
        let words = shared_table::id_words(&id);
        let home = shared_table::home(&words, self.key, self.slots);
        let Some((k, i)) = shared_table::window_from(home, self.slots)
            .enumerate()
            .find(|&(_, i)| st.taken[i].is_none())
        else {
            return; // the window is full: this object is read the slow way
        };
        let slots = self.slots();
        if st.reach[home] as usize <= k {
            // Raised before the object is published, so a reader that
            // finds it published finds the home's reach covering it.
            st.reach[home] = k as u8 + 1;
            slots[home].set_reach(k as u32 + 1);
        }
        slots[i].publish(&words, loc.offset, loc.data_size, loc.metadata_size);
        st.taken[i] = Some(id);
        st.distance[i] = k as u8;
        st.index.insert(id, i);
    }

    fn unreadable(&self, id: ObjectId) -> Vec<(ClientId, u32)> {
        let mut st = self.lock();
        let Some(i) = st.index.remove(&id) else {
            return Vec::new();
        };
        st.taken[i] = None;
        self.slots()[i].retire();
        let mut adopted = Vec::new();
        for (&client, (region, _)) in &st.holds {
            let n = shared_table::adopt(&Self::holds_of(region, self.slots)[i]);
            if n > 0 {
                adopted.push((client, n));
            }
        }
        // Lowered after the object is retired: a reader with the old reach
        // only looks further than it needs to.
        let k = st.distance[i] as usize;
        let home = (i + self.slots - k) % self.slots;
        if st.reach[home] as usize == k + 1 {
            let reach = (0..k)
                .rev()
                .find(|&j| {
                    let at = (home + j) % self.slots;
                    st.taken[at].is_some() && st.distance[at] as usize == j
                })
                .map_or(0, |j| j + 1);
            st.reach[home] = reach as u8;
            self.slots()[home].set_reach(reach as u32);
        }
        adopted
    }

    fn held(&self) -> Vec<(ObjectId, u64)> {
        let st = self.lock();
        let mut out = Vec::new();
        for (id, &i) in &st.index {
            let n: u64 = st
                .holds
                .values()
                .map(|(region, _)| {
                    u64::from(shared_table::held(&Self::holds_of(region, self.slots)[i]))
                })
                .sum();
            if n > 0 {
                out.push((*id, n));
            }
        }
        out
    }

    fn held_among(&self, ids: &[ObjectId]) -> Vec<u64> {
        let st = self.lock();
        let held_at = |i: usize| -> u64 {
            st.holds
                .values()
                .map(|(region, _)| {
                    u64::from(shared_table::held(&Self::holds_of(region, self.slots)[i]))
                })
                .sum()
        };
        ids.iter()
            .map(|id| st.index.get(id).map_or(0, |&i| held_at(i)))
            .collect()
    }

    fn released(&self) -> Vec<ObjectId> {
        let mut st = self.lock();
        let st = &mut *st;
        let mut out = Vec::new();
        for (region, tail) in st.holds.values_mut() {
            let (head, ring) = Self::ring_of(region, self.slots);
            let (slots, next) = shared_table::drain_releases(head, ring, *tail, self.slots);
            *tail = next;
            out.extend(slots.into_iter().filter_map(|i| st.taken[i]));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(offset: u64) -> Location {
        Location {
            arena: 0,
            offset,
            data_size: 8,
            metadata_size: 0,
        }
    }

    /// `n` ids whose home is the same slot of `t`, and that slot.
    fn colliding(t: &SharedTable, n: usize) -> (usize, Vec<ObjectId>) {
        let mut by_home: HashMap<usize, Vec<ObjectId>> = HashMap::new();
        loop {
            let id = ObjectId::random();
            let h = shared_table::home(&shared_table::id_words(&id), t.key, t.slots);
            let ids = by_home.entry(h).or_default();
            ids.push(id);
            if ids.len() == n {
                return (h, ids.clone());
            }
        }
    }

    /// The id whose home is `h` (a fresh one).
    fn homed_at(t: &SharedTable, h: usize) -> ObjectId {
        loop {
            let id = ObjectId::random();
            if shared_table::home(&shared_table::id_words(&id), t.key, t.slots) == h {
                return id;
            }
        }
    }

    fn reach(t: &SharedTable, h: usize) -> u32 {
        t.slots()[h].read().expect("a quiet slot").reach
    }

    #[test]
    fn a_home_reaches_exactly_as_far_as_its_furthest_object() {
        let t = SharedTable::create(shared_table::PROBES).expect("a table");
        let holds: Vec<AtomicU32> = (0..t.slots).map(|_| AtomicU32::new(0)).collect();
        let findable = |id: &ObjectId| {
            matches!(
                shared_table::take(t.slots(), &holds, t.key, id, true),
                shared_table::Take::Held(..)
            )
        };
        let features = t.header().features.load(Ordering::Relaxed);
        assert_eq!(
            features & shared_table::FEATURE_REACH,
            shared_table::FEATURE_REACH,
            "says it keeps reaches"
        );
        let (h, ids) = colliding(&t, 3);
        assert_eq!(reach(&t, h), 0, "no object yet");
        for (k, id) in ids.iter().enumerate() {
            t.readable(*id, loc(k as u64 * 64));
            assert_eq!(reach(&t, h), k as u32 + 1);
        }
        // Another home's object pushed past this home's objects: its own
        // home reaches it; this one's reach stays.
        let next = (h + 1) % t.slots;
        let other = homed_at(&t, next);
        t.readable(other, loc(4096));
        assert_eq!(reach(&t, next), 3, "two slots past its home");
        assert_eq!(reach(&t, h), 3);
        assert!(ids.iter().chain([&other]).all(findable));

        // The furthest goes: the reach shrinks to the next furthest.
        t.unreadable(ids[2]);
        assert_eq!(reach(&t, h), 2);
        assert!(!findable(&ids[2]));
        // A nearer one goes: the reach stays (the middle one is still out).
        t.unreadable(ids[0]);
        assert_eq!(reach(&t, h), 2);
        assert!(findable(&ids[1]) && findable(&other));
        t.unreadable(ids[1]);
        assert_eq!(reach(&t, h), 0, "none left");
        assert!(findable(&other));
        t.unreadable(other);
        assert_eq!(reach(&t, next), 0);
    }

    /// 10^5 objects in a table three quarters full, then half of them
    /// gone: every object published is found through its home's reach,
    /// every reach is exactly one past its furthest object, and ids not in
    /// the table are not.
    #[test]
    fn reaches_stay_exact_with_a_hundred_thousand_objects() {
        let t = SharedTable::create(1 << 17).expect("a table");
        let holds: Vec<AtomicU32> = (0..t.slots).map(|_| AtomicU32::new(0)).collect();
        let ids: Vec<ObjectId> = (0..100_000).map(|_| ObjectId::random()).collect();
        for (k, id) in ids.iter().enumerate() {
            t.readable(*id, loc(k as u64 * 64));
        }
        let check = |live: &[ObjectId]| {
            let st = t.lock();
            let mut furthest = vec![0u32; t.slots];
            for id in live {
                let Some(&i) = st.index.get(id) else {
                    continue; // its window was full: not published
                };
                let h = shared_table::home(&shared_table::id_words(id), t.key, t.slots);
                let k = st.distance[i] as u32;
                assert_eq!((h + k as usize) % t.slots, i);
                furthest[h] = furthest[h].max(k + 1);
            }
            for (h, f) in furthest.iter().enumerate() {
                assert_eq!(reach(&t, h), *f, "slot {h}'s reach");
            }
            let published = live.iter().filter(|id| st.index.contains_key(*id)).count();
            drop(st);
            let found = live
                .iter()
                .filter(|id| {
                    let took = shared_table::take(t.slots(), &holds, t.key, id, true);
                    if let shared_table::Take::Held(i, _) = took {
                        holds[i].store(0, Ordering::Relaxed);
                    }
                    matches!(took, shared_table::Take::Held(..))
                })
                .count();
            assert_eq!(found, published);
            // Three quarters full, a few windows of 16 fill (those objects
            // are read the slow way); nearly all are published.
            assert!(published * 100 >= live.len() * 95, "{published} published");
            for _ in 0..1000 {
                let absent = ObjectId::random();
                let took = shared_table::take(t.slots(), &holds, t.key, &absent, true);
                assert_eq!(took, shared_table::Take::Absent);
            }
        };
        check(&ids);
        for id in ids.iter().step_by(2) {
            t.unreadable(*id);
        }
        let left: Vec<ObjectId> = ids.iter().skip(1).step_by(2).copied().collect();
        check(&left);
    }

    // What clients answered from the table, as the metrics count it.
    use memmap2::MmapOptions;
    use std::fs::File;

    /// The client's side of the holds region of `client`, mapped from the
    /// descriptor the store hands it.
    fn client_counts(t: &SharedTable, client: ClientId) -> (MmapRaw, usize) {
        let fd = t.add_client(client).unwrap();
        let map = MmapOptions::new()
            .len(shared_table::holds_region_len(t.slots))
            .map_raw(&File::from(fd))
            .unwrap();
        (map, t.slots)
    }

    fn write(map: &MmapRaw, slots: usize, which: usize, v: u64) {
        // Safety: inside the region (`holds_region_len`), 8-aligned.
        let c = unsafe {
            &*(map
                .as_ptr()
                .add(shared_table::counts_offset(slots) + 8 * which)
                as *const AtomicU64)
        };
        c.store(v, Ordering::Relaxed);
    }

    #[test]
    fn counts_only_grow_and_outlive_their_client() {
        let t = SharedTable::create(64).unwrap();
        let (a, slots) = client_counts(&t, 1);
        let (b, _) = client_counts(&t, 2);
        write(&a, slots, shared_table::COUNT_GET, 10);
        write(&b, slots, shared_table::COUNT_CONTAINS, 4);
        let got = t.take_answered();
        assert_eq!((got.gets, got.contains, got.releases), (10, 4, 0));
        // Taken: nothing new.
        assert_eq!(t.take_answered(), TableAnswers::default());
        // A client that writes its count down, then up to where it was,
        // adds nothing; beyond it, the growth.
        write(&a, slots, shared_table::COUNT_GET, 0);
        assert_eq!(t.take_answered().gets, 0);
        write(&a, slots, shared_table::COUNT_GET, 12);
        assert_eq!(t.take_answered().gets, 2);
        // A client that writes the largest count adds at most 2^32 a look:
        // the store's totals never wrap.
        write(&a, slots, shared_table::COUNT_GET, u64::MAX);
        assert_eq!(t.take_answered().gets, MAX_GROWTH);
        assert_eq!(t.take_answered().gets, 0);
        // What a client counted before it went is kept.
        write(&b, slots, shared_table::COUNT_CONTAINS, 9);
        t.remove_client(2);
        assert_eq!(t.take_answered().contains, 5);
    }
}
