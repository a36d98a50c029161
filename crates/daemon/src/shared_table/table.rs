//! One table in shared memory: its memfd (mapped here read-write, handed
//! to clients read-only), its size and hash key, and the reads the store
//! makes of its own slots.

use crate::arena::Arena;
use crate::DaemonError;
use ferroplasma_protocol::shared_table::{self, Header, Slot, HEADER_BYTES};
use ferroplasma_protocol::ObjectId;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;

/// One table: its memory and the read-only descriptor clients get.
#[derive(Debug)]
pub(super) struct Table {
    pub(super) map: Arena,
    pub(super) read_only: OwnedFd,
    pub(super) slots: usize,
    pub(super) key: u64,
}

impl Table {
    pub(super) fn create(slots: usize) -> Result<Self, DaemonError> {
        let slots = slots.max(shared_table::PROBES);
        let map = Arena::create_store_writable(shared_table::table_len(slots) as u64)?;
        // Backed now (16 MiB by default, a few ms at start): every seal
        // publishes into a random slot, and a first touch of its page would
        // cost that seal a page fault.
        map.prefault();
        let key = u64::from_le_bytes(random()?[..8].try_into().expect("8 bytes"));
        let read_only = map.read_only_fd()?;
        let t = Self {
            map,
            read_only,
            slots,
            key,
        };
        let h = t.header();
        h.slots.store(slots as u64, Ordering::Relaxed);
        h.key.store(key, Ordering::Relaxed);
        h.features.store(
            shared_table::FEATURE_REACH
                | shared_table::FEATURE_COUNTS
                | shared_table::FEATURE_REPLACED,
            Ordering::Relaxed,
        );
        h.magic.store(shared_table::MAGIC, Ordering::Release);
        Ok(t)
    }

    pub(super) fn header(&self) -> &Header {
        // Safety: the mapping is page-aligned and at least one header long;
        // `Header` is a `repr(C)` block of atomics, valid for any bytes
        // (zeroed memory included), and the mapping lives as long as `self`.
        unsafe { &*(self.map.ptr() as *const Header) }
    }

    pub(super) fn slots(&self) -> &[Slot] {
        // Safety: as for `header`: the slots follow the header inside the
        // mapping (sized by `table_len(slots)`, and `HEADER_BYTES` keeps
        // them 4-byte aligned), `Slot` is a `repr(C)` block of atomics valid
        // for any bytes.
        unsafe {
            std::slice::from_raw_parts(self.map.ptr().add(HEADER_BYTES) as *const Slot, self.slots)
        }
    }

    pub(super) fn words(&self, id: &ObjectId) -> ([u64; 3], usize) {
        let words = shared_table::id_words(id);
        let home = shared_table::home(&words, self.key, self.slots);
        (words, home)
    }

    /// The slot `id` is published in (the store is the only writer, and
    /// holds the lock: its reads of its own slots are consistent).
    pub(super) fn find(&self, id: &ObjectId) -> Option<usize> {
        let (words, home) = self.words(id);
        let slots = self.slots();
        let reach = slots.get(home)?.reach_now() as usize;
        shared_table::window_of(home, self.slots, reach).find(|&i| {
            let v = &slots[i];
            v.state_now() == shared_table::SEALED && v.words_now() == words
        })
    }

    /// The home slot of the object in slot `i` (whatever its state).
    pub(super) fn home_of(&self, i: usize) -> usize {
        shared_table::home(&self.slots()[i].words_now(), self.key, self.slots)
    }

    /// The object published in slot `i`, if any.
    pub(super) fn object_at(&self, i: usize) -> Option<ObjectId> {
        let v = self.slots().get(i)?;
        (v.state_now() == shared_table::SEALED).then(|| shared_table::id_of_words(&v.words_now()))
    }
}

pub(super) fn random() -> Result<[u8; 16], DaemonError> {
    let mut k = [0u8; 16];
    getrandom::fill(&mut k)
        .map_err(|e| DaemonError::io("random bytes", std::io::Error::other(e.to_string())))?;
    Ok(k)
}
