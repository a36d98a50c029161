//! The gRPC `Peer` service: what other members ask of this one.
//!
//! It is served on the heartbeat thread: a heartbeat is answered there at
//! once, from what this member last said of itself; claims (short, and
//! each create waits on one) and lookups are answered there too; updates,
//! forgets, drops and lists, which may go through many entries or ask the
//! store, are handed to the cluster's thread.

use crate::cluster::Cluster;
use crate::net::guard::{self, Guard, Incoming};
use crate::pb;
use crate::pb::peer_server::{Peer, PeerServer};
use crate::peers::token::Check;
use crate::sync::lock;
use crate::wire::{member_of, member_pb, MAX_IDS, MAX_LOOKUP_WAIT, MAX_OPS};
use ferroplasma_protocol::{pack_ids, unpack_ids, ObjectId};
use std::sync::Arc;
use std::time::Duration;
use tonic::{Request, Response, Status};

#[derive(Debug)]
struct Service(Arc<Cluster>);

/// How long a member's connection may move no byte once it has spoken:
/// members send a heartbeat every `--heartbeat-interval` and an HTTP/2
/// ping every `--peer-timeout` on it, so only strangers stay this quiet.
const IDLE: Duration = Duration::from_secs(60);

/// The guard of the gRPC port: at most `cap` connections; a connection
/// that sends nothing within [`guard::HELLO`], or nothing for the longer of
/// [`IDLE`] and 4 peer timeouts after that, is closed.
pub fn guard(cap: usize, peer_timeout: Duration) -> Arc<Guard> {
    Guard::new("cluster", cap, guard::HELLO, IDLE.max(4 * peer_timeout))
}

/// Serves the peer protocol on `incoming` until the task is dropped.
pub async fn serve(cluster: Arc<Cluster>, incoming: Incoming) {
    let check = Check(cluster.token.clone());
    let svc = PeerServer::new(Service(cluster))
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(256 << 20);
    let svc = tonic::service::interceptor::InterceptedService::new(svc, check);
    if let Err(e) = tonic::transport::Server::builder()
        .add_service(svc)
        .serve_with_incoming(incoming)
        .await
    {
        tracing::error!(error = %e, "the cluster service stopped");
    }
}

fn ids(packed: &[u8]) -> Result<Vec<ObjectId>, Status> {
    let v = unpack_ids(packed)
        .map_err(|_| Status::invalid_argument("object_ids is not a multiple of 20 bytes"))?;
    if v.len() > MAX_IDS {
        return Err(Status::invalid_argument(format!(
            "{} ids in one request; the limit is {MAX_IDS}",
            v.len()
        )));
    }
    Ok(v)
}

/// Runs `work` on the cluster's thread and waits for it (the heartbeat
/// thread meanwhile answers heartbeats).
async fn on_cluster_thread<T: Send + 'static>(
    c: &Cluster,
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T, Status> {
    c.rt.spawn(work)
        .await
        .map_err(|e| Status::internal(format!("cluster task failed: {e}")))
}

impl Cluster {
    /// This member and every member it knows (for gossip).
    pub(crate) fn known_with_me(&self) -> Vec<String> {
        let mut k = lock(&self.membership).known();
        k.push(self.me.clone());
        k
    }
}

#[tonic::async_trait]
impl Peer for Service {
    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatReply>, Status> {
        let r = req.into_inner();
        let c = &self.0;
        c.heard(member_of(r.from), &r.known);
        Ok(Response::new(pb::HeartbeatReply {
            from: Some(member_pb(c.info())),
            known: c.known_with_me(),
        }))
    }

    async fn claim(
        &self,
        req: Request<pb::ClaimRequest>,
    ) -> Result<Response<pb::ClaimReply>, Status> {
        let r = req.into_inner();
        let ids = ids(&r.object_ids)?;
        let granted = ids
            .into_iter()
            .map(|id| self.0.claim_local(id, &r.node, r.ring, r.rejoin))
            .collect::<Result<Vec<bool>, Status>>()?;
        Ok(Response::new(pb::ClaimReply { granted }))
    }

    async fn update(
        &self,
        req: Request<pb::UpdateRequest>,
    ) -> Result<Response<pb::UpdateReply>, Status> {
        let r = req.into_inner();
        if r.ops.len() > MAX_OPS.max(MAX_IDS) {
            return Err(Status::invalid_argument("too many ops in one update"));
        }
        let c = self.0.clone();
        let refused = on_cluster_thread(&self.0, async move {
            c.apply_update(&r.node, &r.ops, r.rejoin, r.synced_ring)
        })
        .await?;
        Ok(Response::new(pb::UpdateReply {
            refused_ids: pack_ids(&refused),
        }))
    }

    async fn lookup(
        &self,
        req: Request<pb::LookupRequest>,
    ) -> Result<Response<pb::LookupReply>, Status> {
        let req_peer = req.remote_addr();
        let r = req.into_inner();
        let ids = ids(&r.object_ids)?;
        let wait = Duration::from_millis(r.wait_ms.max(0) as u64).min(MAX_LOOKUP_WAIT);
        let from = req_peer.map(|a| a.to_string()).unwrap_or_default();
        tracing::debug!(ids = ?ids, from, "lookup asked");
        let entries = self.0.lookup_local(&ids, wait, r.any).await;
        Ok(Response::new(pb::LookupReply { entries }))
    }

    async fn forget(
        &self,
        req: Request<pb::ForgetRequest>,
    ) -> Result<Response<pb::LookupReply>, Status> {
        let ids = ids(&req.into_inner().object_ids)?;
        let c = self.0.clone();
        let entries = on_cluster_thread(&self.0, async move { c.forget_local(&ids) }).await?;
        Ok(Response::new(pb::LookupReply { entries }))
    }

    async fn drop_copies(
        &self,
        req: Request<pb::DropCopiesRequest>,
    ) -> Result<Response<pb::DropCopiesReply>, Status> {
        let r = req.into_inner();
        let ids = ids(&r.object_ids)?;
        let before = (r.sealed_before_us > 0).then_some(r.sealed_before_us);
        let c = self.0.clone();
        let status = on_cluster_thread(
            &self.0,
            async move { c.drop_local_sealed_before(&ids, before) },
        )
        .await?;
        Ok(Response::new(pb::DropCopiesReply { status }))
    }

    async fn list_local(
        &self,
        _req: Request<pb::ListLocalRequest>,
    ) -> Result<Response<pb::ListLocalReply>, Status> {
        let c = self.0.clone();
        let objects = on_cluster_thread(&self.0, async move { c.list_local() }).await?;
        Ok(Response::new(pb::ListLocalReply { objects }))
    }
}
