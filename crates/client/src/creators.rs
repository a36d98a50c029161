//! The creator's reference of each object this client created.
//!
//! `create` takes a reference for the creator, as in Plasma. It belongs to
//! the [`MutableBuffer`](crate::MutableBuffer) and then to the sealed buffer
//! `seal` turns it into, and ends once, when that buffer is dropped: never
//! while something can still read the memory. An explicit `release` of the
//! id is accepted (code written as create → write → seal → release keeps
//! working) and changes nothing; after the buffer is gone it is remembered
//! as a no-op for the last [`REMEMBERED`] such objects; older ones are
//! forgotten so that a client creating millions of objects keeps no record
//! of each.

use ferroplasma_protocol::{IdHasher, ObjectId};
use std::collections::{HashMap, VecDeque};

/// How many creator references ended by their buffer's drop are remembered.
pub const REMEMBERED: usize = 4096;

#[derive(Debug, Clone, Copy)]
struct Creator {
    /// Which create (ids can be reused after a delete or an abort).
    token: u64,
    /// The buffer was dropped and gave the reference back.
    ended: bool,
}

/// What an explicit release of an id means for the creator's reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreatorRelease {
    /// Its buffer is alive and gives it back when dropped: nothing to do now.
    BufferAlive,
    /// Its buffer already gave it back: nothing to do.
    AlreadyEnded,
    /// This client holds no creator's reference to the id.
    NotCreator,
}

/// Creator references of one client.
#[derive(Debug, Default)]
pub struct Creators {
    by_id: HashMap<ObjectId, Creator, IdHasher>,
    next_token: u64,
    /// Ended references, oldest first, for forgetting.
    ended: VecDeque<(ObjectId, u64)>,
}

impl Creators {
    /// A create succeeded: returns the token its buffer carries.
    pub fn created(&mut self, id: ObjectId) -> u64 {
        self.next_token += 1;
        let token = self.next_token;
        self.by_id.insert(
            id,
            Creator {
                token,
                ended: false,
            },
        );
        token
    }

    /// The buffer of create `token` was dropped: true if the caller must
    /// give the reference back now (it was not released or aborted yet).
    pub fn buffer_dropped(&mut self, id: ObjectId, token: u64) -> bool {
        match self.by_id.get_mut(&id) {
            Some(c) if c.token == token && !c.ended => {
                c.ended = true;
                self.ended.push_back((id, token));
                if self.ended.len() > REMEMBERED {
                    let (old, old_token) = self.ended.pop_front().expect("not empty");
                    if self
                        .by_id
                        .get(&old)
                        .is_some_and(|c| c.token == old_token && c.ended)
                    {
                        self.by_id.remove(&old);
                    }
                }
                true
            }
            _ => false,
        }
    }

    /// An explicit release of `id`: never ends a reference a live buffer
    /// holds.
    pub fn release(&mut self, id: ObjectId) -> CreatorRelease {
        match self.by_id.get(&id) {
            Some(c) if c.ended => {
                self.by_id.remove(&id);
                CreatorRelease::AlreadyEnded
            }
            Some(_) => CreatorRelease::BufferAlive,
            None => CreatorRelease::NotCreator,
        }
    }

    /// The object was aborted (the store dropped the creator's reference
    /// with it): true if the reference was still held.
    pub fn aborted(&mut self, id: ObjectId) -> bool {
        self.by_id.remove(&id).is_some_and(|c| !c.ended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_reference_ended_once() {
        let mut c = Creators::default();
        let id = ObjectId::random();
        let t = c.created(id);
        assert_eq!(c.release(id), CreatorRelease::BufferAlive);
        assert!(
            c.buffer_dropped(id, t),
            "the buffer gives it back, not the release"
        );
        assert_eq!(c.release(id), CreatorRelease::AlreadyEnded);
        let t = c.created(id);
        assert!(c.buffer_dropped(id, t));
        assert!(!c.buffer_dropped(id, t), "never twice");
        assert_eq!(c.release(id), CreatorRelease::AlreadyEnded);
        assert_eq!(c.release(id), CreatorRelease::NotCreator);
    }

    #[test]
    fn a_stale_token_does_not_touch_a_later_create() {
        let mut c = Creators::default();
        let id = ObjectId::random();
        let old = c.created(id);
        assert!(c.aborted(id));
        let new = c.created(id);
        assert!(!c.buffer_dropped(id, old));
        assert!(c.buffer_dropped(id, new));
    }

    #[test]
    fn ended_references_are_forgotten_past_the_limit() {
        let mut c = Creators::default();
        let ids: Vec<ObjectId> = (0..REMEMBERED + 10).map(|_| ObjectId::random()).collect();
        for id in &ids {
            let t = c.created(*id);
            assert!(c.buffer_dropped(*id, t));
        }
        assert_eq!(c.by_id.len(), REMEMBERED);
        assert_eq!(c.release(ids[0]), CreatorRelease::NotCreator);
        assert_eq!(c.release(ids[REMEMBERED + 9]), CreatorRelease::AlreadyEnded);
        // Live (not ended) references are never forgotten.
        let live = ObjectId::random();
        c.created(live);
        for _ in 0..2 * REMEMBERED {
            let id = ObjectId::random();
            let t = c.created(id);
            c.buffer_dropped(id, t);
        }
        assert_eq!(c.release(live), CreatorRelease::BufferAlive);
    }
}
