//! What this member serves to others' pulls: its sealed objects, pinned
//! (referenced by the cluster's store client) a frame at a time while they
//! are sent, so they are neither evicted nor freed under the send. Small
//! objects are copied out under the store's lock instead: a copy of a few
//! kB costs less than a reference taken and given back (two updates of the
//! eviction order, of the client's references and of the shared table).

use super::transport::{Pinned, PinnedObject, Source};
use super::Cluster;
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
        let c = &self.0;
        let mut sh = c.shared.lock();
        let mut objects = Vec::with_capacity(ids.len());
        let mut held = Vec::new();
        let mut copies = Vec::new();
        let mut bytes = 0u64;
        for &id in ids {
            let small = sh.store.sealed_location(&id).filter(|l| {
                let size = l.data_size + l.metadata_size;
                size <= COPY_AT_MOST && copies.len() as u64 + size <= COPY_BUDGET
            });
            if let Some(l) = small {
                // Sealed bytes, read under the lock: nothing frees or moves
                // them meanwhile.
                let at = copies.len() as u64;
                copies.extend_from_slice(sh.arena.bytes(l.metadata_offset(), l.metadata_size));
                copies.extend_from_slice(sh.arena.bytes(l.offset, l.data_size));
                objects.push(Some(PinnedObject {
                    copied: true,
                    offset: at + l.metadata_size,
                    data_size: l.data_size,
                    metadata_offset: at,
                    metadata_size: l.metadata_size,
                }));
                bytes += l.data_size;
                if bytes >= max_bytes {
                    break;
                }
                continue;
            }
            sh = c.shared.wait_restored(sh, id);
            let (guard, restored) = c.shared.with_room(sh, |sh| sh.unspill(id));
            sh = guard;
            let loc = restored.ok().and_then(|()| sh.store.get(c.agent, id));
            objects.push(loc.map(|l| {
                held.push(id);
                bytes += l.data_size;
                PinnedObject {
                    copied: false,
                    offset: l.offset,
                    data_size: l.data_size,
                    metadata_offset: l.metadata_offset(),
                    metadata_size: l.metadata_size,
                }
            }));
            if bytes >= max_bytes {
                break;
            }
        }
        let arena = sh.arena.clone();
        drop(sh);
        let (shared, agent) = (c.shared.clone(), c.agent);
        Pinned {
            arena,
            objects,
            copies,
            unpin: (!held.is_empty()).then(|| {
                Box::new(move || {
                    let mut sh = shared.lock();
                    let mut fx = ferroplasma_store::Effects::default();
                    for id in held {
                        fx.extend(sh.store.release(agent, id).unwrap_or_default());
                    }
                    sh.deliver(fx);
                }) as Box<dyn FnOnce() + Send + Sync>
            }),
        }
    }

    fn is_spilled(&self, ids: &[ObjectId]) -> bool {
        let sh = self.0.shared.lock();
        ids.iter()
            .any(|id| sh.store.is_spilled(id) || sh.store.is_restoring(id))
    }

    fn entries(&self, ids: &[ObjectId]) -> Vec<Vec<u8>> {
        let d = super::lock(&self.0.directory);
        ids.iter()
            .map(|id| prost::Message::encode_to_vec(&super::ops::entry_pb(d.lookup(id))))
            .collect()
    }

    fn served(&self, objects: u64, bytes: u64) {
        let c = &self.0.counters;
        c.served.fetch_add(objects, Ordering::Relaxed);
        c.served_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}
