//! State shared by all connections: the state machine, the arena, and each
//! client's queue of notices. Held under one mutex that is never held across
//! an `.await`.

use crate::arena::Arena;
use crate::shared_table::SharedTable;
use crate::spill::SpillDir;
use ferroplasma_protocol::ObjectId;
use ferroplasma_store::{ClientId, Effects, Notice, Store};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{mpsc, Notify};

mod handed;
mod memory;
mod spilling;
pub use handed::MAX_HELD;
pub use spilling::Restore;

/// The store's state.
#[derive(Debug)]
pub struct Shared {
    /// The object table.
    pub store: Store,
    /// The memory objects live in.
    pub arena: Arc<Arena>,
    /// The object table published in shared memory, if on.
    pub table: Option<Arc<SharedTable>>,
    /// Where objects go when memory is short, if configured.
    pub spill: Option<Arc<SpillDir>>,
    /// Spill segments being written on blocking threads now.
    pub spills_in_flight: usize,
    /// Spill writes finished since start (a change means room may have come).
    pub spills_finished: u64,
    /// Creates parked on all connections, waiting for space.
    pub waiting_creates: usize,
    /// Parked creates tried again since start (each when room may have
    /// come, or at its deadline).
    pub create_retries: u64,
    /// What the connections count for the metrics endpoint.
    pub instruments: Arc<crate::instruments::Instruments>,
    /// Spilled objects to bring back once the spills under way are done
    /// (there was no room for them before).
    restores_waiting: Vec<ObjectId>,
    /// Woken whenever the state changed in a way that may have made room
    /// (creates waiting for space retry then).
    pub space: Arc<Notify>,
    /// In a cluster: the store client the cluster agent reads events from
    /// (it is also told of aborted creates, to release their ids).
    pub cluster_client: Option<ClientId>,
    /// The cluster agent's queue: unbounded, because a directory update
    /// must never be dropped (the agent sends them as fast as the owners
    /// take them; each queued notice is a few dozen bytes).
    agent_outbox: Option<mpsc::UnboundedSender<Notice>>,
    /// Per id, the notices queued for the cluster agent that it has not
    /// sent to the directory yet: a new claim of the id waits for them, so
    /// that the late news of an old copy never cancels it.
    pub agent_pending: HashMap<ObjectId, u32, ferroplasma_protocol::IdHasher>,
    outboxes: HashMap<ClientId, mpsc::Sender<Notice>, ferroplasma_protocol::IdHasher>,
    /// Give the pages of large free ranges of the arena back to the kernel
    /// (not with `--prefault`, which asks for the arena to stay backed).
    pub give_back_memory: bool,
    /// `Store::freed_bytes` when pages were last given back.
    freed_given_back: u64,
    /// `Store::allocated_bytes` and `freed_bytes` at the last `tidy_memory`.
    last_look: (u64, u64),
    /// Looks in a row that found less than 16 MiB allocated or freed.
    quiet_looks: u32,
    /// How many such looks before pages are given back
    /// (`--give-back-after`, a look a second).
    pub quiet_looks_needed: u32,
    /// Writes without a round trip, when on (`crate::fast_writes`).
    pub fast: Option<crate::fast_writes::rings::FastWrites>,
    /// Ids handed to connections and not created yet (`handed`).
    pub(crate) handed: handed::Handed,
}

/// A handle on [`Shared`].
#[derive(Debug, Clone)]
pub struct SharedRef(
    Arc<Mutex<Shared>>,
    Arc<std::sync::Condvar>,
    Arc<crate::spin::Spin>,
);

impl SharedRef {
    /// Wraps a fresh state.
    pub fn new(
        mut store: Store,
        arena: Arena,
        spill: Option<SpillDir>,
        table: Option<Arc<SharedTable>>,
    ) -> Self {
        if let Some(f) = &table {
            store.set_readers(f.clone());
        }
        let state = Arc::new(Mutex::new(Shared {
            store,
            table,
            arena: Arc::new(arena),
            spill: spill.map(Arc::new),
            spills_in_flight: 0,
            spills_finished: 0,
            waiting_creates: 0,
            restores_waiting: Vec::new(),
            create_retries: 0,
            instruments: Arc::default(),
            space: Arc::new(Notify::new()),
            cluster_client: None,
            agent_outbox: None,
            agent_pending: HashMap::default(),
            outboxes: HashMap::default(),
            give_back_memory: true,
            freed_given_back: 0,
            last_look: (0, 0),
            quiet_looks: 0,
            quiet_looks_needed: memory::QUIET_LOOKS,
            fast: None,
            handed: Default::default(),
        }));
        Self(state, Arc::new(std::sync::Condvar::new()), Arc::default())
    }

    /// The store's spinner (`crate::spin`): connections poke it after each
    /// request, without the lock.
    pub fn spin(&self) -> &Arc<crate::spin::Spin> {
        &self.2
    }

    /// Locks the state. A panic while it was held (a bug) does not take the
    /// other connections down with it. With writes without a round trip on,
    /// what clients wrote into their rings is taken in first, and the
    /// section is marked in the shared epoch (`crate::fast_writes`).
    pub fn lock(&self) -> Locked<'_> {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.enter();
        Locked(Some(g))
    }

    /// Waits on the state's condition variable (the lock let go meanwhile).
    pub fn wait<'a>(&'a self, mut sh: Locked<'a>) -> Locked<'a> {
        let mut g = sh.0.take().expect("locked");
        g.leave();
        let mut g = self.1.wait(g).unwrap_or_else(|p| p.into_inner());
        g.enter();
        Locked(Some(g))
    }

    /// Wakes the callers of `with_room` and `wait_restored` (a spill
    /// segment was written, or an object read back).
    fn wake_blocked(&self) {
        self.1.notify_all();
    }
}

/// The locked state (see [`SharedRef::lock`]).
#[derive(Debug)]
pub struct Locked<'a>(Option<MutexGuard<'a, Shared>>);

impl std::ops::Deref for Locked<'_> {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        self.0.as_deref().expect("locked")
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Shared {
        self.0.as_deref_mut().expect("locked")
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        if let Some(g) = &mut self.0 {
            g.leave();
        }
    }
}

impl Shared {
    /// Registers a connection; returns its id and its queue of notices,
    /// which holds `queue` of them before the client counts as too slow.
    pub fn register(&mut self, queue: usize) -> (ClientId, mpsc::Receiver<Notice>) {
        let id = self.store.connect();
        let (tx, rx) = mpsc::channel(queue);
        self.outboxes.insert(id, tx);
        (id, rx)
    }

    /// Whether connection `client` is still registered.
    pub fn is_connected(&self, client: ClientId) -> bool {
        self.outboxes.contains_key(&client)
    }

    /// Registers the cluster agent: a subscriber of every seal and deletion
    /// (and told of aborted creates) whose notices are never dropped.
    pub fn register_agent(&mut self) -> (ClientId, mpsc::UnboundedReceiver<Notice>) {
        let id = self.store.connect();
        self.store.subscribe(id);
        let (tx, rx) = mpsc::unbounded_channel();
        self.agent_outbox = Some(tx);
        self.cluster_client = Some(id);
        (id, rx)
    }

    /// Forgets a connection and everything it held.
    pub fn disconnect(&mut self, client: ClientId) {
        self.outboxes.remove(&client);
        let fx = self.store.disconnect(client);
        self.forget_ring(client);
        self.forget_handed(client);
        if let Some(f) = &self.table {
            f.remove_client(client);
        }
        self.deliver(fx);
    }

    /// Queues each notice for its client (a client whose queue is full is cut
    /// off: its connection sees the queue closed and ends), removes spill
    /// segments no object lives in, and tells the cluster agent (if any) of
    /// aborted creates.
    pub fn deliver(&mut self, fx: Effects) {
        self.space.notify_waiters();
        if let Some(dir) = &self.spill {
            for seg in &fx.dead_segments {
                dir.remove(*seg);
            }
        }
        let aborted: Vec<(ClientId, Notice)> = match self.cluster_client {
            Some(agent) => fx
                .aborted
                .into_iter()
                .map(|id| (agent, Notice::Aborted(id)))
                .collect(),
            None => Vec::new(),
        };
        for (to, notice) in fx.notices.into_iter().chain(aborted) {
            if Some(to) == self.cluster_client {
                if let Some(tx) = &self.agent_outbox {
                    if let Notice::Event(ferroplasma_store::Event { id, .. })
                    | Notice::Aborted(id) = notice
                    {
                        *self.agent_pending.entry(id).or_insert(0) += 1;
                    }
                    let _ = tx.send(notice);
                }
                continue;
            }
            if let Some(tx) = self.outboxes.get(&to) {
                if tx.try_send(notice).is_err() {
                    tracing::warn!(client = to, "notice queue full; disconnecting the client");
                    self.outboxes.remove(&to);
                }
            }
        }
    }
}

/// Microseconds since the Unix epoch.
pub fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}
