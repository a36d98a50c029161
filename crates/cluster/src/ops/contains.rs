//! Cluster-wide contains: sealed here, or sealed on a live member as the
//! id's owner says.

use crate::cluster::Cluster;
use crate::pb;
use crate::sync::lock;
use crate::wire::MAX_IDS;
use ferroplasma_protocol::pb as wire;
use ferroplasma_protocol::ObjectId;
use std::collections::BTreeMap;
use std::time::Duration;

impl Cluster {
    /// Whether each id is sealed on some live member.
    pub async fn contains(&self, ids: Vec<ObjectId>) -> Result<Vec<bool>, wire::Error> {
        let mut out = Vec::with_capacity(ids.len());
        for piece in ids.chunks(MAX_IDS) {
            out.extend(self.contains_piece(piece).await?);
        }
        Ok(out)
    }

    /// [`Cluster::contains`] of at most `MAX_IDS` ids (what one peer request
    /// may carry).
    async fn contains_piece(&self, ids: &[ObjectId]) -> Result<Vec<bool>, wire::Error> {
        let mut present = vec![false; ids.len()];
        let mut by_owner: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        let here = self.store.contains(ids);
        for (i, (id, here)) in ids.iter().zip(here).enumerate() {
            if here {
                present[i] = true;
            } else {
                by_owner
                    .entry(self.targets(id).remove(0))
                    .or_default()
                    .push(i);
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
}
