//! Readers that take references without asking the store: the hook through
//! which the daemon's shared object table (`ferroplasma_protocol::shared_table`)
//! learns which objects are readable, and through which the store, before
//! it frees, evicts, spills or deletes an object, learns which clients hold
//! it (their holds become ordinary references). The store calls it; it does
//! no I/O of its own.

use crate::object::{ClientId, Location};
use ferroplasma_protocol::ObjectId;

/// Where sealed objects are published for reads without a round trip.
pub trait Readers: std::fmt::Debug + Send + Sync {
    /// `id` is sealed, in memory and readable at `loc` (called again for
    /// objects already published: a no-op then). False when the readers'
    /// table could not take it or is crowded: the store then calls
    /// [`Readers::resize_for`] and, if asked to, [`Readers::rebuild`].
    fn readable(&self, id: ObjectId, loc: Location) -> bool;

    /// `id` stops being readable without asking (it is about to be freed,
    /// evicted, spilled or deleted). Returns the clients that hold it and
    /// how many holds each: the store turns them into references first.
    fn unreadable(&self, id: ObjectId) -> Vec<(ClientId, u32)>;

    /// Whether the readers' table should be rebuilt for `objects` readable
    /// objects (`full`: a publish just failed): the number of slots to
    /// rebuild it with, or `None` to keep it.
    fn resize_for(&self, objects: usize, full: bool) -> Option<usize> {
        let _ = (objects, full);
        None
    }

    /// Rebuilds the table with `slots` slots, publishing `objects` (every
    /// readable object) there, and takes the old one out of use. Returns
    /// the holds clients had taken in the old table, by object: the store
    /// turns them into references, as for [`Readers::unreadable`].
    fn rebuild(
        &self,
        slots: usize,
        objects: &mut dyn Iterator<Item = (ObjectId, Location)>,
    ) -> Vec<(ObjectId, ClientId, u32)> {
        let _ = (slots, objects);
        Vec::new()
    }

    /// The objects held without asking now, with the number of holds (for
    /// `list` and `stats`, which count them as references).
    fn held(&self) -> Vec<(ObjectId, u64)> {
        Vec::new()
    }

    /// The holds on each of `ids` (for a page of a listing). The default
    /// asks [`Readers::held`], a pass over every hold; a reader that can
    /// look ids up answers in O(ids).
    fn held_among(&self, ids: &[ObjectId]) -> Vec<u64> {
        let held: std::collections::HashMap<ObjectId, u64> = self.held().into_iter().collect();
        ids.iter()
            .map(|id| held.get(id).copied().unwrap_or(0))
            .collect()
    }

    /// The objects released without asking since the last call, oldest
    /// first (the store moves them to the back of its eviction order).
    fn released(&self) -> Vec<ObjectId> {
        Vec::new()
    }
}
