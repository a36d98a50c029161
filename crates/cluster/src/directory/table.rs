//! The part of the object directory one member keeps: for each id it owns
//! (or backs up), whether the object is being created, sealed or lost, and
//! which members hold a copy. Pure state: the gRPC service and the failure
//! detector drive it.

use ferroplasma_protocol::{IdHasher, ObjectId};
use smallvec::SmallVec;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A member's name as entries keep it: one allocation per member, shared
/// by every entry that names it (an entry's books allocate nothing of
/// their own for the members they list).
pub type Member = Arc<str>;

/// The members holding a copy: inline up to two (the primary and one
/// cached copy) without a heap allocation.
pub type Holders = SmallVec<[Member; 2]>;

/// What the directory knows of one id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Claimed by a member that has not sealed it yet.
    Creating {
        /// The creating member.
        by: Member,
    },
    /// Sealed; at least one member holds a copy.
    Sealed,
    /// Sealed once; every member that held a copy died.
    Lost,
    /// Deleted while members that may still hold a copy (`stale`) could not
    /// drop it: kept so that their copies are refused when they report
    /// them, until each reports its copy dropped (or restarts).
    Deleted,
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Where the object stands.
    pub state: State,
    /// Members holding a copy; the primary (creator) first while it has one.
    pub holders: Holders,
    /// The member that claimed the id (or first reported a primary copy):
    /// only it may report a primary copy later, so that a member coming
    /// back from a pause never takes over an id created again meanwhile.
    pub creator: Option<Member>,
    /// Members that held a copy of this object and were declared dead: one
    /// that comes back (it was only paused or cut off) holds it again.
    pub away: Vec<Member>,
    /// Members that may still hold a copy of an earlier object under this
    /// id (deleted, or lost and created again): their copies are refused,
    /// and they are forgotten once they report the copy dropped.
    pub stale: Vec<Member>,
    /// When the primary copy was sealed (µs since the epoch; 0 unknown):
    /// of two primaries reported under one id, the later wins.
    pub version: u64,
    /// Data size, once sealed.
    pub data_size: u64,
    /// Metadata size, once sealed.
    pub metadata_size: u64,
}

/// A copy appearing or going away on a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The creator sealed it.
    SealedPrimary {
        /// Data size.
        data_size: u64,
        /// Metadata size.
        metadata_size: u64,
        /// When it was sealed (µs since the epoch).
        version: u64,
    },
    /// A member pulled a cached copy.
    SealedCached {
        /// Data size.
        data_size: u64,
        /// Metadata size.
        metadata_size: u64,
    },
    /// The member's sealed copy is gone.
    Dropped,
    /// The member's unsealed claim is gone (create aborted).
    Aborted,
}

/// The answer to a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Reserved for the claimant.
    Granted,
    /// Taken: being created or sealed elsewhere.
    Refused,
    /// No answer yet: the claimant and this member see different rings, or
    /// not every member has re-registered with this one since the ring
    /// changed, so an id it does not know may still be held somewhere.
    NotNow(&'static str),
}

/// Which ring the entries are complete for: after a ring change, a member
/// knows every copy of the ids it answers for only once each member of the
/// ring has re-registered everything it holds (and said so).
#[derive(Debug, Default)]
struct Rebuild {
    /// The current ring's fingerprint.
    ring: u64,
    /// Its members (this one included).
    members: Vec<String>,
    /// For each member, the last ring it said it had re-registered for.
    synced: HashMap<String, u64>,
}

/// The entries this member keeps.
#[derive(Debug, Default)]
pub struct Directory {
    /// Boxed: the table then holds an id and a pointer per slot, and a
    /// table of a million entries (2^21 slots) takes 69 MB of slots
    /// instead of 385 MB (memory_per_entry_of_a_million).
    entries: HashMap<ObjectId, Box<Entry>, IdHasher>,
    rebuild: Rebuild,
    /// Every member name the entries have used, once.
    names: HashSet<Member>,
}

impl Directory {
    /// An empty directory.
    pub fn new() -> Self {
        Self::default()
    }

    /// `node`'s shared name (made on its first use).
    fn name(&mut self, node: &str) -> Member {
        if let Some(m) = self.names.get(node) {
            return m.clone();
        }
        let m: Member = node.into();
        self.names.insert(m.clone());
        m
    }

    /// Number of entries kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no entry is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The ring changed to `members` (fingerprint `ring`): the directory is
    /// incomplete until each of them re-registers for it. The marks for the
    /// ring left behind no longer count (were it formed again, its members
    /// would re-register anew); a member that already re-registered for a
    /// ring this member has not reached yet (its news overtook this
    /// member's own, maybe across rings in between) keeps its mark.
    pub fn set_ring(&mut self, ring: u64, members: Vec<String>) {
        let left = std::mem::replace(&mut self.rebuild.ring, ring);
        self.rebuild.members = members;
        if left != ring {
            self.rebuild.synced.retain(|_, r| *r != left);
        }
    }

    /// The current ring's fingerprint.
    pub fn ring(&self) -> u64 {
        self.rebuild.ring
    }

    /// `node` has re-registered everything it holds for ring `ring`.
    pub fn synced(&mut self, node: &str, ring: u64) {
        self.rebuild.synced.insert(node.into(), ring);
    }

    /// Whether every member of the ring has re-registered for it.
    pub fn is_complete(&self) -> bool {
        let r = &self.rebuild;
        r.members.iter().all(|m| r.synced.get(m) == Some(&r.ring))
    }

    /// Answers a claim of `id` by `node`, made in ring `ring`. A refusal
    /// needs only the entry at hand; a grant needs the claimant to see the
    /// same ring and the directory to be complete for it, because an id
    /// this member does not know may be held by a member that has not
    /// re-registered yet. A re-claim (`rejoin`: an id granted to `node`
    /// before the ring changed) is recorded whenever nothing refuses it.
    pub fn claim_in_ring(&mut self, id: ObjectId, node: &str, ring: u64, rejoin: bool) -> Claim {
        match self.entries.get(&id).map(|e| &e.state) {
            Some(State::Creating { by }) => {
                return if **by == *node {
                    Claim::Granted
                } else {
                    Claim::Refused
                }
            }
            Some(State::Sealed) => return Claim::Refused,
            _ => {}
        }
        if !rejoin {
            if ring != self.rebuild.ring {
                return Claim::NotNow(
                    "the members disagree on the ring (a membership change is under way)",
                );
            }
            if !self.is_complete() {
                return Claim::NotNow("the directory is being rebuilt after a membership change");
            }
        }
        if self.claim(id, node) {
            Claim::Granted
        } else {
            Claim::Refused
        }
    }

    /// Reserves `id` for an object `node` is about to create. Refused when
    /// another member is creating it or any member holds a sealed copy.
    pub fn claim(&mut self, id: ObjectId, node: &str) -> bool {
        let mut stale = Vec::new();
        match self.entries.get_mut(&id) {
            None => {}
            Some(e) => match &e.state {
                State::Lost | State::Deleted => {
                    // Created again: what was left of the old object is stale.
                    stale = std::mem::take(&mut e.stale);
                    stale.append(&mut e.away);
                }
                State::Creating { by } => return **by == *node,
                State::Sealed => return false,
            },
        }
        // The claimer has no copy of an older object under this id (its
        // store refused the create otherwise).
        stale.retain(|h| **h != *node);
        let by = self.name(node);
        self.entries.insert(
            id,
            Box::new(Entry {
                state: State::Creating { by: by.clone() },
                holders: Holders::new(),
                creator: Some(by),
                away: Vec::new(),
                stale,
                version: 0,
                data_size: 0,
                metadata_size: 0,
            }),
        );
        true
    }

    /// Applies one change reported by `node`. Returns false, and changes
    /// nothing, for a copy the member should drop: a cached copy of an id
    /// with no entry (deleted meanwhile) unless `rejoin` (a re-registration
    /// after a membership change, when the entry may not have arrived yet),
    /// and a primary copy of an id that another member claimed or created
    /// (the id was lost, or its claim lapsed, while `node` was cut off, and
    /// was taken again: one id never names two objects).
    pub fn update(&mut self, id: ObjectId, node: &str, change: Change, rejoin: bool) -> bool {
        let refused = |e: &Entry| e.state == State::Deleted || e.stale.iter().any(|h| **h == *node);
        match change {
            Change::SealedPrimary {
                data_size,
                metadata_size,
                version,
            } => {
                let name = self.name(node);
                if let Some(e) = self.entries.get_mut(&id) {
                    let other = e.creator.as_deref().is_some_and(|c| c != node);
                    let refuse = match &e.state {
                        // Someone's claim is in progress.
                        State::Creating { by } => **by != *node,
                        // The deleted object itself (or an older one).
                        State::Deleted => version <= e.version,
                        // Another member's object, sealed no earlier.
                        State::Sealed | State::Lost => other && version <= e.version,
                    };
                    if refuse {
                        return false;
                    }
                    if other && e.state != State::Deleted {
                        // A later object replaces one lost meanwhile: what
                        // is left of that one is stale.
                        let old: Vec<Member> =
                            e.holders.drain(..).chain(e.away.drain(..)).collect();
                        e.stale.extend(old);
                    }
                }
                let e = self
                    .entries
                    .entry(id)
                    .or_insert_with(|| Box::new(Entry::sealed(data_size, metadata_size)));
                e.state = State::Sealed;
                e.creator = Some(name.clone());
                e.version = version;
                e.data_size = data_size;
                e.metadata_size = metadata_size;
                e.holders.retain(|h| **h != *node);
                e.holders.insert(0, name);
                e.away.retain(|h| **h != *node);
                e.stale.retain(|h| **h != *node);
                true
            }
            Change::SealedCached {
                data_size,
                metadata_size,
            } => {
                let name = self.name(node);
                let e = match self.entries.get_mut(&id) {
                    Some(e) => e,
                    None if rejoin => self
                        .entries
                        .entry(id)
                        .or_insert_with(|| Box::new(Entry::sealed(data_size, metadata_size))),
                    None => return false,
                };
                if refused(e) || matches!(e.state, State::Creating { .. }) {
                    // Deleted, or lost and being created again: this copy is stale.
                    return false;
                }
                e.state = State::Sealed;
                if !e.holders.iter().any(|h| **h == *node) {
                    e.holders.push(name);
                }
                e.away.retain(|h| **h != *node);
                true
            }
            Change::Dropped | Change::Aborted => {
                let Some(e) = self.entries.get_mut(&id) else {
                    return true;
                };
                let claimed = matches!(&e.state, State::Creating { by } if **by == *node);
                if change == Change::Aborted {
                    if claimed {
                        if e.stale.is_empty() {
                            self.entries.remove(&id);
                        } else {
                            e.state = State::Deleted;
                        }
                    }
                    return true;
                }
                let held = e.holders.len();
                e.holders.retain(|h| **h != *node);
                e.away.retain(|h| **h != *node);
                e.stale.retain(|h| **h != *node);
                if e.state == State::Sealed && held > 0 && e.holders.is_empty() {
                    if !e.away.is_empty() {
                        // Evicted everywhere but on members that may return.
                        e.state = State::Lost;
                    } else if !e.stale.is_empty() {
                        e.state = State::Deleted;
                    } else {
                        self.entries.remove(&id);
                    }
                } else if e.state == State::Deleted && e.stale.is_empty() {
                    self.entries.remove(&id);
                }
                true
            }
        }
    }

    /// The entry for `id`, if any.
    pub fn lookup(&self, id: &ObjectId) -> Option<&Entry> {
        self.entries.get(id).map(|e| &**e)
    }

    /// Deletes the entry of an object; returns it, with the members that
    /// were away (they may hold a copy) among its holders. When some member
    /// may still hold a copy, a [`State::Deleted`] entry stays behind, so
    /// that the copy is refused when reported, until each such member has
    /// reported dropping it.
    pub fn forget(&mut self, id: &ObjectId) -> Option<Entry> {
        let mut e = self.entries.remove(id)?;
        let mut pending: Holders = e.holders.clone();
        pending.extend(e.away.iter().cloned());
        let mut stale = e.stale.clone();
        stale.extend(pending.iter().cloned());
        stale.sort();
        stale.dedup();
        if !stale.is_empty() {
            let mut tomb = Entry::sealed(0, 0);
            tomb.state = State::Deleted;
            tomb.creator = e.creator.clone();
            tomb.version = e.version;
            tomb.stale = stale;
            self.entries.insert(*id, Box::new(tomb));
        }
        e.holders = pending;
        Some(*e)
    }

    /// A member died: its copies are gone; objects with no copy left become
    /// [`State::Lost`], and so do its claims (it may have sealed the object
    /// and died before the directory heard: a get of it then answers
    /// `ObjectLost` instead of waiting for a seal that will never come; the
    /// id may be created again). Returns how many were lost.
    pub fn member_died(&mut self, node: &str) -> usize {
        let name = self.name(node);
        (self.entries.values_mut())
            .map(|e| died(e, node, &name))
            .filter(|&lost| lost)
            .count()
    }

    /// [`Directory::member_died`] for the entries of `ids` only (those
    /// still kept): a large directory is gone through a piece at a time,
    /// the lock given up in between.
    pub fn member_died_in(&mut self, node: &str, ids: &[ObjectId]) -> usize {
        let name = self.name(node);
        (ids.iter())
            .filter(|id| {
                self.entries
                    .get_mut(id)
                    .is_some_and(|e| died(e, node, &name))
            })
            .count()
    }

    /// The ids of every entry, to go through in pieces (`…_in`).
    pub fn ids(&self) -> Vec<ObjectId> {
        self.entries.keys().copied().collect()
    }

    /// Keeps only the entries of ids `keep` says this member still owns or
    /// backs up (after a ring change): entries it no longer answers for
    /// would be out of date when ownership comes back, and the holders
    /// re-register with the new owners anyway. Returns how many went.
    pub fn retain_owned(&mut self, mut keep: impl FnMut(&ObjectId) -> bool) -> usize {
        let before = self.entries.len();
        self.entries.retain(|id, _| keep(id));
        before - self.entries.len()
    }

    /// [`Directory::retain_owned`] for the entries of `ids` only.
    pub fn retain_owned_in(
        &mut self,
        ids: &[ObjectId],
        mut keep: impl FnMut(&ObjectId) -> bool,
    ) -> usize {
        (ids.iter())
            .filter(|id| !keep(id) && self.entries.remove(id).is_some())
            .count()
    }

    /// Forgets every entry (this member was cut off or paused: what it
    /// knew is out of date; the holders re-register). Returns them, to be
    /// dropped once the lock is given back (a million entries take a while
    /// to free).
    pub fn clear(&mut self) -> impl Send + use<> {
        std::mem::take(&mut self.entries)
    }

    /// A member declared dead is back with the same incarnation (it was
    /// paused or cut off, not restarted): it holds again what it held, and
    /// an object lost with it is found again.
    pub fn member_back(&mut self, node: &str) {
        let name = self.name(node);
        for e in self.entries.values_mut() {
            back(e, node, &name);
        }
    }

    /// [`Directory::member_back`] for the entries of `ids` only.
    pub fn member_back_in(&mut self, node: &str, ids: &[ObjectId]) {
        let name = self.name(node);
        for id in ids {
            if let Some(e) = self.entries.get_mut(id) {
                back(e, node, &name);
            }
        }
    }

    /// A member came back as a new incarnation: it holds nothing of what
    /// it held before. Its claims are void, its old copies gone for good;
    /// entries kept only for it go.
    pub fn member_restarted(&mut self, node: &str) -> usize {
        let lost = self.member_died(node);
        self.entries.retain(|_, e| !restarted(e, node));
        lost
    }

    /// [`Directory::member_restarted`] for the entries of `ids` only.
    pub fn member_restarted_in(&mut self, node: &str, ids: &[ObjectId]) -> usize {
        let lost = self.member_died_in(node, ids);
        for id in ids {
            if self.entries.get_mut(id).is_some_and(|e| restarted(e, node)) {
                self.entries.remove(id);
            }
        }
        lost
    }
}

/// `node` (named `name`) died: applied to one entry; true if it is lost.
fn died(e: &mut Entry, node: &str, name: &Member) -> bool {
    if matches!(&e.state, State::Creating { by } if **by == *node) {
        e.state = State::Lost;
        return true;
    }
    let held = e.holders.len();
    e.holders.retain(|h| **h != *node);
    if held != e.holders.len() && !e.away.iter().any(|h| **h == *node) {
        e.away.push(name.clone());
    }
    if e.state == State::Sealed && e.holders.is_empty() && held > 0 {
        e.state = State::Lost;
        return true;
    }
    false
}

/// `node` is back from a pause: applied to one entry.
fn back(e: &mut Entry, node: &str, name: &Member) {
    if let Some(i) = e.away.iter().position(|h| **h == *node) {
        e.away.remove(i);
        e.holders.push(name.clone());
        if e.state == State::Lost {
            e.state = State::Sealed;
        }
    }
}

/// `node` restarted (its death already applied): true if the entry was
/// kept only for it.
fn restarted(e: &mut Entry, node: &str) -> bool {
    e.away.retain(|h| **h != *node);
    e.stale.retain(|h| **h != *node);
    e.state == State::Deleted && e.stale.is_empty()
}

impl Entry {
    fn sealed(data_size: u64, metadata_size: u64) -> Self {
        Entry {
            state: State::Sealed,
            holders: Holders::new(),
            creator: None,
            away: Vec::new(),
            stale: Vec::new(),
            version: 0,
            data_size,
            metadata_size,
        }
    }
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
