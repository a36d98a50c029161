//! [`Lru`], an [`EvictionPolicy`]: least recently released first.
//!
//! An object enters when it becomes evictable (sealed with no references, or
//! its last reference released) and leaves when it is referenced again or
//! freed. The order is by release time, as in Plasma.
//!
//! The store keeps this same order itself, as a list through its object
//! table (`Store::new`: no second copy of each id); `Lru` is that order as
//! a policy of its own, for [`Store::with_policy`](crate::Store::with_policy)
//! and as the model the store's order is tested against. It is a
//! `DenseTable` (`dense.rs`) of 36-byte nodes (id, links, size) with the list through
//! them: O(1) to add, move to the back and remove, about 45 bytes an object
//! with its index.

use crate::dense::{DenseTable, Keyed, Links};
use crate::policy::EvictionPolicy;
use ferroplasma_protocol::ObjectId;

/// One evictable object: its id, its place in the order and its size (two
/// halves, so that the node is 36 bytes, not 40).
#[derive(Debug, Clone)]
struct Node {
    id: ObjectId,
    links: Links,
    size: [u32; 2],
}

const _: () = assert!(std::mem::size_of::<Node>() == 36);

impl Keyed for Node {
    fn id(&self) -> &ObjectId {
        &self.id
    }

    fn links(&self) -> Links {
        self.links
    }

    fn links_mut(&mut self) -> &mut Links {
        &mut self.links
    }

    fn weight(&self) -> u64 {
        u64::from(self.size[0]) | u64::from(self.size[1]) << 32
    }
}

/// Evictable objects ordered by when they became evictable.
#[derive(Debug, Default)]
pub struct Lru {
    /// Every node is in the list, oldest release first.
    nodes: DenseTable<Node>,
}

impl EvictionPolicy for Lru {
    fn add(&mut self, id: ObjectId, size: u64) {
        let node = Node {
            id,
            links: Links::OUT,
            size: [size as u32, (size >> 32) as u32],
        };
        let p = self.nodes.insert(node);
        self.nodes.push_back_at(p);
    }

    fn remove(&mut self, id: &ObjectId) {
        self.nodes.remove(id);
    }

    fn victims(&self) -> Box<dyn Iterator<Item = ObjectId> + '_> {
        Box::new(self.nodes.list().map(|n| n.id))
    }

    fn bytes(&self) -> u64 {
        self.nodes.list_weight()
    }

    fn contains(&self, id: &ObjectId) -> bool {
        self.nodes.contains_key(id)
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
    /// the live ones by release time, each kept once.
    #[test]
    fn churn_keeps_the_order_and_each_object_once() {
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
            assert_eq!(l.nodes.len(), order.len(), "each evictable object once");
        }
    }
}
