//! Remote gets, batched. The ids a get misses locally are fetched together:
//! the directory is asked with one lookup per owner (all owners at once),
//! and the objects are pulled with one request per holder carrying all of
//! that holder's objects (all holders at once), straight into new local
//! allocations. Sealing those wakes the waiting gets like any local seal.
//! Each copy is a cached secondary: evictable, and registered so that
//! others may pull from it. A single get is a batch of one.
//!
//! The first lookup of a batch goes to each owner over the bulk transport
//! as a pull ([`LOOKUP`]): the owner sends at once the objects it holds
//! itself and the directory entries of the others, so an object its owner
//! holds costs one round trip. Lookups that wait for objects not sealed yet
//! (and those an owner could not answer) are gRPC `Lookup`s.
//!
//! One fetch runs per id however many gets wait for it. It ends when the
//! object is here, when the last waiter's deadline passes or every waiter
//! is gone, or with an error for its waiters: lost (every holder died) or
//! no room here. Ids not sealed anywhere yet are watched: one lookup per
//! owner waits until any of them is sealed or lost, and what is sealed is
//! pulled at once.

use crate::cluster::{Cluster, Completion, Completions, Inflight};
use crate::directory::table::State;
use crate::pb;
use crate::peers::retry;
use crate::sync::lock;
use crate::transfer::codec::{LOOKUP, MAX_PULL_IDS, PULL};
use crate::transfer::landing::{Outcome, StoreLanding};
use crate::transfer::transport::TransferError;
use crate::wire::{wire_error, MAX_LOOKUP_WAIT};
use ferroplasma_protocol::pb as wire;
use ferroplasma_protocol::ObjectId;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Least time a lookup must have waited before it is repeated at once.
const RETRY: Duration = Duration::from_millis(100);

/// Pauses between retries of one fetch: exponential from 10 ms to 1 s, with
/// jitter.
fn backoff() -> impl Iterator<Item = Duration> {
    retry::backoff(Duration::from_millis(10), Duration::from_secs(1))
}

/// A member holding copies: its name and bulk address.
type Holder = (String, String);

/// What the first lookup found of an id.
#[derive(Debug, Clone)]
enum Found {
    /// Where it is.
    Entry(pb::Entry),
    /// Nothing more to do (pulled with the lookup, or failed for good).
    Settled,
    /// Nobody answered.
    Unanswered,
}

/// What one round of a fetch left to do.
#[derive(Debug, Default)]
struct Left {
    /// Not sealed anywhere yet (or nobody answered): look up again.
    ids: Vec<ObjectId>,
    /// Whether a holder failed or none could be reached: pause first.
    failed: bool,
    /// Whether some id was settled (here, lost or refused) this round.
    progress: bool,
}

impl Cluster {
    /// Makes sure each of `ids` is being fetched for a get waiting until
    /// `deadline` (`None`: forever); `waiter` hears of failures. The ids
    /// not in flight yet are fetched together.
    pub fn want(
        self: &Arc<Self>,
        ids: Vec<ObjectId>,
        deadline: Option<Instant>,
        waiter: Completions,
    ) {
        let mut fresh = Vec::with_capacity(ids.len());
        {
            let mut inflight = lock(&self.inflight);
            for id in ids {
                if let Some(f) = inflight.get_mut(&id) {
                    f.deadline = match (f.deadline, deadline) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        _ => None,
                    };
                    f.waiters.push(waiter.clone());
                    continue;
                }
                inflight.insert(
                    id,
                    Inflight {
                        deadline,
                        waiters: vec![waiter.clone()],
                    },
                );
                fresh.push(id);
            }
        }
        if fresh.is_empty() {
            return;
        }
        let c = self.clone();
        // In the span of the request that first wanted it (debug logs).
        let work = async move { c.fetch(fresh).await };
        self.rt.spawn(tracing::Instrument::in_current_span(work));
    }

    /// Ends the fetch of `id`: its waiters hear of `error`, if any.
    fn finish(&self, id: ObjectId, error: Option<wire::Error>) {
        let waiters = lock(&self.inflight).remove(&id).map(|f| f.waiters);
        if let (Some(error), Some(ws)) = (error, waiters) {
            for w in ws {
                let _ = w.send(Completion::FetchFailed {
                    id,
                    error: error.clone(),
                });
            }
        }
    }

    /// Keeps the ids still to fetch: ends those nobody waits for any more
    /// and those here (or being created here: their gets wait for the
    /// seal). Returns the longest any waiter waits (`None`: forever). The
    /// ended ones leave `inflight` under the same locks as the checks, so a
    /// get that wants one of them afterwards starts a fetch of its own.
    fn prune(&self, ids: &mut Vec<ObjectId>) -> Option<Instant> {
        let mut longest: Option<Option<Instant>> = None;
        let mut inflight = lock(&self.inflight);
        let here = self.store.exists(ids);
        let mut here = here.into_iter();
        let now = Instant::now();
        ids.retain(|id| {
            let here = here.next().unwrap_or(false);
            let wanted = inflight.get(id).and_then(|f| {
                let live =
                    !f.waiters.iter().all(|w| w.is_closed()) && f.deadline.is_none_or(|d| d > now);
                live.then_some(f.deadline)
            });
            match wanted {
                Some(d) if !here => {
                    longest = Some(match (longest, d) {
                        (Some(Some(a)), Some(b)) => Some(a.max(b)),
                        (None, d) => d,
                        _ => None,
                    });
                    true
                }
                _ => {
                    inflight.remove(id);
                    false
                }
            }
        });
        longest.flatten()
    }

    /// Fetches `ids` until each is here, lost, refused or no longer wanted.
    async fn fetch(self: Arc<Self>, ids: Vec<ObjectId>) {
        // First as one batch: one lookup per owner, one pull per holder.
        let left = self.clone().round(ids, true).await;
        if left.ids.is_empty() {
            return;
        }
        // What is not sealed yet is watched per owner, so that an object
        // sealed under one owner is pulled without waiting on another's.
        let by_owner = self.by_target(&left.ids, 0..left.ids.len(), 0);
        let mut watches = JoinSet::new();
        let mut watched = HashMap::new();
        for (_, idx) in by_owner {
            let ids: Vec<ObjectId> = idx.into_iter().map(|i| left.ids[i]).collect();
            let c = self.clone();
            let task = watches.spawn(tracing::Instrument::in_current_span(
                c.watch(ids.clone(), left.failed),
            ));
            watched.insert(task.id(), ids);
        }
        while let Some(done) = watches.join_next_with_id().await {
            if let Err(e) = done {
                // A bug; the gets hear of it instead of waiting in vain.
                tracing::error!(error = %e, "a remote get's watch failed");
                for id in watched.remove(&e.id()).unwrap_or_default() {
                    self.finish(id, Some(internal(id, &e)));
                }
            }
        }
    }

    /// Looks `ids` up again and again (each lookup waiting until one of
    /// them is sealed or lost), pulling what is sealed each time.
    async fn watch(self: Arc<Self>, mut ids: Vec<ObjectId>, mut failed: bool) {
        let mut pauses = backoff();
        loop {
            if failed {
                tokio::time::sleep(pauses.next().unwrap_or(RETRY)).await;
            }
            let started = Instant::now();
            let left = self.clone().round(ids, false).await;
            if left.ids.is_empty() {
                return;
            }
            ids = left.ids;
            if left.progress {
                // Objects sealed one after another: go on at once.
                pauses = backoff();
                failed = false;
            } else {
                // Not sealed anywhere yet: the lookup waited for it. Do not
                // spin if it came back early.
                failed = left.failed || started.elapsed() < RETRY;
            }
        }
    }

    /// One lookup of `ids` (per owner, all at once) and one pull of what
    /// is sealed (per holder, all at once). With `at_once`, lookups answer
    /// at once; otherwise they wait until one id is sealed or lost.
    async fn round(self: Arc<Self>, mut ids: Vec<ObjectId>, at_once: bool) -> Left {
        let deadline = self.prune(&mut ids);
        if ids.is_empty() {
            return Left::default();
        }
        let wait = if at_once {
            Duration::ZERO
        } else {
            deadline.map_or(MAX_LOOKUP_WAIT, |d| {
                d.saturating_duration_since(Instant::now())
            })
        };
        let asked = ids.len();
        let found = if at_once {
            self.clone().lookup_at_owners(&ids).await
        } else {
            let entries = self.clone().lookup_many(&ids, wait).await;
            entries
                .into_iter()
                .map(|e| e.map_or(Found::Unanswered, Found::Entry))
                .collect()
        };
        let mut left = Left::default();
        let mut sealed: Vec<(ObjectId, Vec<Holder>)> = Vec::new();
        {
            let m = lock(&self.membership);
            for (id, found) in ids.into_iter().zip(found) {
                let entry = match found {
                    Found::Entry(e) => e,
                    Found::Settled => continue,
                    Found::Unanswered => {
                        left.ids.push(id);
                        left.failed = true;
                        continue;
                    }
                };
                match pb::EntryState::try_from(entry.state).unwrap_or(pb::EntryState::Absent) {
                    pb::EntryState::Lost => {
                        let e = self.lost(id, &entry.holders);
                        self.finish(id, Some(e));
                    }
                    pb::EntryState::Absent | pb::EntryState::Creating => left.ids.push(id),
                    pb::EntryState::Sealed => {
                        let holders: Vec<Holder> = entry
                            .holders
                            .iter()
                            .filter(|h| **h != self.me)
                            .filter_map(|h| {
                                let member = m.get(h)?;
                                (m.is_alive(h) && !member.info.data_addr.is_empty())
                                    .then(|| (h.clone(), member.info.data_addr.clone()))
                            })
                            .collect();
                        if !holders.is_empty() {
                            sealed.push((id, holders));
                            continue;
                        }
                        let all_dead = entry
                            .holders
                            .iter()
                            .all(|h| *h != self.me && !m.is_alive(h));
                        if all_dead && !entry.holders.is_empty() {
                            let e = self.lost(id, &entry.holders);
                            self.finish(id, Some(e));
                        } else {
                            left.ids.push(id);
                            left.failed = true;
                        }
                    }
                }
            }
        }
        if !sealed.is_empty() {
            tracing::debug!(objects = sealed.len(), "lookup: sealed");
            let unpulled = self.pull_sealed(sealed).await;
            if !unpulled.is_empty() {
                left.failed = true;
                left.ids.extend(unpulled);
            }
        }
        left.progress = left.ids.len() < asked;
        left
    }

    /// The first lookup of `ids`: at each remote owner a [`LOOKUP`] over the
    /// bulk transport (all at once), which brings the objects the owner
    /// holds and the entries of the rest; this member's own entries from
    /// its directory, first: an object of those sealed at a member asked a
    /// `LOOKUP` anyway is pulled with it (one request per member, and the
    /// whole batch in one round trip when the owners hold what they own).
    /// Ids an owner did not answer for are looked up at their backups
    /// (gRPC).
    async fn lookup_at_owners(self: Arc<Self>, ids: &[ObjectId]) -> Vec<Found> {
        let mut out = vec![Found::Unanswered; ids.len()];
        let mut by_owner = self.by_target(ids, 0..ids.len(), 0);
        // For each remote owner, the ids to ask of it: (index, whether it
        // owns the id (else: an object of this member's directory it holds)).
        let mut asked: BTreeMap<String, Vec<(usize, bool)>> = by_owner
            .iter()
            .filter(|(owner, _)| **owner != self.me)
            .map(|(owner, idx)| (owner.clone(), idx.iter().map(|&i| (i, true)).collect()))
            .collect();
        // This member's own ids sealed at a member asked anyway: their
        // entries are needed only if that member does not give them.
        let mut with_lookups = Vec::new();
        if let Some(idx) = by_owner.remove(&self.me) {
            let mut rest = Vec::new();
            {
                let d = lock(&self.directory);
                for i in idx {
                    let holder = d
                        .lookup(&ids[i])
                        .filter(|e| e.state == State::Sealed)
                        .and_then(|e| {
                            e.holders
                                .iter()
                                .map(|h| &**h)
                                .find(|&h| h != self.me && asked.contains_key(h))
                        });
                    match holder {
                        Some(h) => {
                            asked.get_mut(h).expect("asked").push((i, false));
                            with_lookups.push(i);
                        }
                        None => rest.push(i),
                    }
                }
            }
            self.local_entries(ids, rest, &mut out).await;
        }
        let mut asks = JoinSet::new();
        let mut unanswered = Vec::new();
        for (owner, items) in asked {
            let data_addr = {
                let m = lock(&self.membership);
                m.get(&owner)
                    .filter(|_| m.is_alive(&owner))
                    .map(|x| x.info.data_addr.clone())
                    .filter(|a| !a.is_empty())
            };
            let Some(data_addr) = data_addr else {
                // Its own ids go to their backups; the others keep their
                // entries (their pull tries the other holders).
                unanswered.extend(items.iter().filter(|(_, owns)| *owns).map(|(i, _)| *i));
                continue;
            };
            for piece in items.chunks(MAX_PULL_IDS) {
                let (c, piece) = (self.clone(), piece.to_vec());
                let want: Vec<ObjectId> = piece.iter().map(|&(i, _)| ids[i]).collect();
                let owner = (owner.clone(), data_addr.clone());
                asks.spawn(tracing::Instrument::in_current_span(async move {
                    c.counters.lookups.fetch_add(1, Ordering::Relaxed);
                    let outcomes = c.pull_from(&owner, LOOKUP, &want).await;
                    (piece, outcomes)
                }));
            }
        }
        while let Some(done) = asks.join_next().await {
            let Ok((piece, outcomes)) = done else {
                continue;
            };
            let brought = outcomes
                .iter()
                .filter(|o| matches!(o, Outcome::Here))
                .count();
            if brought > 0 {
                tracing::debug!(objects = brought, "lookup: sealed, pulled with the lookup");
            }
            for ((i, owns), outcome) in piece.into_iter().zip(outcomes) {
                match outcome {
                    Outcome::Here => {
                        self.finish(ids[i], None);
                        out[i] = Found::Settled;
                    }
                    Outcome::Refused(e) => {
                        self.finish(ids[i], Some(e));
                        out[i] = Found::Settled;
                    }
                    Outcome::Entry(e) if owns => out[i] = Found::Entry(e),
                    Outcome::NotThere | Outcome::Pending if owns => unanswered.push(i),
                    // Not the owner's to answer for: this member's entry
                    // says where else it is (below).
                    Outcome::Entry(_) | Outcome::NotThere | Outcome::Pending => {}
                }
            }
        }
        // This member's own ids the member asked did not give: their
        // entries, for the pulls from their other holders.
        with_lookups.retain(|&i| matches!(out[i], Found::Unanswered));
        self.local_entries(ids, with_lookups, &mut out).await;
        // The owner did not answer (it may be paused or gone): its backups,
        // at once.
        for (i, e) in self.lookup_at_backups(ids, unanswered).await {
            out[i] = Found::Entry(e);
        }
        out
    }

    /// The entries of the ids at `idx` of `ids` from this member's
    /// directory, into `out`.
    async fn local_entries(&self, ids: &[ObjectId], idx: Vec<usize>, out: &mut [Found]) {
        if idx.is_empty() {
            return;
        }
        let want: Vec<ObjectId> = idx.iter().map(|&i| ids[i]).collect();
        let entries = self.lookup_local(&want, Duration::ZERO, false).await;
        for (i, e) in idx.into_iter().zip(entries) {
            out[i] = Found::Entry(e);
        }
    }

    /// Pulls sealed objects from their holders: one request per holder (all
    /// at once), each id from the holder chosen for the most ids; an id a
    /// holder failed to give is asked of its next holder at once. Returns
    /// the ids no holder gave.
    async fn pull_sealed(
        self: &Arc<Self>,
        mut todo: Vec<(ObjectId, Vec<Holder>)>,
    ) -> Vec<ObjectId> {
        let mut unpulled = Vec::new();
        while !todo.is_empty() {
            let mut count: HashMap<String, usize> = HashMap::new();
            for (_, hs) in &todo {
                for (name, _) in hs {
                    *count.entry(name.clone()).or_default() += 1;
                }
            }
            let mut groups: BTreeMap<Holder, Vec<(ObjectId, Vec<Holder>)>> = BTreeMap::new();
            for (id, mut hs) in std::mem::take(&mut todo) {
                // The holder chosen for the most ids (ties: by name).
                let best =
                    (0..hs.len()).max_by_key(|&i| (count[&hs[i].0], std::cmp::Reverse(&hs[i].0)));
                let Some(best) = best else {
                    unpulled.push(id);
                    continue;
                };
                let holder = hs.swap_remove(best);
                groups.entry(holder).or_default().push((id, hs));
            }
            let mut pulls = JoinSet::new();
            let mut asked = HashMap::new();
            for (holder, items) in groups {
                for piece in items.chunks(MAX_PULL_IDS) {
                    let c = self.clone();
                    let (holder, piece) = (holder.clone(), piece.to_vec());
                    let ids: Vec<ObjectId> = piece.iter().map(|(id, _)| *id).collect();
                    let task = pulls.spawn(tracing::Instrument::in_current_span(async move {
                        let ids: Vec<ObjectId> = piece.iter().map(|(id, _)| *id).collect();
                        let outcomes = c.pull_from(&holder, PULL, &ids).await;
                        (holder, piece, outcomes)
                    }));
                    asked.insert(task.id(), ids);
                }
            }
            while let Some(done) = pulls.join_next_with_id().await {
                let (holder, piece, outcomes) = match done {
                    Ok((_, v)) => v,
                    Err(e) => {
                        // A bug: what it was pulling is looked up again.
                        tracing::error!(error = %e, "a pull task failed");
                        unpulled.extend(asked.remove(&e.id()).unwrap_or_default());
                        continue;
                    }
                };
                let mut stale = Vec::new();
                for ((id, others), outcome) in piece.into_iter().zip(outcomes) {
                    match outcome {
                        Outcome::Here => self.finish(id, None),
                        Outcome::Refused(e) => self.finish(id, Some(e)),
                        Outcome::NotThere => {
                            stale.push(id);
                            todo.push((id, others));
                        }
                        Outcome::Pending | Outcome::Entry(_) => todo.push((id, others)),
                    }
                }
                if !stale.is_empty() {
                    self.correct(&holder.0, &stale).await;
                }
            }
        }
        unpulled
    }

    /// Tells the directory that `holder` turned out not to have `ids`.
    async fn correct(&self, holder: &str, ids: &[ObjectId]) {
        tracing::debug!(member = %holder, objects = ids.len(), "holder no longer has the objects");
        let mut by_target: BTreeMap<String, Vec<pb::Op>> = BTreeMap::new();
        for id in ids {
            let op = pb::Op {
                kind: pb::OpKind::Dropped as i32,
                object_id: id.0.to_vec(),
                ..Default::default()
            };
            for t in self.targets(id) {
                by_target.entry(t).or_default().push(op.clone());
            }
        }
        for (t, ops) in by_target {
            if let Err(e) = self.update_at(&t, holder, ops, false, 0).await {
                tracing::debug!(member = %t, error = %e, "directory correction not delivered");
            }
        }
    }

    fn lost(&self, id: ObjectId, holders: &[String]) -> wire::Error {
        wire_error(
            wire::ErrorCode::ObjectLost,
            format!(
                "object {id} is lost: every member that held a copy{} is gone",
                if holders.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", holders.join(", "))
                }
            ),
            Some(id),
        )
    }

    /// Pulls `ids` from one holder in one request of `kind`; an outcome
    /// per id.
    async fn pull_from(&self, holder: &Holder, kind: u8, ids: &[ObjectId]) -> Vec<Outcome> {
        self.counters.pulls.fetch_add(1, Ordering::Relaxed);
        let mut landing = StoreLanding::new(self, ids);
        let r = self
            .transport
            .pull(&holder.1, kind, ids, &mut landing)
            .await;
        let outcomes = landing.into_outcomes();
        match r {
            Ok(()) => tracing::debug!(member = %holder.0, objects = ids.len(), "pulled"),
            Err(e) => {
                let e: TransferError = e;
                tracing::debug!(member = %holder.0, error = %e, "pull failed; trying other holders");
            }
        }
        outcomes
    }
}

/// The error the gets of `id` hear when its fetch failed by a bug.
fn internal(id: ObjectId, e: &tokio::task::JoinError) -> wire::Error {
    wire_error(
        wire::ErrorCode::ClusterUnavailable,
        format!("fetching {id} failed ({e}); retry"),
        Some(id),
    )
}

#[cfg(test)]
#[path = "fetch_tests.rs"]
mod tests;
