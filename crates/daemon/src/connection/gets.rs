//! Gets: answered at once when every object is there, else parked until
//! the objects are sealed (here or, in a cluster, pulled from a member) or
//! the deadline passes.
//!
//! Parked gets are indexed by the objects they wait for and by deadline, so
//! a seal wakes exactly its waiters (O(1) in the number of parked gets) and
//! the next deadline is O(log n) away. A connection may park at most
//! [`MAX_PARKED_GETS`] gets waiting for at most [`MAX_WAITING_IDS`] objects.

use super::{parse_ids, refuse, store_refusal, Connection, Refusal};
use crate::convert;
use crate::shared::{Restore, Shared};
use ferroplasma_protocol::pb::{self, reply};
use ferroplasma_protocol::{IdHasher, ObjectId};
use ferroplasma_store::Location;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;
use tokio::time::Instant;

/// Gets one connection may have waiting at once.
pub const MAX_PARKED_GETS: usize = 4096;

/// Objects (not found yet) the parked gets of one connection may wait for.
pub const MAX_WAITING_IDS: usize = 1_000_000;

/// Notices a client may have queued before it is cut off as too slow: room
/// for a seal notice for each object its gets may wait for (one per
/// object), and for 65,536 subscription events.
pub const NOTICE_QUEUE: usize = MAX_WAITING_IDS + (1 << 16);

/// A get still waiting for some of its objects.
#[derive(Debug)]
struct PendingGet {
    request_id: u64,
    ids: Vec<ObjectId>,
    found: Vec<Option<Location>>,
    /// Which of `ids` it waits for: those not found, for a get with a
    /// timeout; those being brought back from the spill directory, for one
    /// without (it waits for nothing else).
    awaits: Vec<bool>,
    /// Whether it waits for objects to be sealed (has a timeout).
    waits: bool,
    deadline: Option<Instant>,
    /// Objects it still waits for.
    missing: usize,
}

impl PendingGet {
    /// The objects it still waits for, with their positions.
    fn awaited(&self) -> impl Iterator<Item = (usize, &ObjectId)> {
        self.ids
            .iter()
            .enumerate()
            .zip(self.found.iter().zip(&self.awaits))
            .filter(|(_, (f, a))| **a && f.is_none())
            .map(|(at, _)| at)
    }
}

/// The parked gets of one connection.
#[derive(Debug, Default)]
pub(super) struct ParkedGets {
    by_key: HashMap<u64, PendingGet>,
    /// Object → the gets waiting for it, with its position in each (a
    /// seal touches only its own positions: a get of n objects costs O(n)
    /// for all their seals, not O(n) each).
    by_object: HashMap<ObjectId, Vec<(u64, usize)>, IdHasher>,
    deadlines: BTreeSet<(Instant, u64)>,
    next_key: u64,
    waiting_ids: usize,
}

impl ParkedGets {
    /// Whether no get is parked.
    pub(super) fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// When the earliest parked get times out.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|(d, _)| *d)
    }

    fn park(&mut self, p: PendingGet) {
        self.next_key += 1;
        let key = self.next_key;
        for (at, id) in p.awaited() {
            self.by_object.entry(*id).or_default().push((key, at));
        }
        if let Some(d) = p.deadline {
            self.deadlines.insert((d, key));
        }
        self.waiting_ids += p.missing;
        self.by_key.insert(key, p);
    }

    /// Takes a get out; returns the objects nobody waits for any more.
    fn unpark(&mut self, key: u64) -> Option<(PendingGet, Vec<ObjectId>)> {
        let p = self.by_key.remove(&key)?;
        if let Some(d) = p.deadline {
            self.deadlines.remove(&(d, key));
        }
        self.waiting_ids -= p.missing;
        let mut unwatched = Vec::new();
        for (_, id) in p.awaited() {
            if let Some(keys) = self.by_object.get_mut(id) {
                keys.retain(|(k, _)| *k != key);
                if keys.is_empty() {
                    self.by_object.remove(id);
                    unwatched.push(*id);
                }
            }
        }
        Some((p, unwatched))
    }
}

impl Connection {
    pub(super) fn get(&mut self, rid: u64, g: pb::Get) -> Result<Option<reply::Body>, Refusal> {
        let ids = parse_ids(&g.object_ids)?;
        let waits = g.timeout_ms != 0;
        if waits && self.gets.by_key.len() >= MAX_PARKED_GETS {
            return Err(refuse(
                pb::ErrorCode::TooManyWaiting,
                format!(
                    "{MAX_PARKED_GETS} gets already wait on this connection (the limit): wait \
                     for some to finish, or use another connection"
                ),
            ));
        }
        let shared = self.shared.clone();
        let mut sh = shared.lock();
        // Spilled objects are brought back on blocking threads while the get
        // waits; each object found is pinned (referenced) before the next is
        // asked for, and objects being restored cannot be spilled: bringing
        // one back never spills another of the same batch.
        let mut found: Vec<Option<Location>> = Vec::with_capacity(ids.len());
        let mut underway = Vec::with_capacity(ids.len());
        for id in &ids {
            match sh.request_restore(&shared, *id) {
                Ok(r) => underway.push(r == Restore::Underway),
                Err(e) => {
                    for (i, f) in ids.iter().zip(&found) {
                        if f.is_some() {
                            if let Ok(fx) = sh.store.release(self.client, *i) {
                                sh.deliver(fx);
                            }
                        }
                    }
                    return Err(store_refusal(e));
                }
            }
            found.push(sh.store.get(self.client, *id));
        }
        let awaits: Vec<bool> = if waits {
            found.iter().map(Option::is_none).collect()
        } else {
            underway
        };
        let missing = awaits.iter().filter(|a| **a).count();
        let pending = PendingGet {
            request_id: rid,
            ids,
            found,
            awaits,
            waits,
            deadline: (g.timeout_ms > 0)
                .then(|| Instant::now() + Duration::from_millis(g.timeout_ms as u64)),
            missing,
        };
        if missing == 0 {
            return Ok(Some(get_reply(&pending)));
        }
        if self.gets.waiting_ids + missing > MAX_WAITING_IDS {
            drop(sh);
            self.give_back(&pending);
            return Err(refuse(
                pb::ErrorCode::TooManyWaiting,
                format!(
                    "the gets waiting on this connection would wait for more than \
                     {MAX_WAITING_IDS} objects (the limit): wait for some to finish"
                ),
            ));
        }
        let mut remote = Vec::new();
        for (_, id) in pending.awaited() {
            sh.store.watch(self.client, *id);
            if !sh.store.exists(id) {
                remote.push(*id);
            }
        }
        drop(sh);
        if let Some(cl) = &self.cluster {
            if !remote.is_empty() {
                cl.want(remote, pending.deadline, self.done_tx.clone());
            }
        }
        self.gets.park(pending);
        Ok(None)
    }

    /// Each `(id, granted)` was sealed (or, with `granted`, brought back from
    /// the spill directory with a reference handed to this client): the
    /// gets waiting for it take a reference now; those complete are
    /// answered. A burst of notices is taken under one lock of the state (a
    /// batch pulled from another member seals hundreds at once).
    pub(super) fn on_sealed_many(&mut self, notices: &[(ObjectId, bool)]) {
        let shared = self.shared.clone();
        let mut sh = shared.lock();
        let mut complete = Vec::new();
        let mut failed = Vec::new();
        let mut refetch = Vec::new();
        for &(id, granted) in notices {
            if !self.gets.by_object.contains_key(&id) {
                if granted {
                    // Gives back the reference a restore handed over for
                    // gets that no longer wait.
                    if let Ok(fx) = sh.store.release(self.client, id) {
                        sh.deliver(fx);
                    }
                }
                continue;
            }
            if !granted {
                // Spilled between its seal and this notice: bring it back
                // first (and wait). If that cannot be done, no later notice
                // would come: say why now.
                match sh.request_restore(&shared, id) {
                    Ok(Restore::NotSpilled) => {}
                    Ok(Restore::Underway) => {
                        sh.store.watch(self.client, id);
                        continue;
                    }
                    Err(e) => {
                        failed.push((id, e));
                        continue;
                    }
                }
            }
            if let Some(deadline) = self.take_sealed(&mut sh, id, &mut complete) {
                refetch.push((id, deadline));
            }
            if granted {
                if let Ok(fx) = sh.store.release(self.client, id) {
                    sh.deliver(fx);
                }
            }
        }
        drop(sh);
        // A copy pulled from another member and evicted (or deleted) before
        // these gets took it: its fetch has ended, so fetch it again.
        if let Some(cl) = &self.cluster {
            for (id, deadline) in refetch {
                cl.want(vec![id], deadline, self.done_tx.clone());
            }
        }
        for (id, e) in failed {
            self.fail_gets(id, store_refusal(e).0);
        }
        for key in complete {
            self.answer(key);
        }
    }

    /// The gets waiting for the sealed `id` take a reference on it; the
    /// keys of those now complete are added to `complete`. When it is gone
    /// again (evicted or deleted before they took it) and gets still wait
    /// for it, returns the latest of their deadlines (`Some(None)`: one
    /// waits forever).
    fn take_sealed(
        &mut self,
        sh: &mut Shared,
        id: ObjectId,
        complete: &mut Vec<u64>,
    ) -> Option<Option<Instant>> {
        let waiting = self.gets.by_object.remove(&id).unwrap_or_default();
        let mut still_waiting = Vec::new();
        let mut latest: Option<Option<Instant>> = None;
        for (key, at) in waiting {
            let Some(p) = self.gets.by_key.get_mut(&key) else {
                continue;
            };
            let (f, a) = (&mut p.found[at], &mut p.awaits[at]);
            if !*a || f.is_some() {
                continue;
            }
            *f = sh.store.get(self.client, id);
            if f.is_some() {
                p.missing -= 1;
                self.gets.waiting_ids -= 1;
            } else if !p.waits {
                // A get that does not wait answers without it.
                *a = false;
                p.missing -= 1;
                self.gets.waiting_ids -= 1;
            } else {
                latest = Some(match (latest, p.deadline) {
                    (Some(Some(a)), Some(b)) => Some(a.max(b)),
                    (None, d) => d,
                    _ => None,
                });
                still_waiting.push((key, at));
                continue;
            }
            if p.missing == 0 {
                complete.push(key);
            }
        }
        // Evicted or deleted again before we got to it: keep waiting.
        if still_waiting.is_empty() {
            return None;
        }
        sh.store.watch(self.client, id);
        self.gets.by_object.insert(id, still_waiting);
        (!sh.store.exists(&id)).then_some(latest).flatten()
    }

    /// Answers the gets whose deadline has passed.
    pub(super) fn expire(&mut self, now: Instant) {
        while let Some(&(d, key)) = self.gets.deadlines.first() {
            if d > now {
                break;
            }
            self.answer(key);
        }
    }

    /// Answers a parked get with what it has; withdraws the watches nobody
    /// needs any more.
    fn answer(&mut self, key: u64) {
        let Some((p, unwatched)) = self.gets.unpark(key) else {
            return;
        };
        if !unwatched.is_empty() {
            let mut sh = self.shared.lock();
            for id in unwatched {
                sh.store.unwatch(self.client, id);
            }
        }
        self.push_reply(p.request_id, get_reply(&p));
    }

    /// Answers every parked get that waits for `id` with `error`, giving
    /// back the references those gets had taken.
    pub(super) fn fail_gets(&mut self, id: ObjectId, error: pb::Error) {
        let mut keys: Vec<u64> = self
            .gets
            .by_object
            .get(&id)
            .map(|w| w.iter().map(|(k, _)| *k).collect())
            .unwrap_or_default();
        keys.dedup();
        for key in keys {
            let Some((p, unwatched)) = self.gets.unpark(key) else {
                continue;
            };
            {
                let mut sh = self.shared.lock();
                for id in unwatched {
                    sh.store.unwatch(self.client, id);
                }
            }
            self.give_back(&p);
            self.push_reply(p.request_id, reply::Body::Error(error.clone()));
        }
    }

    /// Releases the references a get that is not answered with them took.
    fn give_back(&mut self, p: &PendingGet) {
        let mut sh = self.shared.lock();
        for (i, f) in p.ids.iter().zip(&p.found) {
            if f.is_some() {
                if let Ok(fx) = sh.store.release(self.client, *i) {
                    sh.deliver(fx);
                }
            }
        }
    }
}

fn get_reply(p: &PendingGet) -> reply::Body {
    reply::Body::Get(pb::GetReply {
        results: p
            .found
            .iter()
            .map(|f| pb::GetResult {
                location: f.map(convert::location),
            })
            .collect(),
    })
}
