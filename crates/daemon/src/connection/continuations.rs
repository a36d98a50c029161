//! Cluster operations a request starts and that finish later (claims of
//! new ids, cluster-wide contains/delete/list, remote fetches): they report
//! back on the connection's channel and are answered here.

use super::{parse_id, refuse, Connection, Refusal};
use ferroplasma_cluster::Completion;
use ferroplasma_protocol::pb::{self, reply, request};
use ferroplasma_protocol::ObjectId;
use tracing::Instrument;

/// Gives back the claim of `id` unless the store holds an object of that
/// id (see [`Connection::unclaim`]).
pub(super) fn unclaim(shared: &crate::shared::SharedRef, id: ObjectId) {
    let mut sh = shared.lock();
    if !sh.store.exists(&id) {
        sh.deliver(ferroplasma_store::Effects {
            aborted: vec![id],
            ..Default::default()
        });
    }
}

/// What a create must do about its id's claim ([`Connection::claim_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClaimOf {
    /// A lone store, or an id this store holds already.
    NotNeeded,
    /// Claimed already: the store handed it to this connection.
    Handed,
    /// Claim it first.
    Needed,
}

impl Connection {
    /// Whether a create of `id` must first claim it cluster-wide (in a
    /// cluster; the create resumes in `on_completion`). An id taken locally
    /// needs no round trip to be refused, and one the store handed this
    /// connection (`NewIds`) is claimed already. A lone store never claims.
    pub(super) fn claim_of(&self, id: &ObjectId) -> ClaimOf {
        if self.cluster.is_none() {
            return ClaimOf::NotNeeded;
        }
        let mut sh = self.shared.lock();
        if sh.store.exists(id) {
            ClaimOf::NotNeeded
        } else if sh.take_handed(self.client, id) {
            ClaimOf::Handed
        } else {
            ClaimOf::Needed
        }
    }

    /// Claims `id` cluster-wide, then resumes `request` (Create or
    /// CreateAndSeal) in `on_completion`.
    pub(super) fn start_claim(&self, rid: u64, id: ObjectId, request: request::Body) {
        let Some(cl) = self.cluster.clone() else {
            return;
        };
        let tx = self.done_tx.clone();
        let shared = self.shared.clone();
        let work = async move {
            let result = match cl.claim(id).await {
                Ok(true) => Ok(()),
                Ok(false) => Err(ferroplasma_cluster::wire_error(
                    pb::ErrorCode::ObjectExists,
                    format!("object {id} already exists in the cluster"),
                    Some(id),
                )),
                Err(e) => Err(e),
            };
            let granted = result.is_ok();
            let undelivered = tx.send(Completion::Claimed {
                request_id: rid,
                request,
                result,
            });
            if undelivered.is_err() && granted {
                // The client left while the claim was out: nobody creates
                // the object, so the id goes back.
                unclaim(&shared, id);
            }
        };
        tokio::spawn(work.in_current_span());
    }

    /// A `NewIds`: ids for new objects. On a cluster member, ids claimed
    /// cluster-wide ahead (at once from the cluster's pool, else after a
    /// claim round), recorded as this connection's; on a lone store,
    /// random ids no object has.
    pub(super) fn new_ids(&self, rid: u64, count: u32) -> Result<Option<reply::Body>, Refusal> {
        use crate::shared::MAX_HELD;
        const MOST: u32 = ferroplasma_cluster::ops::fresh::BATCH as u32;
        if !(1..=MOST).contains(&count) {
            return Err(refuse(
                pb::ErrorCode::InvalidRequest,
                format!("NewIds.count is {count}: ask for 1 to {MOST} ids"),
            ));
        }
        let client = self.client;
        let held = self.shared.lock().held(client);
        if held + count as usize > MAX_HELD {
            return Err(refuse(
                pb::ErrorCode::TooLarge,
                format!(
                    "this connection holds {held} ids from NewIds it has not created objects \
                     with (at most {MAX_HELD}): create with those before asking for more"
                ),
            ));
        }
        let packed = |ids: &[ObjectId]| -> Vec<u8> { ids.iter().flat_map(|id| id.0).collect() };
        let Some(cl) = self.cluster.clone() else {
            let sh = self.shared.lock();
            let ids: Vec<ObjectId> = (0..count)
                .map(|_| ObjectId::random())
                .filter(|id| !sh.store.exists(id))
                .collect();
            return Ok(Some(reply::Body::NewIds(pb::NewIdsReply {
                object_ids: packed(&ids),
            })));
        };
        let shared = self.shared.clone();
        self.spawn_reply(rid, async move {
            let ids = cl.fresh_ids(count as usize).await?;
            // Checked again: requests sent back to back all passed the
            // check above before any was answered.
            let ids = shared.lock().hand(client, ids);
            if ids.is_empty() {
                return Err(ferroplasma_cluster::wire_error(
                    pb::ErrorCode::TooLarge,
                    format!(
                        "this connection holds {MAX_HELD} ids from NewIds it has not created \
                         objects with: create with those before asking for more"
                    ),
                    None,
                ));
            }
            Ok(reply::Body::NewIds(pb::NewIdsReply {
                object_ids: packed(&ids),
            }))
        });
        Ok(None)
    }

    /// Runs a cluster operation and answers request `rid` with its result.
    pub(super) fn spawn_reply(
        &self,
        rid: u64,
        op: impl std::future::Future<Output = Result<reply::Body, pb::Error>> + Send + 'static,
    ) {
        let tx = self.done_tx.clone();
        let work = async move {
            let body = op.await;
            let _ = tx.send(Completion::Reply {
                request_id: rid,
                body,
            });
        };
        tokio::spawn(work.in_current_span());
    }

    /// Gives a claimed id back after its create failed, unless this store
    /// holds an object of that id: then the claim is that object's (two
    /// creates of one id raced here, and this one lost), and giving it back
    /// would let another member create the id again.
    pub(super) fn unclaim(&self, id: ObjectId) {
        if self.cluster.is_some() {
            unclaim(&self.shared, id);
        }
    }

    pub(super) fn on_completion(&mut self, done: Completion) {
        match done {
            Completion::Reply { request_id, body } => match body {
                Ok(b) => self.push_reply(request_id, b),
                Err(e) => self.push_reply(request_id, reply::Body::Error(e)),
            },
            Completion::Claimed {
                request_id,
                result: Err(e),
                ..
            } => self.push_reply(request_id, reply::Body::Error(e)),
            Completion::Claimed {
                request_id: rid,
                request,
                result: Ok(()),
            } => {
                let r = match request {
                    request::Body::Create(c) => match parse_id(&c.object_id) {
                        Ok(id) => {
                            let r = self.create(rid, id, c, true);
                            if r.is_err() {
                                self.unclaim(id);
                            }
                            r
                        }
                        Err(e) => Err(e),
                    },
                    request::Body::CreateAndSeal(c) => match parse_id(&c.object_id) {
                        Ok(id) => {
                            let r = self.create_and_seal(rid, id, c, true);
                            if r.is_err() {
                                self.unclaim(id);
                            }
                            r
                        }
                        Err(e) => Err(e),
                    },
                    _ => Ok(None),
                };
                match r {
                    Ok(Some(b)) => self.push_reply(rid, b),
                    Ok(None) => {}
                    Err(Refusal(e)) => self.push_reply(rid, reply::Body::Error(e)),
                }
            }
            Completion::FetchFailed { id, error } => self.fail_gets(id, error),
        }
    }
}
