//! The eviction queue: sealed, unreferenced objects, least recently used first.
//!
//! An object enters when it becomes evictable (sealed with no references, or
//! its last reference released) and leaves when it is referenced again or
//! freed. Its position is the tick at which it entered, so the order is by
//! release time, as in Plasma.

use ferroplasma_protocol::ObjectId;
use std::collections::BTreeMap;

/// Evictable objects ordered by when they became evictable.
#[derive(Debug, Default)]
pub(crate) struct LruQueue {
    queue: BTreeMap<u64, (ObjectId, u64)>,
    next_tick: u64,
    bytes: u64,
}

impl LruQueue {
    /// Adds an object of `size` bytes; returns its tick.
    pub fn push(&mut self, id: ObjectId, size: u64) -> u64 {
        let tick = self.next_tick;
        self.next_tick += 1;
        self.queue.insert(tick, (id, size));
        self.bytes += size;
        tick
    }

    /// Removes the entry at `tick`.
    pub fn remove(&mut self, tick: u64) {
        if let Some((_, size)) = self.queue.remove(&tick) {
            self.bytes -= size;
        }
    }

    /// The least recently used object.
    pub fn oldest(&self) -> Option<ObjectId> {
        self.queue.values().next().map(|&(id, _)| id)
    }

    /// Evictable objects, least recently used first.
    pub fn iter(&self) -> impl Iterator<Item = ObjectId> + '_ {
        self.queue.values().map(|&(id, _)| id)
    }

    /// Bytes held by evictable objects.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}
