//! [`EvictionPolicy`]: which objects to evict, kept apart from how they are
//! evicted (the store's `make_room` and `evict`), as Plasma did. The store
//! tells the policy when an object becomes evictable (sealed, nobody
//! references it) and when it stops being so; the policy names victims in
//! the order to evict them. By default the store keeps the order of
//! [`Lru`](crate::lru::Lru) (least recently released first) itself, in its
//! object table; [`Store::with_policy`](crate::Store::with_policy) takes
//! another.

use ferroplasma_protocol::ObjectId;

/// Chooses the objects to evict.
pub trait EvictionPolicy: std::fmt::Debug + Send {
    /// `id`, holding `size` bytes of the arena, became evictable.
    fn add(&mut self, id: ObjectId, size: u64);
    /// `id` is no longer evictable (referenced again, spilled or gone).
    /// Unknown ids are ignored.
    fn remove(&mut self, id: &ObjectId);
    /// The evictable objects, first victim first.
    fn victims(&self) -> Box<dyn Iterator<Item = ObjectId> + '_>;
    /// Bytes held by evictable objects.
    fn bytes(&self) -> u64;
    /// Whether `id` is evictable.
    fn contains(&self, id: &ObjectId) -> bool;
}
