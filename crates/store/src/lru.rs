//! [`Lru`], the default [`EvictionPolicy`]: least recently released first.
//!
//! An object enters when it becomes evictable (sealed with no references, or
//! its last reference released) and leaves when it is referenced again or
//! freed. Its position is the tick at which it entered, so the order is by
//! release time, as in Plasma.

use crate::policy::EvictionPolicy;
use ferroplasma_protocol::{IdHasher, ObjectId};
use std::collections::{BTreeMap, HashMap};

/// Evictable objects ordered by when they became evictable.
#[derive(Debug, Default)]
pub struct Lru {
    queue: BTreeMap<u64, (ObjectId, u64)>,
    ticks: HashMap<ObjectId, u64, IdHasher>,
    next_tick: u64,
    bytes: u64,
}

impl EvictionPolicy for Lru {
    fn add(&mut self, id: ObjectId, size: u64) {
        self.remove(&id);
        let tick = self.next_tick;
        self.next_tick += 1;
        self.queue.insert(tick, (id, size));
        self.ticks.insert(id, tick);
        self.bytes += size;
    }

    fn remove(&mut self, id: &ObjectId) {
        if let Some(tick) = self.ticks.remove(id) {
            if let Some((_, size)) = self.queue.remove(&tick) {
                self.bytes -= size;
            }
        }
    }

    fn victims(&self) -> Box<dyn Iterator<Item = ObjectId> + '_> {
        Box::new(self.queue.values().map(|&(id, _)| id))
    }

    fn bytes(&self) -> u64 {
        self.bytes
    }

    fn contains(&self, id: &ObjectId) -> bool {
        self.ticks.contains_key(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_recently_released_first() {
        let mut l = Lru::default();
        let [a, b, c] = [ObjectId::random(), ObjectId::random(), ObjectId::random()];
        l.add(a, 10);
        l.add(b, 20);
        l.add(c, 30);
        l.remove(&a);
        l.add(a, 10); // released again: now the most recent
        assert_eq!(l.victims().collect::<Vec<_>>(), vec![b, c, a]);
        assert_eq!(l.bytes(), 60);
        l.remove(&b);
        l.remove(&b);
        assert_eq!(
            (l.bytes(), l.contains(&b), l.contains(&c)),
            (40, false, true)
        );
    }
}
