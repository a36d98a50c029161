//! The references this process holds, and the releases not sent yet.
//!
//! References are counted per object; the creator's reference of each
//! created object is tracked apart (`creators`). A release never waits: it
//! is queued here and written in front of the session's next request, or by
//! a small flusher thread within [`RELEASE_DELAY`], so a get/release loop
//! wakes the store once per get. This module keeps the books; the session
//! does the writing.

use crate::creators::Creators;
use ferroplasma_protocol::{IdHasher, ObjectId};
use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How long a release may wait for a request to ride along with.
pub const RELEASE_DELAY: Duration = Duration::from_millis(1);

/// The books of one session.
#[derive(Debug, Default)]
pub(crate) struct Releases {
    held: Mutex<HashMap<ObjectId, u64, IdHasher>>,
    creators: Mutex<Creators>,
    deferred: Mutex<Deferred>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct Deferred {
    ids: Vec<ObjectId>,
    flusher_started: bool,
    flusher_waiting: bool,
}

impl Releases {
    /// Counts one more reference to `id`.
    pub(crate) fn add_held(&self, id: ObjectId) {
        *self.lock_held().entry(id).or_insert(0) += 1;
    }

    /// Counts one more reference to each id.
    pub(crate) fn add_held_all<'a>(&self, ids: impl Iterator<Item = &'a ObjectId>) {
        let mut held = self.lock_held();
        for id in ids {
            *held.entry(*id).or_insert(0) += 1;
        }
    }

    /// Whether a reference to `id` is held.
    pub(crate) fn holds(&self, id: ObjectId) -> bool {
        self.lock_held().contains_key(&id)
    }

    /// Takes one reference to `id` off the count; false if none was held.
    pub(crate) fn take_held(&self, id: ObjectId) -> bool {
        take_one(&mut self.lock_held(), id)
    }

    /// The ids of `ids` this process held a reference to, each taken off.
    pub(crate) fn take_held_all(&self, ids: impl IntoIterator<Item = ObjectId>) -> Vec<ObjectId> {
        let mut held = self.lock_held();
        ids.into_iter()
            .filter(|id| take_one(&mut held, *id))
            .collect()
    }

    /// The creator references.
    pub(crate) fn creators(&self) -> MutexGuard<'_, Creators> {
        self.creators.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues releases; true if the caller must start the flusher thread
    /// (none runs yet).
    pub(crate) fn defer(&self, ids: Vec<ObjectId>) -> bool {
        if ids.is_empty() {
            return false;
        }
        let mut d = self.lock_deferred();
        let was_empty = d.ids.is_empty();
        d.ids.extend(ids);
        if !d.flusher_started {
            d.flusher_started = true;
            return true;
        }
        if was_empty && d.flusher_waiting {
            self.wake.notify_one();
        }
        false
    }

    /// The flusher thread could not be started: the next `defer` tries again.
    pub(crate) fn flusher_not_started(&self) {
        self.lock_deferred().flusher_started = false;
    }

    /// The queued releases, to be written now.
    pub(crate) fn take_deferred(&self) -> Vec<ObjectId> {
        std::mem::take(&mut self.lock_deferred().ids)
    }

    /// For the flusher: waits up to `timeout` for releases to be queued;
    /// true if some are.
    pub(crate) fn wait_for_deferred(&self, timeout: Duration) -> bool {
        let mut d = self.lock_deferred();
        if d.ids.is_empty() {
            d.flusher_waiting = true;
            let (g, _) = self
                .wake
                .wait_timeout(d, timeout)
                .unwrap_or_else(|p| p.into_inner());
            d = g;
            d.flusher_waiting = false;
        }
        !d.ids.is_empty()
    }

    fn lock_held(&self) -> MutexGuard<'_, HashMap<ObjectId, u64, IdHasher>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_deferred(&self) -> MutexGuard<'_, Deferred> {
        self.deferred.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn take_one(held: &mut HashMap<ObjectId, u64, IdHasher>, id: ObjectId) -> bool {
    match held.get_mut(&id) {
        Some(n) if *n > 1 => {
            *n -= 1;
            true
        }
        Some(_) => {
            held.remove(&id);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_queue() {
        let r = Releases::default();
        let id = ObjectId::random();
        r.add_held(id);
        r.add_held_all([id].iter());
        assert!(r.take_held(id) && r.take_held(id) && !r.take_held(id));
        assert!(r.defer(vec![id]), "the first release starts the flusher");
        assert!(!r.defer(vec![id]), "one flusher");
        assert_eq!(r.take_deferred(), vec![id, id]);
        assert!(!r.wait_for_deferred(Duration::from_millis(1)));
    }
}
