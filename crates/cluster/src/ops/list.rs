//! Cluster-wide list: every live member's objects (calling side), this
//! member's own (answering side).

use crate::cluster::Cluster;
use crate::pb;
use crate::sync::lock;
use crate::wire::listed;
use ferroplasma_protocol::pb as wire;
use std::time::Duration;

/// How much longer than the peer timeout a member may take to list its
/// objects before a cluster-wide list goes on without them (and says so).
const LIST_EXTRA: Duration = Duration::from_secs(10);

impl Cluster {
    /// This member's objects, as the wire lists them.
    pub(crate) fn list_local(&self) -> Vec<pb::ListedObject> {
        let list = self.store.list(None);
        let cached = lock(&self.cached);
        list.iter()
            .map(|o| listed(o, cached.contains(&o.id)))
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
                    // A listing is bulk work on a member that may be busy:
                    // it gets longer than a heartbeat before it is given up.
                    c.list_local(self.peers.request(pb::ListLocalRequest {}, LIST_EXTRA))
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
