//! Directory lookups: where ids are, asked of their owners (their backups
//! when an owner does not answer), answered from this member's directory,
//! waiting for a seal when asked to.

use crate::cluster::Cluster;
use crate::pb;
use crate::sync::lock;
use crate::wire::{entry_pb, unavailable, MAX_IDS, MAX_LOOKUP_WAIT};
use ferroplasma_protocol::pb as wire;
use ferroplasma_protocol::{pack_ids, ObjectId};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

impl Cluster {
    /// Entries from this member's directory; with `wait`, once every id is
    /// sealed or lost (with `any`, once one is), or the wait is over.
    pub(crate) async fn lookup_local(
        &self,
        ids: &[ObjectId],
        wait: Duration,
        any: bool,
    ) -> Vec<pb::Entry> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let changed = self.directory_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let entries: Vec<pb::Entry> = {
                let d = lock(&self.directory);
                ids.iter().map(|id| entry_pb(d.lookup(id))).collect()
            };
            let is_settled = |e: &pb::Entry| {
                e.state == pb::EntryState::Sealed as i32 || e.state == pb::EntryState::Lost as i32
            };
            let settled = if any {
                entries.iter().any(is_settled)
            } else {
                entries.iter().all(is_settled)
            };
            if settled || wait.is_zero() {
                return entries;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return entries;
            }
        }
    }

    pub(crate) async fn lookup_at(
        &self,
        target: &str,
        ids: &[ObjectId],
        wait: Duration,
        any: bool,
    ) -> Result<Vec<pb::Entry>, tonic::Status> {
        if target == self.me {
            return Ok(self.lookup_local(ids, wait, any).await);
        }
        self.counters.lookups.fetch_add(1, Ordering::Relaxed);
        let msg = pb::LookupRequest {
            object_ids: pack_ids(ids),
            wait_ms: wait.as_millis() as i64,
            any,
        };
        let mut c = self.peers.get(target)?;
        let r = c.lookup(self.peers.request(msg, wait)).await?.into_inner();
        if r.entries.len() != ids.len() {
            return Err(tonic::Status::internal(
                "lookup answered the wrong number of ids",
            ));
        }
        Ok(r.entries)
    }

    /// Where `id` is, asking its owner (its backup if the owner fails).
    pub async fn lookup(&self, id: ObjectId, wait: Duration) -> Result<pb::Entry, wire::Error> {
        let wait = wait.min(MAX_LOOKUP_WAIT);
        let mut last = None;
        for t in self.targets(&id) {
            match self.lookup_at(&t, &[id], wait, false).await {
                Ok(mut v) => return Ok(v.remove(0)),
                Err(e) => last = Some(e),
            }
        }
        Err(unavailable(
            "looking the object up",
            &last.unwrap_or_else(|| tonic::Status::unavailable("no members")),
        ))
    }

    /// Where each of `ids` is: one lookup per owner (its backup's for the
    /// ids of an owner that does not answer), all owners at once; with
    /// `wait`, each answers once one of its ids is sealed or lost (or the
    /// wait is over). `None` for an id neither owner nor backup answered.
    pub async fn lookup_many(
        self: Arc<Self>,
        ids: &[ObjectId],
        wait: Duration,
    ) -> Vec<Option<pb::Entry>> {
        let wait = wait.min(MAX_LOOKUP_WAIT);
        let by_owner = self.by_target(ids, 0..ids.len(), 0);
        let mut asks = tokio::task::JoinSet::new();
        for (owner, idx) in by_owner {
            for piece in idx.chunks(MAX_IDS) {
                let want: Vec<ObjectId> = piece.iter().map(|&i| ids[i]).collect();
                let (c, piece) = (self.clone(), piece.to_vec());
                let owner = owner.clone();
                asks.spawn(tracing::Instrument::in_current_span(async move {
                    let r = c.lookup_at(&owner, &want, wait, true).await;
                    if let Err(e) = &r {
                        tracing::debug!(member = %owner, error = %e, "lookup failed; asking the backups");
                    }
                    (piece, r.ok())
                }));
            }
        }
        let mut out: Vec<Option<pb::Entry>> = vec![None; ids.len()];
        let mut orphans = Vec::new();
        while let Some(done) = asks.join_next().await {
            let Ok((piece, answer)) = done else {
                continue;
            };
            match answer {
                Some(entries) => {
                    for (i, e) in piece.into_iter().zip(entries) {
                        out[i] = Some(e);
                    }
                }
                None => orphans.extend(piece),
            }
        }
        // The owner did not answer: its backups, without waiting (the
        // fetch asks again).
        for (i, e) in self.lookup_at_backups(ids, orphans).await {
            out[i] = Some(e);
        }
        out
    }

    /// The indices `idx` of `ids`, grouped by each id's owner (`nth` 0) or
    /// backup (1) in the current ring.
    pub(crate) fn by_target(
        &self,
        ids: &[ObjectId],
        idx: impl IntoIterator<Item = usize>,
        nth: usize,
    ) -> BTreeMap<String, Vec<usize>> {
        let ring = lock(&self.ring);
        let mut by: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for i in idx {
            if let Some(t) = ring.owners(&ids[i], nth + 1).get(nth) {
                by.entry(t).or_default().push(i);
            }
        }
        by.into_iter().map(|(t, v)| (t.to_string(), v)).collect()
    }

    /// The entries of the ids at `idx` of `ids` from their backups, at once
    /// (their owners did not answer); those nobody answered for are left
    /// out.
    pub(crate) async fn lookup_at_backups(
        &self,
        ids: &[ObjectId],
        idx: Vec<usize>,
    ) -> Vec<(usize, pb::Entry)> {
        let mut out = Vec::new();
        for (backup, idx) in self.by_target(ids, idx, 1) {
            for piece in idx.chunks(MAX_IDS) {
                let want: Vec<ObjectId> = piece.iter().map(|&i| ids[i]).collect();
                if let Ok(entries) = self.lookup_at(&backup, &want, Duration::ZERO, true).await {
                    out.extend(piece.iter().copied().zip(entries));
                }
            }
        }
        out
    }
}
