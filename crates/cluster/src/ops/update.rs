//! Directory updates: news of a member's copies sent to each id's owner and
//! backup (calling side), applied to this member's directory (answering
//! side).

use crate::cluster::Cluster;
use crate::pb;
use crate::sync::lock;
use crate::wire::change_of;
use ferroplasma_protocol::{unpack_ids, ObjectId};
use std::time::Duration;

impl Cluster {
    /// Applies `ops` about `node`'s copies at `target`; returns the refused
    /// ids. `node` is this member, except when correcting the directory
    /// about a holder that turned out not to have its copy.
    pub(crate) async fn update_at(
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
    pub(crate) fn apply_update(
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
}
