//! What this member serves to others' pulls: its sealed objects, pinned
//! (referenced by the cluster's store client) a frame at a time while they
//! are sent, so they are neither evicted nor freed under the send. Small
//! objects are copied out under the store's lock instead: a copy of a few
//! kB costs less than a reference taken and given back (two updates of the
//! eviction order, of the client's references and of the shared table).

use crate::cluster::Cluster;
use crate::local::{CopyOut, Pinned};
use crate::sync::lock;
use crate::transfer::transport::Source;
use crate::wire::entry_pb;
use ferroplasma_protocol::ObjectId;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Objects (data and metadata) at most this large are copied out.
const COPY_AT_MOST: u64 = 64 << 10;

/// Most bytes one frame copies out while holding the store's lock (which
/// bounds how long it is held: about 0.1 ms).
const COPY_BUDGET: u64 = 1 << 20;

/// Serves this store's sealed objects to other members' pulls.
#[derive(Debug)]
pub struct StoreSource(pub Arc<Cluster>);

impl Source for StoreSource {
    fn pin(&self, ids: &[ObjectId], max_bytes: u64) -> Pinned {
        let copy = CopyOut {
            at_most: COPY_AT_MOST,
            budget: COPY_BUDGET,
        };
        self.0.store.pin(ids, max_bytes, copy)
    }

    fn is_spilled(&self, ids: &[ObjectId]) -> bool {
        self.0.store.is_spilled(ids)
    }

    fn entries(&self, ids: &[ObjectId]) -> Vec<Vec<u8>> {
        let d = lock(&self.0.directory);
        ids.iter()
            .map(|id| prost::Message::encode_to_vec(&entry_pb(d.lookup(id))))
            .collect()
    }

    fn served(&self, objects: u64, bytes: u64) {
        let c = &self.0.counters;
        c.served.fetch_add(objects, Ordering::Relaxed);
        c.served_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}
