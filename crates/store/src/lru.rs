//! [`Lru`], the default [`EvictionPolicy`]: least recently released first.
//!
//! An object enters when it becomes evictable (sealed with no references, or
//! its last reference released) and leaves when it is referenced again or
//! freed. Its position is the tick at which it entered, so the order is by
//! release time, as in Plasma.
//!
//! Ticks only grow, so the order is a queue: an object enters at the back
//! in O(1), and leaving only forgets its tick (O(1)); its entry in the
//! queue is then stale, skipped by [`EvictionPolicy::victims`] and dropped
//! when it reaches the front or when stale entries outnumber live ones.
//! (A sorted map did the same in O(log n) with a node allocation per
//! entry, twice for every object a batched get lands and reads.)

use crate::policy::EvictionPolicy;
use ferroplasma_protocol::{IdHasher, ObjectId};
use std::collections::{HashMap, VecDeque};

/// Evictable objects ordered by when they became evictable.
#[derive(Debug, Default)]
pub struct Lru {
    /// (tick, id) in tick order; an entry whose tick is not its id's in
    /// `live` is stale.
    queue: VecDeque<(u64, ObjectId)>,
    /// Each evictable object's tick and size.
    live: HashMap<ObjectId, (u64, u64), IdHasher>,
    next_tick: u64,
    bytes: u64,
}

impl Lru {
    fn is_live(&self, tick: u64, id: &ObjectId) -> bool {
        self.live.get(id).is_some_and(|&(t, _)| t == tick)
    }

    /// Drops stale entries from the front, and rebuilds the queue when
    /// most of it is stale (each entry is dropped once: O(1) amortized).
    fn tidy(&mut self) {
        while let Some(&(tick, id)) = self.queue.front() {
            if self.is_live(tick, &id) {
                break;
            }
            self.queue.pop_front();
        }
        if self.queue.len() > 2 * self.live.len() + 64 {
            let live = &self.live;
            self.queue
                .retain(|(tick, id)| live.get(id).is_some_and(|&(t, _)| t == *tick));
        }
    }
}

impl EvictionPolicy for Lru {
    fn add(&mut self, id: ObjectId, size: u64) {
        let tick = self.next_tick;
        self.next_tick += 1;
        if let Some((_, old)) = self.live.insert(id, (tick, size)) {
            self.bytes -= old;
        }
        self.queue.push_back((tick, id));
        self.bytes += size;
        self.tidy();
    }

    fn remove(&mut self, id: &ObjectId) {
        if let Some((_, size)) = self.live.remove(id) {
            self.bytes -= size;
            self.tidy();
        }
    }

    fn victims(&self) -> Box<dyn Iterator<Item = ObjectId> + '_> {
        Box::new(
            self.queue
                .iter()
                .filter(|(tick, id)| self.is_live(*tick, id))
                .map(|&(_, id)| id),
        )
    }

    fn bytes(&self) -> u64 {
        self.bytes
    }

    fn contains(&self, id: &ObjectId) -> bool {
        self.live.contains_key(id)
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

    /// Objects entering and leaving in any order: the victims are always
    /// the live ones by release time, and the queue keeps no more than a
    /// bounded share of stale entries.
    #[test]
    fn churn_keeps_the_order_and_a_bounded_queue() {
        let mut l = Lru::default();
        let ids: Vec<ObjectId> = (0..500).map(|_| ObjectId::random()).collect();
        // The model: ids by release time.
        let mut order: Vec<ObjectId> = Vec::new();
        for round in 0..40usize {
            for (k, id) in ids.iter().enumerate() {
                if (k * 7 + round) % 3 == 0 {
                    l.remove(id);
                    order.retain(|x| x != id);
                } else if (k + round) % 5 != 0 {
                    l.add(*id, k as u64);
                    order.retain(|x| x != id);
                    order.push(*id);
                }
            }
            assert_eq!(l.victims().collect::<Vec<_>>(), order, "round {round}");
            let bytes: u64 = order
                .iter()
                .map(|id| ids.iter().position(|x| x == id).unwrap() as u64)
                .sum();
            assert_eq!(l.bytes(), bytes);
            assert!(order.iter().all(|id| l.contains(id)));
            assert!(
                l.queue.len() <= 2 * order.len() + 65,
                "stale entries pile up"
            );
        }
    }
}
