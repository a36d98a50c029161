//! Cluster-wide delete: the directory entries forgotten at each id's owner
//! and backup, every holder's copy dropped (calling side); this member's
//! entries and copies dropped when asked (answering side).

use crate::cluster::Cluster;
use crate::pb;
use crate::peers::retry;
use crate::sync::{lock, now_us};
use crate::wire::{delete_status, entry_pb, MAX_IDS};
use ferroplasma_protocol::pb as wire;
use ferroplasma_protocol::{pack_ids, ObjectId};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

impl Cluster {
    /// Deletes every copy of each id, everywhere (each deferred while
    /// referenced where it lies). Returns a `DeleteStatus` per id.
    pub async fn delete(self: &Arc<Self>, ids: Vec<ObjectId>) -> Result<Vec<i32>, wire::Error> {
        let mut out = Vec::with_capacity(ids.len());
        for piece in ids.chunks(MAX_IDS) {
            out.extend(self.delete_piece(piece).await?);
        }
        Ok(out)
    }

    /// [`Cluster::delete`] of at most `MAX_IDS` ids (what one peer request
    /// may carry).
    async fn delete_piece(self: &Arc<Self>, ids: &[ObjectId]) -> Result<Vec<i32>, wire::Error> {
        use wire::DeleteStatus as S;
        let started = now_us();
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
            let backoff = retry::builder(Duration::from_millis(50), Duration::from_secs(2));
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
    pub(crate) fn forget_local(&self, ids: &[ObjectId]) -> Vec<pb::Entry> {
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
    pub(crate) fn drop_local(&self, ids: &[ObjectId]) -> Vec<i32> {
        self.drop_local_sealed_before(ids, None)
    }

    /// [`Cluster::drop_local`] of the copies sealed before `before` (µs
    /// since the epoch) only: a newer one is another object (`NotFound`).
    pub(crate) fn drop_local_sealed_before(
        &self,
        ids: &[ObjectId],
        before: Option<i64>,
    ) -> Vec<i32> {
        (self.store.delete(ids, before).into_iter())
            .map(delete_status)
            .collect()
    }
}
