//! The daemon's store as the cluster sees it: [`ClusterStore`] implements
//! [`LocalStore`] over the shared state, as the cluster's own store client
//! (subscribed to every seal and deletion, told of aborted creates). Each
//! method takes the state's lock once and delivers the effects of what it
//! changed before it lets go.

use crate::arena::Arena;
use crate::shared::{now_us, Shared, SharedRef};
use ferroplasma_cluster::local::{CopyOut, NewObject, Pinned, PinnedObject, Received};
use ferroplasma_cluster::{LocalStore, Memory};
use ferroplasma_protocol::{IdHasher, ObjectId};
use ferroplasma_store::{
    ClientId, DeleteOutcome, Effects, Location, Notice, ObjectInfo, StoreError, Usage,
};
use std::collections::HashSet;
use std::sync::Arc;
use tokio::sync::mpsc;

impl Memory for Arena {
    fn bytes(&self, offset: u64, len: u64) -> &[u8] {
        Arena::bytes(self, offset, len)
    }

    unsafe fn region_mut(&self, offset: u64, len: u64) -> &mut [u8] {
        // Safety: the caller's promise is `Arena::region_mut`'s.
        unsafe { Arena::region_mut(self, offset, len) }
    }
}

/// The shared state, as the cluster's store client.
#[derive(Debug)]
pub struct ClusterStore {
    shared: SharedRef,
    /// The store client the cluster acts as.
    agent: ClientId,
}

impl ClusterStore {
    /// Registers the cluster's store client; returns it and the notices it
    /// hears (seals, deletions, aborted creates).
    pub fn register(shared: SharedRef) -> (Self, mpsc::UnboundedReceiver<Notice>) {
        let (agent, events) = shared.lock().register_agent();
        (Self { shared, agent }, events)
    }
}

/// Creates through `f` in `sh`, making room first: spills what is needed,
/// and waits for spills under way while there is no room.
fn with_room<'a, T>(
    shared: &'a SharedRef,
    sh: crate::shared::Locked<'a>,
    data_size: u64,
    metadata_size: u64,
    mut f: impl FnMut(&mut Shared) -> Result<T, StoreError>,
) -> (crate::shared::Locked<'a>, Result<T, StoreError>) {
    shared.with_room(sh, |sh| {
        sh.spill_for(data_size, metadata_size).and_then(|()| f(sh))
    })
}

impl LocalStore for ClusterStore {
    fn memory(&self) -> Arc<dyn Memory> {
        self.shared.lock().arena.clone()
    }

    fn usage(&self) -> Usage {
        self.shared.lock().store.usage()
    }

    fn exists(&self, ids: &[ObjectId]) -> Vec<bool> {
        let sh = self.shared.lock();
        ids.iter().map(|id| sh.store.exists(id)).collect()
    }

    fn contains(&self, ids: &[ObjectId]) -> Vec<bool> {
        let sh = self.shared.lock();
        ids.iter().map(|id| sh.store.contains(id)).collect()
    }

    fn sealed_at(&self, ids: &[ObjectId]) -> Vec<Option<i64>> {
        let sh = self.shared.lock();
        ids.iter().map(|id| sh.store.sealed_at_us(id)).collect()
    }

    fn list(&self, claims: Option<&mut HashSet<ObjectId, IdHasher>>) -> Vec<ObjectInfo> {
        let sh = self.shared.lock();
        if let Some(claims) = claims {
            claims.retain(|id| !sh.store.exists(id));
        }
        sh.store.list()
    }

    fn delete(&self, ids: &[ObjectId], sealed_before: Option<i64>) -> Vec<DeleteOutcome> {
        let mut sh = self.shared.lock();
        let mut effects = Effects::default();
        let out = ids
            .iter()
            .map(|id| {
                let newer = sealed_before
                    .zip(sh.store.sealed_at_us(id))
                    .is_some_and(|(b, sealed)| sealed >= b);
                if newer {
                    return DeleteOutcome::NotFound;
                }
                let (outcome, fx) = sh.store.delete(*id);
                effects.extend(fx);
                outcome
            })
            .collect();
        sh.deliver(effects);
        out
    }

    fn give_up_claim(&self, id: ObjectId) {
        let mut sh = self.shared.lock();
        if !sh.store.exists(&id) {
            sh.deliver(Effects {
                aborted: vec![id],
                ..Default::default()
            });
        }
    }

    fn updates_pending(&self) -> usize {
        self.shared.lock().agent_pending.len()
    }

    fn is_update_pending(&self, id: &ObjectId) -> bool {
        self.shared.lock().agent_pending.contains_key(id)
    }

    fn updates_sent(&self, ids: &[ObjectId]) {
        let mut sh = self.shared.lock();
        for id in ids {
            if let Some(n) = sh.agent_pending.get_mut(id) {
                *n -= 1;
                if *n == 0 {
                    sh.agent_pending.remove(id);
                }
            }
        }
    }

    fn allocate(&self, objects: &[NewObject<'_>]) -> Vec<Result<Location, StoreError>> {
        let mut sh = self.shared.lock();
        let mut effects = Effects::default();
        let mut out = Vec::with_capacity(objects.len());
        let now = now_us();
        for o in objects {
            let meta = o.metadata.len() as u64;
            let (guard, created) = self.shared.with_room(sh, |sh| {
                if sh.store.exists(&o.id) {
                    Err(StoreError::ObjectExists(o.id))
                } else {
                    sh.spill_for(o.data_size, meta)
                        .and_then(|()| sh.store.create(self.agent, o.id, o.data_size, meta, now))
                }
            });
            sh = guard;
            out.push(created.map(|(loc, fx)| {
                sh.arena.write(loc.metadata_offset(), o.metadata);
                effects.extend(fx);
                loc
            }));
        }
        sh.deliver(effects);
        out
    }

    fn land(
        &self,
        received: &[Received<'_>],
        allocated: &[ObjectId],
        landed: &mut dyn FnMut(&[ObjectId]),
    ) -> (Vec<Result<(), StoreError>>, Vec<bool>) {
        let mut sh = self.shared.lock();
        if let Some(table) = sh.table.clone() {
            let ids: Vec<ObjectId> = (allocated.iter().copied())
                .chain(received.iter().map(|r| r.id))
                .collect();
            table.prefetch(&ids);
        }
        let now = now_us();
        let mut fx = Effects::default();
        let mut sealed_ids = Vec::with_capacity(received.len() + allocated.len());
        let mut created = Vec::with_capacity(received.len());
        for r in received {
            let arena = sh.arena.clone();
            let (data, meta) = (r.data.len() as u64, r.metadata.len() as u64);
            let (guard, made) = with_room(&self.shared, sh, data, meta, |sh| {
                sh.store.create_sealed(r.id, data, meta, now, |loc| {
                    arena.write(loc.metadata_offset(), r.metadata);
                    arena.write(loc.offset, r.data);
                })
            });
            sh = guard;
            created.push(made.map(|f| {
                fx.extend(f);
                sealed_ids.push(r.id);
            }));
        }
        let mut sealed = Vec::with_capacity(allocated.len());
        for &id in allocated {
            let ok = match sh.store.seal(self.agent, id, now) {
                Ok(f) => {
                    fx.extend(f);
                    sealed_ids.push(id);
                    true
                }
                Err(_) => false,
            };
            sealed.push(ok);
            fx.extend(sh.store.release(self.agent, id).unwrap_or_default());
        }
        // Before the seals reach the cluster's agent.
        landed(&sealed_ids);
        // One delivery for the frame: the notices go out together.
        sh.deliver(fx);
        (created, sealed)
    }

    fn abort(&self, ids: &[ObjectId]) {
        if ids.is_empty() {
            return;
        }
        let mut sh = self.shared.lock();
        let mut effects = Effects::default();
        for &id in ids {
            if let Ok(fx) = sh.store.abort(self.agent, id) {
                effects.extend(fx);
            }
        }
        sh.deliver(effects);
    }

    fn pin(&self, ids: &[ObjectId], max_bytes: u64, copy: CopyOut) -> Pinned {
        let mut sh = self.shared.lock();
        let mut objects = Vec::with_capacity(ids.len());
        let mut held = Vec::new();
        let mut copies = Vec::new();
        let mut bytes = 0u64;
        for &id in ids {
            let small = sh.store.sealed_location(&id).filter(|l| {
                let size = l.data_size + l.metadata_size;
                size <= copy.at_most && copies.len() as u64 + size <= copy.budget
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
            sh = self.shared.wait_restored(sh, id);
            let (guard, restored) = self.shared.with_room(sh, |sh| sh.unspill(id));
            sh = guard;
            let loc = restored.ok().and_then(|()| sh.store.get(self.agent, id));
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
        let memory: Arc<dyn Memory> = sh.arena.clone();
        drop(sh);
        let (shared, agent) = (self.shared.clone(), self.agent);
        Pinned {
            memory,
            objects,
            copies,
            unpin: (!held.is_empty()).then(|| {
                Box::new(move || {
                    let mut sh = shared.lock();
                    let mut fx = Effects::default();
                    for id in held {
                        fx.extend(sh.store.release(agent, id).unwrap_or_default());
                    }
                    sh.deliver(fx);
                }) as Box<dyn FnOnce() + Send + Sync>
            }),
        }
    }

    fn is_spilled(&self, ids: &[ObjectId]) -> bool {
        let sh = self.shared.lock();
        ids.iter()
            .any(|id| sh.store.is_spilled(id) || sh.store.is_restoring(id))
    }
}
