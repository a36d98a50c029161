//! Remote gets. A get that misses locally asks the cluster to fetch the
//! object: the directory says who holds it, the bytes are pulled from a
//! live holder straight into a new local allocation, and sealing that
//! allocation wakes the waiting gets like any local seal. The copy is a
//! cached secondary: evictable, and registered so others may pull from it.
//!
//! One fetch runs per id however many gets wait for it. It ends when the
//! object is here, when the last waiter's deadline passes or every waiter
//! is gone, or with an error for its waiters: lost (every holder died) or
//! no room here.

use super::transport::{Landing, Pinned, Pulled, Source, TransferError};
use super::{lock, pb, wire_error, Cluster, Completion, Completions, Inflight};
use crate::arena::Arena;
use crate::shared::now_us;
use ferroplasma_protocol::pb as wire;
use ferroplasma_protocol::ObjectId;
use ferroplasma_store::Location;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Least time a lookup must have waited before it is repeated at once.
const RETRY: Duration = Duration::from_millis(100);

/// Pauses between retries of one fetch: exponential from 10 ms to 1 s, with
/// jitter.
fn backoff() -> impl Iterator<Item = Duration> {
    super::retry::backoff(Duration::from_millis(10), Duration::from_secs(1))
}

impl Cluster {
    /// Makes sure `id` is being fetched for a get waiting until `deadline`
    /// (`None`: forever); `waiter` hears of failures.
    pub fn want(self: &Arc<Self>, id: ObjectId, deadline: Option<Instant>, waiter: Completions) {
        let mut inflight = lock(&self.inflight);
        if let Some(f) = inflight.get_mut(&id) {
            f.deadline = match (f.deadline, deadline) {
                (Some(a), Some(b)) => Some(a.max(b)),
                _ => None,
            };
            f.waiters.push(waiter);
            return;
        }
        inflight.insert(
            id,
            Inflight {
                deadline,
                waiters: vec![waiter],
            },
        );
        drop(inflight);
        let c = self.clone();
        // In the span of the request that first wanted it (debug logs).
        let work = async move {
            let outcome = c.fetch(id).await;
            let waiters = lock(&c.inflight).remove(&id).map(|f| f.waiters);
            if let (Err(error), Some(ws)) = (outcome, waiters) {
                for w in ws {
                    let _ = w.send(Completion::FetchFailed {
                        id,
                        error: error.clone(),
                    });
                }
            }
        };
        self.rt.spawn(tracing::Instrument::in_current_span(work));
    }

    /// The deadline of the fetch of `id`, or `Err` when nobody waits any more.
    fn fetch_deadline(&self, id: &ObjectId) -> Result<Option<Instant>, ()> {
        let inflight = lock(&self.inflight);
        let f = inflight.get(id).ok_or(())?;
        if f.waiters.iter().all(|w| w.is_closed()) {
            return Err(());
        }
        match f.deadline {
            Some(d) if d <= Instant::now() => Err(()),
            d => Ok(d),
        }
    }

    /// Fetches until done; `Ok` also when it gave up quietly (the gets
    /// time out on their own).
    async fn fetch(self: &Arc<Self>, id: ObjectId) -> Result<(), wire::Error> {
        let mut pauses = backoff();
        let mut pause = move || tokio::time::sleep(pauses.next().unwrap_or(RETRY));
        loop {
            let Ok(deadline) = self.fetch_deadline(&id) else {
                return Ok(());
            };
            if self.shared.lock().store.exists(&id) {
                return Ok(()); // here, or being created here: the get waits for the seal
            }
            let wait = deadline.map_or(super::ops::MAX_LOOKUP_WAIT, |d| {
                d.saturating_duration_since(Instant::now())
            });
            let started = Instant::now();
            let entry = match self.lookup(id, wait).await {
                Ok(e) => e,
                Err(e) => {
                    tracing::debug!(%id, error = %e.message, "lookup failed; retrying");
                    pause().await;
                    continue;
                }
            };
            let state = pb::EntryState::try_from(entry.state).unwrap_or(pb::EntryState::Absent);
            match state {
                pb::EntryState::Lost => return Err(self.lost(id, &entry.holders)),
                pb::EntryState::Absent | pb::EntryState::Creating => {
                    // Not sealed anywhere yet: the lookup waited for it. Do
                    // not spin if it came back early.
                    if started.elapsed() < RETRY {
                        pause().await;
                    }
                    continue;
                }
                pb::EntryState::Sealed => {}
            }
            tracing::debug!(%id, holders = ?entry.holders, "lookup: sealed");
            let holders: Vec<(String, String)> = {
                let m = lock(&self.membership);
                entry
                    .holders
                    .iter()
                    .filter(|h| **h != self.me)
                    .filter_map(|h| {
                        let member = m.get(h)?;
                        (m.is_alive(h) && !member.info.data_addr.is_empty())
                            .then(|| (h.clone(), member.info.data_addr.clone()))
                    })
                    .collect()
            };
            if holders.is_empty() {
                let all_dead = {
                    let m = lock(&self.membership);
                    entry
                        .holders
                        .iter()
                        .all(|h| *h != self.me && !m.is_alive(h))
                };
                if all_dead && !entry.holders.is_empty() {
                    return Err(self.lost(id, &entry.holders));
                }
                pause().await;
                continue;
            }
            // Start at a different holder each time, to spread the load.
            let start = (now_us() as usize) % holders.len();
            for k in 0..holders.len() {
                let (name, data_addr) = &holders[(start + k) % holders.len()];
                match self.pull_from(id, data_addr).await {
                    Ok(true) => return Ok(()),
                    Ok(false) => {
                        // The directory was stale: correct it.
                        tracing::debug!(%id, member = %name, "holder no longer has the object");
                        let op = pb::Op {
                            kind: pb::OpKind::Dropped as i32,
                            object_id: id.0.to_vec(),
                            ..Default::default()
                        };
                        for t in self.targets(&id) {
                            let ops = vec![op.clone()];
                            if let Err(e) = self.update_at(&t, name, ops, false, 0).await {
                                tracing::debug!(member = %t, error = %e, "directory correction not delivered");
                            }
                        }
                    }
                    Err(Fatal(e)) => return Err(e),
                    Err(Retry(e)) => {
                        tracing::debug!(%id, member = %name, error = %e, "pull failed; trying another holder")
                    }
                }
            }
            pause().await;
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

    /// Pulls `id` from one holder. `Ok(false)`: it does not have it.
    async fn pull_from(&self, id: ObjectId, data_addr: &str) -> Result<bool, PullError> {
        let arena = self.shared.lock().arena.clone();
        let mut landing = StoreLanding {
            cluster: self,
            arena,
            id,
            loc: None,
            refusal: None,
        };
        match self.transport.pull(data_addr, id, &mut landing).await {
            Ok(Pulled::Received(bytes)) => {
                landing.finish();
                tracing::debug!(%id, from = data_addr, bytes, "pulled");
                self.counters.fetches.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .fetched_bytes
                    .fetch_add(bytes, Ordering::Relaxed);
                Ok(true)
            }
            Ok(Pulled::NotThere) => Ok(false),
            Err(TransferError::Landing(_)) => match landing.refusal.take() {
                Some(e) if e.code == wire::ErrorCode::ObjectExists as i32 => Ok(true),
                Some(e) => Err(Fatal(e)),
                None => Err(Retry("landing failed".into())),
            },
            Err(e) => Err(Retry(e.to_string())),
        }
    }
}

enum PullError {
    /// Give up the fetch with this error for the waiters.
    Fatal(wire::Error),
    /// Try another holder.
    Retry(String),
}
use PullError::{Fatal, Retry};

/// A pulled object's allocation in the local store, made by the cluster's
/// store client. Dropped unfinished, it is aborted.
struct StoreLanding<'a> {
    cluster: &'a Cluster,
    arena: Arc<Arena>,
    id: ObjectId,
    loc: Option<Location>,
    /// Why the store refused the allocation.
    refusal: Option<wire::Error>,
}

impl Landing for StoreLanding<'_> {
    fn allocate(&mut self, data_size: u64, metadata: &[u8]) -> Result<&mut [u8], TransferError> {
        if self.loc.is_some() {
            return Err(TransferError::Landing("already allocated".into()));
        }
        let c = self.cluster;
        let meta = metadata.len() as u64;
        let (mut sh, created) = c.shared.with_room(c.shared.lock(), |sh| {
            if sh.store.exists(&self.id) {
                Err(ferroplasma_store::StoreError::ObjectExists(self.id))
            } else {
                sh.spill_for(data_size, meta)
                    .and_then(|()| sh.store.create(c.agent, self.id, data_size, meta, now_us()))
            }
        });
        match created {
            Ok((loc, fx)) => {
                sh.arena.write(loc.metadata_offset(), metadata);
                sh.deliver(fx);
                self.loc = Some(loc);
            }
            Err(e) => {
                let msg = format!("no room here for a copy of {}: {e}", self.id);
                self.refusal = Some(crate::convert::error(&e));
                return Err(TransferError::Landing(msg));
            }
        }
        drop(sh);
        let loc = self.loc.expect("just set");
        // Safety: a fresh unsealed allocation made by the cluster's own
        // store client: no client has been told of it, nothing else writes
        // it, and it is neither freed nor moved until `finish` or `drop`.
        Ok(unsafe { self.arena.region_mut(loc.offset, data_size) })
    }

    fn is_allocated(&self) -> bool {
        self.loc.is_some()
    }
}

impl StoreLanding<'_> {
    /// Seals the copy (waking the gets) and lets it go to the LRU.
    fn finish(&mut self) {
        if self.loc.take().is_none() {
            return;
        }
        let c = self.cluster;
        lock(&c.cached).insert(self.id);
        let mut sh = c.shared.lock();
        let now = now_us();
        let mut fx = sh.store.seal(c.agent, self.id, now).unwrap_or_default();
        fx.extend(sh.store.release(c.agent, self.id).unwrap_or_default());
        sh.deliver(fx);
    }
}

impl Drop for StoreLanding<'_> {
    fn drop(&mut self) {
        if self.loc.take().is_some() {
            let c = self.cluster;
            let mut sh = c.shared.lock();
            if let Ok(fx) = sh.store.abort(c.agent, self.id) {
                sh.deliver(fx);
            }
        }
    }
}

/// Serves this store's sealed objects to other members' pulls.
#[derive(Debug)]
pub struct StoreSource(pub Arc<Cluster>);

impl Source for StoreSource {
    fn pin(&self, id: ObjectId) -> Option<Pinned> {
        let c = &self.0;
        let sh = c.shared.wait_restored(c.shared.lock(), id);
        let (mut sh, restored) = c.shared.with_room(sh, |sh| sh.unspill(id));
        if restored.is_err() {
            return None;
        }
        let loc = sh.store.get(c.agent, id)?;
        let arena = sh.arena.clone();
        let (shared, agent) = (c.shared.clone(), c.agent);
        Some(Pinned {
            arena,
            offset: loc.offset,
            data_size: loc.data_size,
            metadata_offset: loc.metadata_offset(),
            metadata_size: loc.metadata_size,
            unpin: Some(Box::new(move || {
                let mut sh = shared.lock();
                if let Ok(fx) = sh.store.release(agent, id) {
                    sh.deliver(fx);
                }
            })),
        })
    }

    fn is_spilled(&self, id: ObjectId) -> bool {
        let sh = self.0.shared.lock();
        sh.store.is_spilled(&id) || sh.store.is_restoring(&id)
    }

    fn served(&self, bytes: u64) {
        let c = &self.0.counters;
        c.served.fetch_add(1, Ordering::Relaxed);
        c.served_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}
