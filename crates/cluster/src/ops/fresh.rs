//! Ids claimed ahead: random ids this member has claimed cluster-wide
//! before anyone asked for them, handed to its clients for new objects
//! (`NewIds`), so that creating one asks no other member (docs/cluster.md,
//! "Ids the store hands out").
//!
//! A batch is claimed with one request to each directory member it
//! touches, and each id is granted exactly as a single claim is: by its
//! owner and its backup in the same ring. Until its object is created, a
//! handed id is an ordinary granted claim (`Cluster::granted`): a
//! re-registration re-claims it with the new owners, and a client that
//! leaves without creating it gives it back (the store's aborted notice).

use crate::cluster::Cluster;
use crate::pb;
use crate::sync::lock;
use ferroplasma_protocol::pb as wire;
use ferroplasma_protocol::ObjectId;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Ids one claim round asks for.
pub const BATCH: usize = 256;
/// The pool is topped up when it falls below this many ids, up to twice
/// as many: few enough that a re-registration re-claims them quickly.
pub const LOW: usize = 256;

impl Cluster {
    /// Up to `n` ids claimed ahead for new objects, at least one. From the
    /// pool when it has them (no round trip), else after a claim round;
    /// the pool is topped up in the background.
    pub async fn fresh_ids(self: &Arc<Self>, n: usize) -> Result<Vec<ObjectId>, wire::Error> {
        let n = n.clamp(1, BATCH);
        // A member cut off from the majority hands out nothing, as it
        // claims nothing.
        if !lock(&self.membership).has_quorum(std::time::Instant::now()) {
            return Err(crate::wire::wire_error(
                wire::ErrorCode::ClusterUnavailable,
                "this member sees no majority of the cluster alive (it may be cut off): new \
                 ids cannot be handed out until it does; retry shortly"
                    .into(),
                None,
            ));
        }
        let (mut out, refill) = {
            let mut pool = lock(&self.fresh);
            let take = n.min(pool.len());
            let at = pool.len() - take;
            (pool.split_off(at), pool.len() < LOW)
        };
        if refill && !self.refilling.swap(true, Ordering::AcqRel) {
            let me = Arc::clone(self);
            self.rt.spawn(async move {
                me.refill().await;
                me.refilling.store(false, Ordering::Release);
            });
        }
        let give_up = tokio::time::Instant::now() + 3 * self.peers.timeout();
        let mut pause = Duration::from_millis(10);
        while out.is_empty() {
            match self.claim_batch(BATCH).await {
                Ok(mut got) => {
                    let keep = got.len().saturating_sub(n);
                    let extra = got.split_off(got.len() - keep);
                    out = got;
                    lock(&self.fresh).extend(extra);
                }
                Err(e) if tokio::time::Instant::now() + pause >= give_up => return Err(e),
                Err(_) => {}
            }
            if out.is_empty() {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(200));
            }
        }
        Ok(out)
    }

    /// Tops the pool up to `2 × LOW`; stops at the first round that
    /// fails (the next `fresh_ids` tries again).
    async fn refill(&self) {
        while lock(&self.fresh).len() < 2 * LOW {
            match self.claim_batch(BATCH).await {
                Ok(got) if !got.is_empty() => lock(&self.fresh).extend(got),
                Ok(_) => return,
                Err(e) => {
                    tracing::debug!(error = %e.message, "claiming ids ahead failed");
                    return;
                }
            }
        }
    }

    /// Claims `n` new random ids cluster-wide in one round: one request to
    /// each directory member the batch touches. Returns those granted (by
    /// owner and backup in the same ring, the ring unchanged meanwhile);
    /// the rest are taken back. An error when no claim can be made now
    /// (no majority alive, or a member that has just started).
    pub(crate) async fn claim_batch(&self, n: usize) -> Result<Vec<ObjectId>, wire::Error> {
        let unavailable = |why: &str| {
            crate::wire::wire_error(
                wire::ErrorCode::ClusterUnavailable,
                format!("new ids cannot be claimed now: {why}; retry shortly"),
                None,
            )
        };
        if !self.settled() {
            return Err(unavailable("this member has not met every member yet"));
        }
        if !lock(&self.membership).has_quorum(std::time::Instant::now()) {
            return Err(unavailable(
                "this member sees no majority of the cluster alive (it may be cut off)",
            ));
        }
        self.counters.claims.fetch_add(n as u64, Ordering::Relaxed);
        let ids: Vec<ObjectId> = (0..n).map(|_| ObjectId::random()).collect();
        let (targets, ring) = {
            let d = lock(&self.directory);
            let t: Vec<Vec<String>> = ids.iter().map(|id| self.targets(id)).collect();
            (t, d.ring())
        };
        // Which ids each member is asked for (its place in that list, per id).
        let mut asked: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, t) in targets.iter().enumerate() {
            for target in t.iter().take(2) {
                asked.entry(target.as_str()).or_default().push(i);
            }
        }
        let rounds = asked.iter().map(|(target, which)| {
            let batch: Vec<ObjectId> = which.iter().map(|&i| ids[i]).collect();
            async move { (*target, self.claim_many_at(target, &batch, ring).await) }
        });
        let answers: BTreeMap<&str, Result<Vec<bool>, tonic::Status>> =
            futures_util::future::join_all(rounds)
                .await
                .into_iter()
                .collect();
        let answer_of = |target: &str, i: usize| -> Option<bool> {
            let which = &asked[target];
            let at = which.binary_search(&i).ok()?;
            answers[target].as_ref().ok()?.get(at).copied()
        };
        let mut granted = Vec::with_capacity(n);
        let mut undo: BTreeMap<&str, Vec<pb::Op>> = BTreeMap::new();
        for (i, t) in targets.iter().enumerate() {
            let got: Vec<Option<bool>> = t.iter().take(2).map(|m| answer_of(m, i)).collect();
            if got.iter().all(|g| *g == Some(true)) {
                granted.push(ids[i]);
                continue;
            }
            // Refused or unanswered somewhere: the grants given go back,
            // wherever one may have been given (an unanswered member may
            // have granted it; `Aborted` changes nothing where it did not).
            for (m, g) in t.iter().zip(&got) {
                if *g != Some(false) {
                    undo.entry(m.as_str()).or_default().push(pb::Op {
                        kind: pb::OpKind::Aborted as i32,
                        object_id: ids[i].0.to_vec(),
                        ..Default::default()
                    });
                }
            }
        }
        for (target, ops) in undo {
            if let Err(e) = self.update_at(target, &self.me, ops, false, 0).await {
                tracing::debug!(member = %target, error = %e, "could not take back claims");
            }
        }
        // Recorded before the ring is looked at again, as a single claim
        // is: a re-registration from here on re-claims them.
        lock(&self.granted).extend(granted.iter().copied());
        if lock(&self.directory).ring() != ring {
            // The ring changed meanwhile: a re-registration may have missed
            // them. Given back (rare: the next round asks in the new ring).
            let mut g = lock(&self.granted);
            for id in &granted {
                g.remove(id);
            }
            drop(g);
            for id in granted.drain(..) {
                self.store.give_up_claim(id);
            }
        }
        if granted.is_empty() {
            return Err(unavailable("the directory members did not answer"));
        }
        Ok(granted)
    }

    /// Asks `target` to grant `ids` (one request), or answers them here.
    async fn claim_many_at(
        &self,
        target: &str,
        ids: &[ObjectId],
        ring: u64,
    ) -> Result<Vec<bool>, tonic::Status> {
        if target == self.me {
            return ids
                .iter()
                .map(|id| self.claim_local(*id, &self.me, ring, false))
                .collect();
        }
        let msg = pb::ClaimRequest {
            node: self.me.clone(),
            object_ids: ids.iter().flat_map(|id| id.0).collect(),
            ring,
            rejoin: false,
        };
        let mut c = self.peers.get(target)?;
        let r = c.claim(self.peers.request(msg, Duration::ZERO)).await?;
        let granted = r.into_inner().granted;
        if granted.len() != ids.len() {
            return Err(tonic::Status::internal("a claim answered for other ids"));
        }
        Ok(granted)
    }
}
