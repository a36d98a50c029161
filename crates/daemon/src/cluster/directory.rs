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
    entries: HashMap<ObjectId, Entry, IdHasher>,
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
            Entry {
                state: State::Creating { by: by.clone() },
                holders: Holders::new(),
                creator: Some(by),
                away: Vec::new(),
                stale,
                version: 0,
                data_size: 0,
                metadata_size: 0,
            },
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
                    .or_insert_with(|| Entry::sealed(data_size, metadata_size));
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
                        .or_insert(Entry::sealed(data_size, metadata_size)),
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
        self.entries.get(id)
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
            self.entries.insert(*id, tomb);
        }
        e.holders = pending;
        Some(e)
    }

    /// A member died: its copies are gone; objects with no copy left become
    /// [`State::Lost`], and so do its claims (it may have sealed the object
    /// and died before the directory heard: a get of it then answers
    /// `ObjectLost` instead of waiting for a seal that will never come; the
    /// id may be created again). Returns how many were lost.
    pub fn member_died(&mut self, node: &str) -> usize {
        let mut lost = 0;
        let name = self.name(node);
        for e in self.entries.values_mut() {
            if matches!(&e.state, State::Creating { by } if **by == *node) {
                e.state = State::Lost;
                lost += 1;
                continue;
            }
            let held = e.holders.len();
            e.holders.retain(|h| **h != *node);
            if held != e.holders.len() && !e.away.iter().any(|h| **h == *node) {
                e.away.push(name.clone());
            }
            if e.state == State::Sealed && e.holders.is_empty() && held > 0 {
                e.state = State::Lost;
                lost += 1;
            }
        }
        lost
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

    /// Forgets every entry (this member was cut off or paused: what it
    /// knew is out of date; the holders re-register).
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// A member declared dead is back with the same incarnation (it was
    /// paused or cut off, not restarted): it holds again what it held, and
    /// an object lost with it is found again.
    pub fn member_back(&mut self, node: &str) {
        let name = self.name(node);
        for e in self.entries.values_mut() {
            if let Some(i) = e.away.iter().position(|h| **h == *node) {
                e.away.remove(i);
                e.holders.push(name.clone());
                if e.state == State::Lost {
                    e.state = State::Sealed;
                }
            }
        }
    }

    /// A member came back as a new incarnation: it holds nothing of what
    /// it held before. Its claims are void, its old copies gone for good;
    /// entries kept only for it go.
    pub fn member_restarted(&mut self, node: &str) -> usize {
        let lost = self.member_died(node);
        self.entries.retain(|_, e| {
            e.away.retain(|h| **h != *node);
            e.stale.retain(|h| **h != *node);
            !(e.state == State::Deleted && e.stale.is_empty())
        });
        lost
    }
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
mod tests {
    use super::*;

    fn names(holders: &[Member]) -> Vec<&str> {
        holders.iter().map(|h| &**h).collect()
    }

    const PRIMARY: Change = Change::SealedPrimary {
        data_size: 10,
        metadata_size: 2,
        version: 100,
    };
    const CACHED: Change = Change::SealedCached {
        data_size: 10,
        metadata_size: 2,
    };

    #[test]
    fn a_claimed_or_sealed_id_cannot_be_claimed_elsewhere() {
        let mut d = Directory::new();
        let id = ObjectId::random();
        assert!(d.claim(id, "a"));
        assert!(d.claim(id, "a"), "re-claiming one's own id is fine");
        assert!(!d.claim(id, "b"));
        d.update(id, "a", PRIMARY, false);
        assert!(!d.claim(id, "a"));
        assert!(!d.claim(id, "b"));
    }

    #[test]
    fn claims_are_granted_only_once_every_member_has_re_registered_for_the_ring() {
        let mut d = Directory::new();
        let members = || vec!["a".to_string(), "b".into(), "c".into()];
        d.set_ring(7, members());
        let (id, held) = (ObjectId::random(), ObjectId::random());
        // "c" re-registered for ring 7 before this member heard of it.
        d.synced("c", 7);
        d.set_ring(7, members());
        d.synced("a", 7);
        assert!(
            matches!(d.claim_in_ring(id, "a", 7, false), Claim::NotNow(_)),
            "b has not re-registered"
        );
        // What is known is refused at once.
        d.update(held, "b", PRIMARY, true);
        assert_eq!(d.claim_in_ring(held, "a", 7, false), Claim::Refused);
        // A re-claim of an id granted before the change is recorded.
        let reclaimed = ObjectId::random();
        assert_eq!(d.claim_in_ring(reclaimed, "c", 7, true), Claim::Granted);
        d.synced("b", 7);
        assert!(
            matches!(d.claim_in_ring(id, "a", 8, false), Claim::NotNow(_)),
            "another ring"
        );
        assert_eq!(d.claim_in_ring(id, "a", 7, false), Claim::Granted);
        assert_eq!(d.claim_in_ring(reclaimed, "a", 7, false), Claim::Refused);
        // A new ring: the marks of the old one no longer count.
        d.set_ring(9, members());
        assert!(matches!(
            d.claim_in_ring(ObjectId::random(), "a", 9, false),
            Claim::NotNow(_)
        ));
    }

    /// Four members joining one after another: a member may hear another's
    /// re-registration for the final ring while it is still two rings
    /// behind. That mark must survive the ring in between, or the
    /// directory is never complete (the sender re-registers only when its
    /// own ring changes) and no id can be claimed.
    #[test]
    fn an_early_re_registration_survives_the_rings_in_between() {
        let mut d = Directory::new();
        let four = || vec!["a".to_string(), "b".into(), "c".into(), "d".into()];
        d.set_ring(1, vec!["a".into(), "d".into()]);
        // "a" already sees all four (ring 3) and says so.
        d.synced("a", 3);
        d.set_ring(2, vec!["a".into(), "c".into(), "d".into()]);
        d.set_ring(3, four());
        for m in ["b", "c", "d"] {
            d.synced(m, 3);
        }
        assert!(d.is_complete(), "a's early mark still counts");
        assert_eq!(
            d.claim_in_ring(ObjectId::random(), "b", 3, false),
            Claim::Granted
        );
        // The marks of a ring left behind do not count if it forms again.
        d.set_ring(4, vec!["a".into(), "b".into(), "c".into()]);
        d.set_ring(3, four());
        assert!(!d.is_complete());
    }

    #[test]
    fn an_aborted_claim_frees_the_id() {
        let mut d = Directory::new();
        let id = ObjectId::random();
        assert!(d.claim(id, "a"));
        d.update(id, "b", Change::Aborted, false);
        assert!(!d.claim(id, "b"), "only the claimer's abort counts");
        d.update(id, "a", Change::Dropped, false);
        assert!(!d.claim(id, "b"), "news of an old copy dropped is no abort");
        d.update(id, "a", Change::Aborted, false);
        assert!(d.claim(id, "b"));
    }

    #[test]
    fn recording_copies_allocates_nothing_once_the_members_are_known() {
        // Every object a member pulls is one update at its owner and
        // backup: with the members' names known (and room in the map),
        // an entry's primary, its cached copies and their drops cost no
        // heap allocation.
        let mut d = Directory::new();
        let first = ObjectId::random();
        d.update(first, "a", PRIMARY, false);
        d.update(first, "b", CACHED, false);
        let ids: Vec<ObjectId> = (0..1000).map(|_| ObjectId::random()).collect();
        d.entries.reserve(ids.len());
        let counted = allocation_counter::measure(|| {
            for id in &ids {
                assert!(d.update(*id, "a", PRIMARY, false));
                assert!(d.update(*id, "b", CACHED, false));
            }
            for id in &ids[..500] {
                assert!(d.update(*id, "b", Change::Dropped, false));
            }
        });
        assert_eq!(counted.count_total, 0, "{counted:?}");
        assert_eq!(names(&d.lookup(&ids[0]).unwrap().holders), ["a"]);
        assert_eq!(names(&d.lookup(&ids[999]).unwrap().holders), ["a", "b"]);
    }

    #[test]
    fn copies_are_recorded_primary_first_and_dropped_one_by_one() {
        let mut d = Directory::new();
        let id = ObjectId::random();
        d.claim(id, "a");
        d.update(id, "a", PRIMARY, false);
        assert!(d.update(id, "b", CACHED, false));
        assert!(d.update(id, "c", CACHED, false));
        assert_eq!(names(&d.lookup(&id).unwrap().holders), ["a", "b", "c"]);
        d.update(id, "a", Change::Dropped, false);
        assert_eq!(names(&d.lookup(&id).unwrap().holders), ["b", "c"]);
        d.update(id, "b", Change::Dropped, false);
        d.update(id, "c", Change::Dropped, false);
        assert!(d.lookup(&id).is_none(), "evicted everywhere: gone");
    }

    #[test]
    fn a_cached_copy_of_a_deleted_object_is_refused_unless_rejoining() {
        let mut d = Directory::new();
        let id = ObjectId::random();
        assert!(!d.update(id, "b", CACHED, false));
        assert!(d.lookup(&id).is_none());
        assert!(d.update(id, "b", CACHED, true));
        assert_eq!(d.lookup(&id).unwrap().state, State::Sealed);
    }

    #[test]
    fn a_dead_member_loses_only_objects_it_alone_held() {
        let mut d = Directory::new();
        let (solo, shared, claimed) = (ObjectId::random(), ObjectId::random(), ObjectId::random());
        d.update(solo, "a", PRIMARY, false);
        d.update(shared, "a", PRIMARY, false);
        d.update(shared, "b", CACHED, false);
        d.claim(claimed, "a");
        assert_eq!(d.member_died("a"), 2);
        assert_eq!(d.lookup(&solo).unwrap().state, State::Lost);
        assert_eq!(names(&d.lookup(&shared).unwrap().holders), ["b"]);
        // Its claim too: it may have sealed before the directory heard.
        assert_eq!(d.lookup(&claimed).unwrap().state, State::Lost);
        assert!(d.claim(claimed, "b"), "and the id may be taken again");
        // A lost id may be created again; a returning member revives it.
        assert!(d.claim(solo, "c"));
        let lost2 = ObjectId::random();
        d.update(lost2, "a", PRIMARY, false);
        d.member_died("a");
        d.update(lost2, "a", PRIMARY, true);
        assert_eq!(d.lookup(&lost2).unwrap().state, State::Sealed);
    }

    #[test]
    fn a_primary_copy_never_takes_an_id_another_member_claimed_or_created() {
        let mut d = Directory::new();
        let id = ObjectId::random();
        // "a" created it, was cut off and declared dead; "b" took the id.
        d.claim(id, "a");
        d.update(id, "a", PRIMARY, false);
        d.member_died("a");
        assert!(d.claim(id, "b"));
        // "a" comes back and re-registers its copy: refused, while "b"
        // creates, and once "b" sealed.
        assert!(!d.update(id, "a", PRIMARY, true));
        assert_eq!(
            d.lookup(&id).unwrap().state,
            State::Creating { by: "b".into() }
        );
        assert!(d.update(id, "b", PRIMARY, false));
        assert!(!d.update(id, "a", PRIMARY, true));
        assert_eq!(names(&d.lookup(&id).unwrap().holders), ["b"]);
        // A cached copy registered first (a new owner) leaves the creator
        // unknown: the primary is taken.
        let other = ObjectId::random();
        assert!(d.update(other, "c", CACHED, true));
        assert!(d.update(other, "a", PRIMARY, true));
        assert_eq!(names(&d.lookup(&other).unwrap().holders), ["a", "c"]);
        // Its own object, lost while it was away, it gets back.
        let mine = ObjectId::random();
        d.claim(mine, "a");
        d.member_died("a");
        assert!(d.update(mine, "a", PRIMARY, true));
        assert_eq!(d.lookup(&mine).unwrap().state, State::Sealed);
    }

    #[test]
    fn a_deletion_stays_until_every_holder_dropped_its_copy() {
        let mut d = Directory::new();
        let id = ObjectId::random();
        d.update(id, "a", PRIMARY, false);
        d.update(id, "b", CACHED, false);
        assert_eq!(names(&d.forget(&id).unwrap().holders), ["a", "b"]);
        // Until they report the copies dropped, a report of one is refused.
        assert_eq!(d.lookup(&id).unwrap().state, State::Deleted);
        assert!(!d.update(id, "b", CACHED, true));
        d.update(id, "a", Change::Dropped, false);
        d.update(id, "b", Change::Dropped, false);
        assert!(d.is_empty());
    }

    #[test]
    fn a_member_away_during_a_delete_drops_its_copy_when_it_returns() {
        let mut d = Directory::new();
        let id = ObjectId::random();
        d.update(id, "a", PRIMARY, false);
        d.update(id, "b", CACHED, false);
        d.member_died("b");
        assert_eq!(names(&d.lookup(&id).unwrap().holders), ["a"]);
        // Deleted while b was away: b is among the holders the delete is
        // told of, and its copy is refused when it comes back.
        assert_eq!(names(&d.forget(&id).unwrap().holders), ["a", "b"]);
        d.update(id, "a", Change::Dropped, false);
        assert!(
            !d.update(id, "b", CACHED, true),
            "a deleted object stays deleted"
        );
        d.update(id, "b", Change::Dropped, true);
        assert!(d.is_empty());
        // A member away that returns to an object still there holds it again.
        let kept = ObjectId::random();
        d.update(kept, "a", PRIMARY, false);
        d.update(kept, "b", CACHED, false);
        d.member_died("a");
        assert!(d.update(kept, "a", PRIMARY, true));
        assert_eq!(names(&d.lookup(&kept).unwrap().holders), ["a", "b"]);
        // One back from a pause holds it again, a lost object included.
        let paused = ObjectId::random();
        d.update(paused, "p", PRIMARY, false);
        d.member_died("p");
        assert_eq!(d.lookup(&paused).unwrap().state, State::Lost);
        d.member_back("p");
        assert_eq!(d.lookup(&paused).unwrap().state, State::Sealed);
        assert_eq!(names(&d.lookup(&paused).unwrap().holders), ["p"]);
        // One that restarted holds nothing: the deletion is complete.
        let gone = ObjectId::random();
        d.update(gone, "c", PRIMARY, false);
        d.member_died("c");
        d.forget(&gone);
        assert_eq!(d.lookup(&gone).unwrap().state, State::Deleted);
        d.member_restarted("c");
        assert!(d.lookup(&gone).is_none());
    }

    fn primary(version: u64) -> Change {
        Change::SealedPrimary {
            data_size: 10,
            metadata_size: 2,
            version,
        }
    }

    #[test]
    fn of_two_primaries_reported_to_a_new_owner_the_later_one_wins() {
        // "a" sealed at 100, was away, its object lost and created again by
        // "b" at 200; both re-register with an owner that knows neither.
        for a_first in [true, false] {
            let mut d = Directory::new();
            let id = ObjectId::random();
            if a_first {
                assert!(d.update(id, "a", primary(100), true));
                assert!(d.update(id, "c", CACHED, true));
                assert!(
                    d.update(id, "b", primary(200), true),
                    "the later object wins"
                );
                assert!(
                    !d.update(id, "c", CACHED, true),
                    "c's copy is of the old object"
                );
            } else {
                assert!(d.update(id, "b", primary(200), true));
            }
            assert!(
                !d.update(id, "a", primary(100), true),
                "the earlier one is refused"
            );
            let e = d.lookup(&id).unwrap();
            assert_eq!(
                (e.creator.as_deref(), names(&e.holders)),
                (Some("b"), vec!["b"])
            );
        }
        // A deleted object reported again is refused; a later one is not.
        let mut d = Directory::new();
        let id = ObjectId::random();
        d.update(id, "a", primary(100), false);
        d.update(id, "x", CACHED, false);
        d.forget(&id);
        assert!(!d.update(id, "a", primary(100), true));
        assert!(d.update(id, "b", primary(300), true));
    }

    #[test]
    fn stale_copies_never_join_an_object_created_again() {
        let mut d = Directory::new();
        let id = ObjectId::random();
        d.update(id, "a", PRIMARY, false);
        d.update(id, "b", CACHED, false);
        d.member_died("b");
        d.forget(&id);
        d.update(id, "a", Change::Dropped, false);
        // Created again (by c) while b still holds the old bytes.
        assert!(d.claim(id, "c"));
        d.update(id, "c", PRIMARY, false);
        assert!(
            !d.update(id, "b", CACHED, true),
            "b's copy is of the old object"
        );
        assert_eq!(names(&d.lookup(&id).unwrap().holders), ["c"]);
        d.update(id, "b", Change::Dropped, false);
        assert!(d.lookup(&id).unwrap().stale.is_empty());
        // The same after a loss: the lost object's holder is refused too.
        let lost = ObjectId::random();
        d.update(lost, "a", PRIMARY, false);
        d.member_died("a");
        assert!(d.claim(lost, "c"));
        assert!(!d.update(lost, "a", PRIMARY, true));
    }
}
