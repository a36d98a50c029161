//! The cached copies this member pulled from others: which of its local
//! objects the directory agent announces as copies rather than as new
//! objects. Each landed copy is counted until the agent hears of its
//! deletion, so that a copy evicted and pulled again before the agent has
//! handled the eviction is still a copy when its new seal is announced.

use ferroplasma_protocol::{IdHasher, ObjectId};
use std::collections::HashMap;

/// Landed copies per id, less the deletions the agent has handled.
#[derive(Debug, Default)]
pub struct Copies(HashMap<ObjectId, u32, IdHasher>);

impl Copies {
    /// Copies of `ids` were sealed here.
    pub fn landed(&mut self, ids: impl IntoIterator<Item = ObjectId>) {
        for id in ids {
            *self.0.entry(id).or_insert(0) += 1;
        }
    }

    /// The agent heard that the local object `id` is gone (a copy or not).
    pub fn dropped(&mut self, id: &ObjectId) {
        if let Some(n) = self.0.get_mut(id) {
            *n -= 1;
            if *n == 0 {
                self.0.remove(id);
            }
        }
    }

    /// Whether the local object `id` is a copy pulled from another member.
    pub fn contains(&self, id: &ObjectId) -> bool {
        self.0.contains_key(id)
    }
}
