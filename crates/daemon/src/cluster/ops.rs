//! The cluster-wide operations behind a client's requests: claiming ids,
//! directory updates and lookups routed to each id's owner and backup,
//! cluster-wide contains, delete and list.

use super::directory::{Change, Claim, Entry, State};
use super::{lock, pb, wire_error, Cluster};
use ferroplasma_protocol::pb as wire;
use ferroplasma_protocol::{pack_ids, unpack_ids, ObjectId};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// The longest a single directory lookup waits on the owner; longer waits
/// are several lookups in a row.
pub const MAX_LOOKUP_WAIT: Duration = Duration::from_secs(10);

fn unavailable(what: &str, e: &tonic::Status) -> wire::Error {
    wire_error(
        wire::ErrorCode::ClusterUnavailable,
        format!(
            "{what}: cluster member unreachable ({}); retry shortly",
            e.message()
        ),
        None,
    )
}

/// A directory entry on the wire.
pub fn entry_pb(e: Option<&Entry>) -> pb::Entry {
    match e {
        None => pb::Entry::default(),
        // Deleted: reads as absent (a get waits for a new object).
        Some(e) if e.state == State::Deleted => pb::Entry::default(),
        Some(e) => pb::Entry {
            state: match e.state {
                State::Creating { .. } => pb::EntryState::Creating,
                State::Sealed => pb::EntryState::Sealed,
                State::Lost => pb::EntryState::Lost,
                State::Deleted => pb::EntryState::Absent,
            } as i32,
            holders: e.holders.iter().map(|h| h.to_string()).collect(),
            data_size: e.data_size,
            metadata_size: e.metadata_size,
        },
    }
}

/// A directory change from the wire (`None` for an unknown op).
pub fn change_of(op: &pb::Op) -> Option<Change> {
    let (data_size, metadata_size) = (op.data_size, op.metadata_size);
    match pb::OpKind::try_from(op.kind).ok()? {
        pb::OpKind::SealedPrimary => Some(Change::SealedPrimary {
            data_size,
            metadata_size,
            version: op.version,
        }),
        pb::OpKind::SealedCached => Some(Change::SealedCached {
            data_size,
            metadata_size,
        }),
        pb::OpKind::Dropped => Some(Change::Dropped),
        pb::OpKind::Aborted => Some(Change::Aborted),
        pb::OpKind::Unspecified => None,
    }
}

impl Cluster {
    async fn claim_at(
        &self,
        target: &str,
        id: ObjectId,
        ring: u64,
        rejoin: bool,
    ) -> Result<bool, tonic::Status> {
        if target == self.me {
            return self.claim_local(id, &self.me, ring, rejoin);
        }
        let msg = pb::ClaimRequest {
            node: self.me.clone(),
            object_ids: id.0.to_vec(),
            ring,
            rejoin,
        };
        let mut c = self.peers.get(target)?;
        let r = c.claim(self.peers.request(msg, Duration::ZERO)).await?;
        Ok(r.into_inner().granted.first().copied().unwrap_or(false))
    }

    /// Reserves `id` cluster-wide for an object this member creates: false
    /// when it is being created or sealed elsewhere.
    pub async fn claim(&self, id: ObjectId) -> Result<bool, wire::Error> {
        // News of this id still on its way to the directory (an old copy
        // dropped, a create aborted) goes first: arriving after the claim,
        // it would cancel it. (Bounded: an owner that takes no update is
        // declared dead within the peer timeout, and the agent moves on.)
        // A member that has just started does not know the ring yet: alone
        // in it, it would grant itself any id.
        while !self.settled() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let no_quorum = || {
            wire_error(
                wire::ErrorCode::ClusterUnavailable,
                "this member sees no majority of the cluster alive (it may be cut off): \
                 new ids cannot be claimed until it does; retry shortly"
                    .into(),
                Some(id),
            )
        };
        if !lock(&self.membership).has_quorum(std::time::Instant::now()) {
            return Err(no_quorum());
        }
        let give_up = tokio::time::Instant::now() + 3 * self.peers.timeout();
        loop {
            let sent = self.updates_sent.notified();
            tokio::pin!(sent);
            sent.as_mut().enable();
            if !self.shared.lock().agent_pending.contains_key(&id)
                || tokio::time::Instant::now() >= give_up
            {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), sent).await;
        }
        // Just after a membership change the directory members answer
        // nothing until the ring is agreed on and rebuilt: ask again until
        // they do (or the wait is over).
        let mut pause = Duration::from_millis(10);
        let mut was_granted = false;
        let answer = loop {
            // Asked again: the members may have died around this one (it
            // was cut off), leaving it alone in its ring.
            if !lock(&self.membership).has_quorum(std::time::Instant::now()) {
                break Err(no_quorum());
            }
            match self.claim_unordered(id, false).await {
                Ok((true, ring)) => {
                    // Granted in `ring`. If the ring changed meanwhile, the
                    // re-registration may have missed this claim (the
                    // object is not in the store yet): claim again in the
                    // new ring. From here on, re-registrations re-claim it,
                    // until its object is sealed or aborted.
                    lock(&self.granted).insert(id);
                    was_granted = true;
                    if lock(&self.directory).ring() == ring {
                        return Ok(true);
                    }
                }
                Ok((false, _)) => break Ok(false),
                Err(e) if tokio::time::Instant::now() + pause >= give_up => break Err(e),
                Err(_) => {}
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        };
        if was_granted {
            // Granted in an earlier ring, refused (or unanswered) now: take
            // it back wherever it is still recorded.
            // (Unless a create of this id on another connection here has
            // landed meanwhile: the claim is that object's.)
            lock(&self.granted).remove(&id);
            let mut sh = self.shared.lock();
            if !sh.store.exists(&id) {
                sh.deliver(ferroplasma_store::Effects {
                    aborted: vec![id],
                    ..Default::default()
                });
            }
        }
        answer
    }

    /// One round of [`Cluster::claim`] (no waiting for this id's news to be
    /// sent; the agent uses it to re-claim, `rejoin`, what it creates after
    /// a ring change). Returns the answer and the ring it was asked in.
    pub(super) async fn claim_unordered(
        &self,
        id: ObjectId,
        rejoin: bool,
    ) -> Result<(bool, u64), wire::Error> {
        self.counters.claims.fetch_add(1, Ordering::Relaxed);
        let (t, ring) = {
            let d = lock(&self.directory);
            (self.targets(&id), d.ring())
        };
        let (owner, backup) = tokio::join!(self.claim_at(&t[0], id, ring, rejoin), async {
            match t.get(1) {
                Some(b) => Some(self.claim_at(b, id, ring, rejoin).await),
                None => None,
            }
        });
        let answers = [Some(&owner), backup.as_ref()].map(|a| match a {
            Some(Ok(true)) => Answer::Granted,
            Some(Ok(false)) => Answer::Refused,
            Some(Err(_)) => Answer::Silent,
            None => Answer::NoBackup,
        });
        let (granted, undo) = claim_verdict(answers);
        tracing::debug!(%id, owner = %t[0], ?answers, ?granted, rejoin, "claim");
        for (i, target) in t.iter().take(2).enumerate() {
            if undo[i] {
                // The other refused: take back this grant, or the id stays
                // reserved there for an object that is never created.
                let op = pb::Op {
                    kind: pb::OpKind::Aborted as i32,
                    object_id: id.0.to_vec(),
                    ..Default::default()
                };
                if let Err(e) = self.update_at(target, &self.me, vec![op], false, 0).await {
                    tracing::debug!(member = %target, error = %e, "could not take back a claim");
                }
            }
        }
        match (granted, owner, backup) {
            (Some(g), _, _) => Ok((g, ring)),
            (None, Err(e), _) | (None, _, Some(Err(e))) => Err(unavailable("claiming the id", &e)),
            (None, Ok(_), _) => Ok((false, ring)), // not reached: an answer decides
        }
    }

    /// Answers a claim of `id` by `node` made in ring `ring` from this
    /// member's directory (see [`super::directory::Directory::claim_in_ring`]): a
    /// grant only when both see the same ring and every member of it has
    /// re-registered since it formed; otherwise no answer (`Unavailable`),
    /// and the claimant asks again.
    pub(super) fn claim_local(
        &self,
        id: ObjectId,
        node: &str,
        ring: u64,
        rejoin: bool,
    ) -> Result<bool, tonic::Status> {
        if !rejoin && !self.settled() {
            return Err(tonic::Status::unavailable(
                "this member has just started and has not met every member yet",
            ));
        }
        let mut d = lock(&self.directory);
        let before = tracing::enabled!(tracing::Level::TRACE)
            .then(|| d.lookup(&id).map(|e| e.state.clone()));
        let answer = d.claim_in_ring(id, node, ring, rejoin);
        tracing::trace!(%id, node, ?before, ?answer, "claim answered");
        match answer {
            Claim::Granted => Ok(true),
            Claim::Refused => Ok(false),
            Claim::NotNow(why) => Err(tonic::Status::unavailable(why)),
        }
    }

    /// Applies `ops` about `node`'s copies at `target`; returns the refused
    /// ids. `node` is this member, except when correcting the directory
    /// about a holder that turned out not to have its copy.
    pub(super) async fn update_at(
        &self,
        target: &str,
        node: &str,
        ops: Vec<pb::Op>,
        rejoin: bool,
        synced_ring: u64,
    ) -> Result<Vec<ObjectId>, tonic::Status> {
        if target == self.me {
            return Ok(self.apply_update(node, &ops, rejoin, synced_ring));
        }
        let msg = pb::UpdateRequest {
            node: node.to_string(),
            ops,
            rejoin,
            synced_ring,
        };
        let mut c = self.peers.get(target)?;
        let r = c.update(self.peers.request(msg, Duration::ZERO)).await?;
        Ok(unpack_ids(&r.into_inner().refused_ids).unwrap_or_default())
    }

    /// Applies directory changes reported by `node`; returns refused ids.
    /// `synced_ring` (non-zero): with these, `node` has re-registered all
    /// it holds for that ring.
    pub(super) fn apply_update(
        &self,
        node: &str,
        ops: &[pb::Op],
        rejoin: bool,
        synced_ring: u64,
    ) -> Vec<ObjectId> {
        let mut refused = Vec::new();
        {
            let mut d = lock(&self.directory);
            if synced_ring != 0 {
                d.synced(node, synced_ring);
                tracing::debug!(
                    node,
                    ring = synced_ring,
                    complete = d.is_complete(),
                    "member re-registered"
                );
            }
            for op in ops {
                let (Ok(id), Some(ch)) = (ObjectId::from_slice(&op.object_id), change_of(op))
                else {
                    continue;
                };
                let trace = tracing::enabled!(tracing::Level::TRACE);
                let before = trace.then(|| d.lookup(&id).map(|e| e.state.clone()));
                let taken = d.update(id, node, ch, rejoin);
                if trace {
                    let after = d.lookup(&id).map(|e| e.state.clone());
                    tracing::trace!(%id, node, ?ch, rejoin, ?before, ?after, taken, "directory update");
                }
                if !taken {
                    tracing::debug!(%id, node, ?ch, entry = ?d.lookup(&id), "directory update refused");
                    refused.push(id);
                }
            }
        }
        self.directory_changed.notify_waiters();
        refused
    }

    /// Entries from this member's directory; with `wait`, once every id is
    /// sealed or lost (with `any`, once one is), or the wait is over.
    pub(super) async fn lookup_local(
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

    pub(super) async fn lookup_at(
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
            for piece in idx.chunks(super::service::MAX_IDS) {
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
    pub(super) fn by_target(
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
    pub(super) async fn lookup_at_backups(
        &self,
        ids: &[ObjectId],
        idx: Vec<usize>,
    ) -> Vec<(usize, pb::Entry)> {
        let mut out = Vec::new();
        for (backup, idx) in self.by_target(ids, idx, 1) {
            for piece in idx.chunks(super::service::MAX_IDS) {
                let want: Vec<ObjectId> = piece.iter().map(|&i| ids[i]).collect();
                if let Ok(entries) = self.lookup_at(&backup, &want, Duration::ZERO, true).await {
                    out.extend(piece.iter().copied().zip(entries));
                }
            }
        }
        out
    }

    /// Whether each id is sealed on some live member.
    pub async fn contains(&self, ids: Vec<ObjectId>) -> Result<Vec<bool>, wire::Error> {
        let mut out = Vec::with_capacity(ids.len());
        for piece in ids.chunks(super::service::MAX_IDS) {
            out.extend(self.contains_piece(piece).await?);
        }
        Ok(out)
    }

    /// [`Cluster::contains`] of at most `MAX_IDS` ids (what one peer request
    /// may carry).
    async fn contains_piece(&self, ids: &[ObjectId]) -> Result<Vec<bool>, wire::Error> {
        let mut present = vec![false; ids.len()];
        let mut by_owner: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        {
            let sh = self.shared.lock();
            for (i, id) in ids.iter().enumerate() {
                if sh.store.contains(id) {
                    present[i] = true;
                } else {
                    by_owner
                        .entry(self.targets(id).remove(0))
                        .or_default()
                        .push(i);
                }
            }
        }
        for (owner, idx) in by_owner {
            let want: Vec<ObjectId> = idx.iter().map(|&i| ids[i]).collect();
            let entries = match self.lookup_at(&owner, &want, Duration::ZERO, false).await {
                Ok(e) => e,
                Err(_) => {
                    let mut v = Vec::with_capacity(want.len());
                    for id in &want {
                        v.push(self.lookup(*id, Duration::ZERO).await?);
                    }
                    v
                }
            };
            let m = lock(&self.membership);
            for (i, e) in idx.into_iter().zip(entries) {
                present[i] = e.state == pb::EntryState::Sealed as i32
                    && e.holders.iter().any(|h| m.is_alive(h));
            }
        }
        Ok(present)
    }

    /// Deletes every copy of each id, everywhere (each deferred while
    /// referenced where it lies). Returns a `DeleteStatus` per id.
    pub async fn delete(self: &Arc<Self>, ids: Vec<ObjectId>) -> Result<Vec<i32>, wire::Error> {
        let mut out = Vec::with_capacity(ids.len());
        for piece in ids.chunks(super::service::MAX_IDS) {
            out.extend(self.delete_piece(piece).await?);
        }
        Ok(out)
    }

    /// [`Cluster::delete`] of at most `MAX_IDS` ids (what one peer request
    /// may carry).
    async fn delete_piece(self: &Arc<Self>, ids: &[ObjectId]) -> Result<Vec<i32>, wire::Error> {
        use wire::DeleteStatus as S;
        let started = crate::shared::now_us();
        let mut status: Vec<i32> = self.drop_local(ids);
        let mut by_target: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, id) in ids.iter().enumerate() {
            for t in self.targets(id) {
                by_target.entry(t).or_default().push(i);
            }
        }
        // Forget the entries (owner and backup), collecting every holder.
        let mut holders: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (t, idx) in by_target {
            let want: Vec<ObjectId> = idx.iter().map(|&i| ids[i]).collect();
            let entries = if t == self.me {
                self.forget_local(&want)
            } else {
                let msg = pb::ForgetRequest {
                    object_ids: pack_ids(&want),
                };
                let r = async {
                    let mut c = self.peers.get(&t)?;
                    c.forget(self.peers.request(msg, Duration::ZERO)).await
                }
                .await;
                match r {
                    Ok(r) => r.into_inner().entries,
                    Err(e) => {
                        tracing::warn!(member = %t, error = %e, "delete: could not reach a directory member");
                        continue;
                    }
                }
            };
            for (i, e) in idx.into_iter().zip(entries) {
                for h in e.holders {
                    if h != self.me {
                        let v = holders.entry(h).or_default();
                        if !v.contains(&i) {
                            v.push(i);
                        }
                    }
                }
                if e.state != pb::EntryState::Absent as i32 && status[i] == S::NotFound as i32 {
                    status[i] = S::Deleted as i32;
                }
            }
        }
        self.directory_changed.notify_waiters();
        // Drop the copies on the other holders. One that cannot be reached
        // makes the delete pending (`Deferred`): a live one is asked again
        // (backoff) until it answers or is declared dead; one that is dead
        // drops its copy when it returns, since the directory refuses it.
        for (h, idx) in holders {
            let gone: Vec<ObjectId> = idx.iter().map(|&i| ids[i]).collect();
            let answered = if lock(&self.membership).is_alive(&h) {
                self.drop_copies_at(&h, &gone, started).await
            } else {
                Err(tonic::Status::unavailable("declared dead"))
            };
            match answered {
                Ok(st) => {
                    for (i, s) in idx.into_iter().zip(st) {
                        if s == S::Deferred as i32 || status[i] == S::NotFound as i32 {
                            status[i] = s;
                        }
                    }
                }
                Err(e) => {
                    tracing::info!(member = %h, error = %e, objects = gone.len(),
                        "delete pending: a member holding copies did not answer");
                    for i in idx {
                        status[i] = S::Deferred as i32;
                    }
                    self.keep_dropping(h, gone, started);
                }
            }
        }
        Ok(status)
    }

    /// Asks `member` to drop its copies of `ids`; a `DeleteStatus` each.
    async fn drop_copies_at(
        &self,
        member: &str,
        ids: &[ObjectId],
        sealed_before_us: i64,
    ) -> Result<Vec<i32>, tonic::Status> {
        let msg = pb::DropCopiesRequest {
            object_ids: pack_ids(ids),
            sealed_before_us,
        };
        let mut c = self.peers.get(member)?;
        let r = c
            .drop_copies(self.peers.request(msg, Duration::ZERO))
            .await?;
        Ok(r.into_inner().status)
    }

    /// Goes on asking a live `member` to drop its copies of deleted objects
    /// (on the cluster's thread) until it answers or is declared dead.
    fn keep_dropping(self: &Arc<Self>, member: String, ids: Vec<ObjectId>, before: i64) {
        use backon::Retryable;
        let c = self.clone();
        self.rt.spawn(async move {
            let backoff = super::retry::builder(Duration::from_millis(50), Duration::from_secs(2));
            let r = (|| c.drop_copies_at(&member, &ids, before))
                .retry(backoff)
                .when(|_| lock(&c.membership).is_alive(&member))
                .await;
            match r {
                Ok(_) => tracing::info!(%member, objects = ids.len(), "pending delete completed"),
                Err(_) => tracing::info!(%member, objects = ids.len(),
                    "member declared dead; it drops the deleted copies when it returns"),
            }
        });
    }

    /// Removes this member's directory entries of deleted objects; returns
    /// what they held.
    pub(super) fn forget_local(&self, ids: &[ObjectId]) -> Vec<pb::Entry> {
        let entries = {
            let mut d = lock(&self.directory);
            ids.iter()
                .map(|id| entry_pb(d.forget(id).as_ref()))
                .collect()
        };
        self.directory_changed.notify_waiters();
        entries
    }

    /// Deletes this member's copies; a `DeleteStatus` per id.
    pub(super) fn drop_local(&self, ids: &[ObjectId]) -> Vec<i32> {
        self.drop_local_sealed_before(ids, None)
    }

    /// [`Cluster::drop_local`] of the copies sealed before `before` (µs
    /// since the epoch) only: a newer one is another object (`NotFound`).
    pub(super) fn drop_local_sealed_before(
        &self,
        ids: &[ObjectId],
        before: Option<i64>,
    ) -> Vec<i32> {
        let mut sh = self.shared.lock();
        ids.iter()
            .map(|id| {
                let newer = before
                    .zip(sh.store.sealed_at_us(id))
                    .is_some_and(|(b, sealed)| sealed >= b);
                if newer {
                    return wire::DeleteStatus::NotFound as i32;
                }
                let (outcome, fx) = sh.store.delete(*id);
                sh.deliver(fx);
                crate::convert::delete_status(outcome)
            })
            .collect()
    }

    /// This member's objects, as the wire lists them.
    pub(super) fn list_local(&self) -> Vec<pb::ListedObject> {
        let list = self.shared.lock().store.list();
        let cached = lock(&self.cached);
        list.iter()
            .map(|o| {
                let w = crate::convert::info(o);
                pb::ListedObject {
                    cached: cached.contains(&o.id),
                    object_id: w.object_id,
                    data_size: w.data_size,
                    metadata_size: w.metadata_size,
                    ref_count: w.ref_count,
                    sealed: w.state == wire::ObjectState::Sealed as i32,
                    create_time_us: w.create_time_us,
                    construct_duration_us: w.construct_duration_us,
                    delete_pending: w.delete_pending,
                    spilled: w.spilled,
                }
            })
            .collect()
    }

    /// Every live member's objects, each naming its member.
    pub async fn list(&self) -> Vec<wire::ObjectInfo> {
        let alive = lock(&self.membership).alive();
        let mut out = Vec::new();
        for m in alive {
            let objects = if m == self.me {
                self.list_local()
            } else {
                let r = async {
                    let mut c = self.peers.get(&m)?;
                    c.list_local(self.peers.request(pb::ListLocalRequest {}, Duration::ZERO))
                        .await
                }
                .await;
                match r {
                    Ok(r) => r.into_inner().objects,
                    Err(e) => {
                        tracing::warn!(member = %m, error = %e, "list: member did not answer");
                        continue;
                    }
                }
            };
            out.extend(objects.into_iter().map(|o| wire::ObjectInfo {
                object_id: o.object_id,
                data_size: o.data_size,
                metadata_size: o.metadata_size,
                ref_count: o.ref_count,
                state: if o.sealed {
                    wire::ObjectState::Sealed
                } else {
                    wire::ObjectState::Created
                } as i32,
                create_time_us: o.create_time_us,
                construct_duration_us: o.construct_duration_us,
                delete_pending: o.delete_pending,
                spilled: o.spilled,
                node: m.clone(),
                cached: o.cached,
            }));
        }
        out
    }
}

/// One directory member's answer to a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Granted,
    Refused,
    /// Unreachable, or no answer yet (see `claim_local`).
    Silent,
    /// A ring of one member: no backup to ask.
    NoBackup,
}

/// Combines the owner's and the backup's answers to a claim: refused if
/// either refused (one id never names two objects), granted only if both
/// granted (or the ring has one member), `None` if one of them did not
/// answer: it may be alive on the far side of a cut, granting the id to
/// someone else, so the claimant asks again until it answers or is declared
/// dead (and the ring changes). The second value says where a grant must
/// be taken back.
fn claim_verdict(answers: [Answer; 2]) -> (Option<bool>, [bool; 2]) {
    let grants = answers.map(|a| a == Answer::Granted);
    if answers.contains(&Answer::Refused) {
        (Some(false), grants)
    } else if answers.contains(&Answer::Silent) {
        (None, grants)
    } else {
        (Some(true), [false; 2])
    }
}

#[cfg(test)]
mod tests {
    use super::{claim_verdict, Answer::*};

    #[test]
    fn a_claim_is_granted_only_when_both_directory_members_grant_it() {
        assert_eq!(claim_verdict([Granted, Granted]), (Some(true), [false; 2]));
        assert_eq!(claim_verdict([Granted, NoBackup]), (Some(true), [false; 2]));
        // A silent member may be granting the id on the far side of a cut:
        // no verdict (ask again), and the grant given is taken back.
        assert_eq!(claim_verdict([Granted, Silent]), (None, [true, false]));
        assert_eq!(claim_verdict([Silent, Granted]), (None, [false, true]));
        // The owner's grant no longer wins over the backup's refusal, and
        // the backup's grant is taken back when the owner refuses.
        assert_eq!(
            claim_verdict([Granted, Refused]),
            (Some(false), [true, false])
        );
        assert_eq!(
            claim_verdict([Refused, Granted]),
            (Some(false), [false, true])
        );
        assert_eq!(claim_verdict([Refused, Silent]), (Some(false), [false; 2]));
        assert_eq!(claim_verdict([Silent, Silent]), (None, [false; 2]));
    }
}
