//! For the crate's tests: [`TestStore`], a [`LocalStore`] over a real
//! `ferroplasma_store::Store` in plain memory (no spill directory), its
//! notices for the cluster delivered as the daemon delivers them; and
//! members started on it.

use crate::cluster::{Cluster, ClusterConfig};
use crate::local::{CopyOut, LocalStore, Memory, NewObject, Pinned, PinnedObject, Received};
use crate::sync::{lock, now_us};
use ferroplasma_protocol::{IdHasher, ObjectId};
use ferroplasma_store::{
    ClientId, DeleteOutcome, Effects, Location, Notice, ObjectInfo, Store, StoreError, Usage,
};
use std::cell::UnsafeCell;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::mpsc;

/// Plain memory.
pub struct TestMemory(Box<[UnsafeCell<u8>]>);

// Safety: the bytes are shared the way an arena's are: callers of
// `region_mut` promise that nothing else touches what they write, and
// `write` is only used on bytes nobody reads meanwhile.
unsafe impl Sync for TestMemory {}

impl std::fmt::Debug for TestMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TestMemory({} bytes)", self.0.len())
    }
}

impl TestMemory {
    /// `size` zeroed bytes.
    pub fn new(size: usize) -> Self {
        Self((0..size).map(|_| UnsafeCell::new(0)).collect())
    }

    /// Writes `bytes` at `offset` (nothing else touches them meanwhile).
    pub fn write(&self, offset: u64, bytes: &[u8]) {
        // Safety: as the caller promises.
        unsafe { self.region_mut(offset, bytes.len() as u64) }.copy_from_slice(bytes);
    }
}

impl Memory for TestMemory {
    fn bytes(&self, offset: u64, len: u64) -> &[u8] {
        let cells = &self.0[offset as usize..(offset + len) as usize];
        // Safety: `UnsafeCell<u8>` has the layout of `u8`; nothing writes
        // these bytes meanwhile (the trait's contract).
        unsafe { std::slice::from_raw_parts(cells.as_ptr().cast::<u8>(), cells.len()) }
    }

    unsafe fn region_mut(&self, offset: u64, len: u64) -> &mut [u8] {
        let cells = &self.0[offset as usize..(offset + len) as usize];
        // Safety: `UnsafeCell<u8>` has the layout of `u8` and allows
        // writes through a shared reference; the caller promises nothing
        // else touches these bytes.
        unsafe { std::slice::from_raw_parts_mut(UnsafeCell::raw_get(cells.as_ptr()), cells.len()) }
    }
}

/// The store's state, behind one lock.
#[derive(Debug)]
pub struct State {
    /// The object table.
    pub store: Store,
    /// Notices for the cluster not sent yet, per id.
    pending: HashMap<ObjectId, u32, IdHasher>,
    outbox: mpsc::UnboundedSender<Notice>,
    agent: ClientId,
}

impl State {
    /// Delivers what the store did: the cluster's notices (and aborted
    /// creates) to it; no other client is connected.
    pub fn deliver(&mut self, fx: Effects) {
        let aborted = fx
            .aborted
            .into_iter()
            .map(|id| (self.agent, Notice::Aborted(id)));
        for (to, notice) in fx.notices.into_iter().chain(aborted) {
            if to != self.agent {
                continue;
            }
            if let Notice::Event(ferroplasma_store::Event { id, .. }) | Notice::Aborted(id) = notice
            {
                *self.pending.entry(id).or_insert(0) += 1;
            }
            let _ = self.outbox.send(notice);
        }
    }
}

/// A store in plain memory, as the cluster's store client sees it.
#[derive(Debug)]
pub struct TestStore {
    state: Arc<Mutex<State>>,
    /// Its memory.
    pub memory: Arc<TestMemory>,
}

impl TestStore {
    /// A store of `size` bytes; the receiver of the cluster's notices.
    pub fn new(size: u64) -> (Arc<Self>, mpsc::UnboundedReceiver<Notice>) {
        let mut store = Store::new(size);
        let agent = store.connect();
        store.subscribe(agent);
        let (outbox, events) = mpsc::unbounded_channel();
        let state = State {
            store,
            pending: HashMap::default(),
            outbox,
            agent,
        };
        let memory = Arc::new(TestMemory::new(size as usize));
        let me = Arc::new(Self {
            state: Arc::new(Mutex::new(state)),
            memory,
        });
        (me, events)
    }

    /// Locks the state.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Creates `id` sealed with `bytes`, as a client's put would.
    pub fn put(&self, id: ObjectId, bytes: &[u8]) {
        let mut st = self.lock();
        let memory = self.memory.clone();
        let fx = st
            .store
            .create_sealed(id, bytes.len() as u64, 0, now_us(), |loc| {
                memory.write(loc.offset, bytes)
            })
            .expect("room");
        st.deliver(fx);
    }

    /// `id`'s data, if it is sealed here.
    pub fn data(&self, id: &ObjectId) -> Option<Vec<u8>> {
        let st = self.lock();
        let loc = st.store.sealed_location(id)?;
        Some(self.memory.bytes(loc.offset, loc.data_size).to_vec())
    }
}

impl LocalStore for TestStore {
    fn memory(&self) -> Arc<dyn Memory> {
        self.memory.clone()
    }

    fn usage(&self) -> Usage {
        self.lock().store.usage()
    }

    fn exists(&self, ids: &[ObjectId]) -> Vec<bool> {
        let st = self.lock();
        ids.iter().map(|id| st.store.exists(id)).collect()
    }

    fn contains(&self, ids: &[ObjectId]) -> Vec<bool> {
        let st = self.lock();
        ids.iter().map(|id| st.store.contains(id)).collect()
    }

    fn sealed_at(&self, ids: &[ObjectId]) -> Vec<Option<i64>> {
        let st = self.lock();
        ids.iter().map(|id| st.store.sealed_at_us(id)).collect()
    }

    fn list(&self, claims: Option<&mut HashSet<ObjectId, IdHasher>>) -> Vec<ObjectInfo> {
        let st = self.lock();
        if let Some(claims) = claims {
            claims.retain(|id| !st.store.exists(id));
        }
        st.store.list()
    }

    fn delete(&self, ids: &[ObjectId], sealed_before: Option<i64>) -> Vec<DeleteOutcome> {
        let mut st = self.lock();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let newer = sealed_before
                .zip(st.store.sealed_at_us(id))
                .is_some_and(|(b, sealed)| sealed >= b);
            if newer {
                out.push(DeleteOutcome::NotFound);
                continue;
            }
            let (outcome, fx) = st.store.delete(*id);
            st.deliver(fx);
            out.push(outcome);
        }
        out
    }

    fn give_up_claim(&self, id: ObjectId) {
        let mut st = self.lock();
        if !st.store.exists(&id) {
            st.deliver(Effects {
                aborted: vec![id],
                ..Default::default()
            });
        }
    }

    fn updates_pending(&self) -> usize {
        self.lock().pending.len()
    }

    fn is_update_pending(&self, id: &ObjectId) -> bool {
        self.lock().pending.contains_key(id)
    }

    fn updates_sent(&self, ids: &[ObjectId]) {
        let mut st = self.lock();
        for id in ids {
            if let Some(n) = st.pending.get_mut(id) {
                *n -= 1;
                if *n == 0 {
                    st.pending.remove(id);
                }
            }
        }
    }

    fn allocate(&self, objects: &[NewObject<'_>]) -> Vec<Result<Location, StoreError>> {
        let mut st = self.lock();
        let agent = st.agent;
        let mut out = Vec::with_capacity(objects.len());
        for o in objects {
            let meta = o.metadata.len() as u64;
            let created = if st.store.exists(&o.id) {
                Err(StoreError::ObjectExists(o.id))
            } else {
                st.store.create(agent, o.id, o.data_size, meta, now_us())
            };
            out.push(created.map(|(loc, fx)| {
                self.memory.write(loc.metadata_offset(), o.metadata);
                st.deliver(fx);
                loc
            }));
        }
        out
    }

    fn land(
        &self,
        received: &[Received<'_>],
        allocated: &[ObjectId],
        landed: &mut dyn FnMut(&[ObjectId]),
    ) -> (Vec<Result<(), StoreError>>, Vec<bool>) {
        let mut st = self.lock();
        let agent = st.agent;
        let now = now_us();
        let mut fx = Effects::default();
        let mut sealed_ids = Vec::new();
        let mut created = Vec::new();
        for r in received {
            let (data, meta) = (r.data.len() as u64, r.metadata.len() as u64);
            let made = st.store.create_sealed(r.id, data, meta, now, |loc| {
                self.memory.write(loc.metadata_offset(), r.metadata);
                self.memory.write(loc.offset, r.data);
            });
            created.push(made.map(|f| {
                fx.extend(f);
                sealed_ids.push(r.id);
            }));
        }
        let mut sealed = Vec::new();
        for &id in allocated {
            let ok = match st.store.seal(agent, id, now) {
                Ok(f) => {
                    fx.extend(f);
                    sealed_ids.push(id);
                    true
                }
                Err(_) => false,
            };
            sealed.push(ok);
            fx.extend(st.store.release(agent, id).unwrap_or_default());
        }
        landed(&sealed_ids);
        st.deliver(fx);
        (created, sealed)
    }

    fn abort(&self, ids: &[ObjectId]) {
        let mut st = self.lock();
        let agent = st.agent;
        for &id in ids {
            if let Ok(fx) = st.store.abort(agent, id) {
                st.deliver(fx);
            }
        }
    }

    fn pin(&self, ids: &[ObjectId], max_bytes: u64, copy: CopyOut) -> Pinned {
        let mut st = self.lock();
        let agent = st.agent;
        let (mut objects, mut held, mut copies, mut bytes) = (vec![], vec![], vec![], 0u64);
        for &id in ids {
            let small = st.store.sealed_location(&id).filter(|l| {
                let size = l.data_size + l.metadata_size;
                size <= copy.at_most && copies.len() as u64 + size <= copy.budget
            });
            let o = match small {
                Some(l) => {
                    let at = copies.len() as u64;
                    copies
                        .extend_from_slice(self.memory.bytes(l.metadata_offset(), l.metadata_size));
                    copies.extend_from_slice(self.memory.bytes(l.offset, l.data_size));
                    Some(PinnedObject {
                        copied: true,
                        offset: at + l.metadata_size,
                        data_size: l.data_size,
                        metadata_offset: at,
                        metadata_size: l.metadata_size,
                    })
                }
                None => st.store.get(agent, id).map(|l| {
                    held.push(id);
                    PinnedObject {
                        copied: false,
                        offset: l.offset,
                        data_size: l.data_size,
                        metadata_offset: l.metadata_offset(),
                        metadata_size: l.metadata_size,
                    }
                }),
            };
            bytes += o.map_or(0, |o| o.data_size);
            objects.push(o);
            if bytes >= max_bytes {
                break;
            }
        }
        drop(st);
        let state = self.state.clone();
        Pinned {
            memory: self.memory.clone(),
            objects,
            copies,
            unpin: (!held.is_empty()).then(|| {
                Box::new(move || {
                    let mut st = lock(&state);
                    for id in held {
                        let fx = st.store.release(agent, id).unwrap_or_default();
                        st.deliver(fx);
                    }
                }) as Box<dyn FnOnce() + Send + Sync>
            }),
        }
    }

    fn is_spilled(&self, _ids: &[ObjectId]) -> bool {
        false
    }
}

/// A current-thread runtime for the crate's tests.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a test runtime")
}

/// A member on its own store (4 MiB), listening on loopback, started on
/// `rt`; and its store.
pub fn member_with_store(
    rt: &tokio::runtime::Runtime,
    peers: Vec<String>,
    heartbeat: Duration,
    peer_timeout: Duration,
) -> (Arc<Cluster>, Arc<TestStore>) {
    let (store, events) = TestStore::new(4 << 20);
    let cfg = ClusterConfig {
        listen: "127.0.0.1:0".parse().expect("an address"),
        advertise: "127.0.0.1:0".into(),
        data_listen: "127.0.0.1:0".parse().expect("an address"),
        peers,
        token: "unit-test".into(),
        heartbeat,
        peer_timeout,
        grpc_connections: 64,
        bulk_connections: 64,
    };
    let c = rt
        .block_on(Cluster::start(cfg, store.clone(), events))
        .expect("cluster");
    (c, store)
}

/// [`member_with_store`], the member alone.
pub fn member(
    rt: &tokio::runtime::Runtime,
    peers: Vec<String>,
    heartbeat: Duration,
    peer_timeout: Duration,
) -> Arc<Cluster> {
    member_with_store(rt, peers, heartbeat, peer_timeout).0
}
