//! Cluster operations a request starts and that finish later (claims of
//! new ids, cluster-wide contains/delete/list, remote fetches): they report
//! back on the connection's channel and are answered here.

use super::{parse_id, Connection, Refusal};
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

impl Connection {
    /// In a cluster, a create first claims its id cluster-wide (the create
    /// resumes in `on_completion`); an id taken locally needs no round trip
    /// to be refused. A lone store never claims.
    pub(super) fn needs_claim(&self, id: &ObjectId) -> bool {
        self.cluster.is_some() && !self.shared.lock().store.exists(id)
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
