//! State shared by all connections: the state machine, the arena, and each
//! client's queue of notices. Held under one mutex that is never held across
//! an `.await`.

use crate::arena::Arena;
use crate::fast_table::FastTable;
use crate::spill::SpillDir;
use ferroplasma_protocol::ObjectId;
use ferroplasma_store::{ClientId, Effects, Notice, Store, StoreError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{mpsc, Notify};

/// Notices a client may have queued before it is cut off as too slow: room
/// for a seal notice for each object its gets may wait for (one per
/// object), and for 65,536 subscription events.
pub const NOTICE_QUEUE: usize = crate::connection::MAX_WAITING_IDS + (1 << 16);

/// The store's state.
#[derive(Debug)]
pub struct Shared {
    /// The object table.
    pub store: Store,
    /// The memory objects live in.
    pub arena: Arc<Arena>,
    /// The object table published in shared memory, if on.
    pub fast: Option<Arc<FastTable>>,
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
    pub instruments: Arc<crate::metrics::Instruments>,
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
}

/// What [`Shared::request_restore`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restore {
    /// The object is not spilled (in memory, or absent): get it now.
    NotSpilled,
    /// It is on its way back: wait for it (watch it).
    Underway,
}

/// A handle on [`Shared`].
#[derive(Debug, Clone)]
pub struct SharedRef(Arc<Mutex<Shared>>, Arc<std::sync::Condvar>);

impl SharedRef {
    /// Wraps a fresh state.
    pub fn new(
        mut store: Store,
        arena: Arena,
        spill: Option<SpillDir>,
        fast: Option<Arc<FastTable>>,
    ) -> Self {
        if let Some(f) = &fast {
            store.set_readers(f.clone());
        }
        let state = Arc::new(Mutex::new(Shared {
            store,
            fast,
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
        }));
        Self(state, Arc::new(std::sync::Condvar::new()))
    }

    /// Runs `f` on the locked state; while it fails for lack of room and
    /// spill segments are being written (they will free memory), waits for
    /// them and tries again. For the callers that cannot park: restores of
    /// spilled objects and copies pulled from other members.
    pub fn with_room<'a, T>(
        &'a self,
        mut sh: MutexGuard<'a, Shared>,
        mut f: impl FnMut(&mut Shared) -> Result<T, StoreError>,
    ) -> (MutexGuard<'a, Shared>, Result<T, StoreError>) {
        loop {
            match f(&mut sh) {
                Err(StoreError::StoreFull { .. } | StoreError::SpillFull { .. })
                    if sh.spills_in_flight > 0 =>
                {
                    sh = self.1.wait(sh).unwrap_or_else(|p| p.into_inner());
                }
                r => return (sh, r),
            }
        }
    }

    /// Waits (blocking the thread) while `id` is being brought back from
    /// the spill directory by [`Shared::request_restore`].
    pub fn wait_restored<'a>(
        &'a self,
        mut sh: MutexGuard<'a, Shared>,
        id: ObjectId,
    ) -> MutexGuard<'a, Shared> {
        while sh.store.is_restoring(&id) {
            sh = self.1.wait(sh).unwrap_or_else(|p| p.into_inner());
        }
        sh
    }

    /// Locks the state. A panic while it was held (a bug) does not take the
    /// other connections down with it.
    pub fn lock(&self) -> MutexGuard<'_, Shared> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes the callers of `with_room` and `wait_restored` (a spill
    /// segment was written, or an object read back).
    fn wake_blocked(&self) {
        self.1.notify_all();
    }
}

impl Shared {
    /// Registers a connection; returns its id and notice queue.
    pub fn register(&mut self) -> (ClientId, mpsc::Receiver<Notice>) {
        let id = self.store.connect();
        let (tx, rx) = mpsc::channel(NOTICE_QUEUE);
        self.outboxes.insert(id, tx);
        (id, rx)
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
        if let Some(f) = &self.fast {
            f.remove_client(client);
        }
        self.deliver(fx);
    }

    /// With a spill directory: writes out the least recently used objects
    /// needed to make an allocation of this size fit (one segment file for
    /// the batch), here and now. Without one, or when it fits, does nothing.
    /// (Creates use [`Shared::start_spill`], which does not block.)
    pub fn spill_for(&mut self, data_size: u64, metadata_size: u64) -> Result<(), StoreError> {
        let Some(dir) = self.spill.clone() else {
            return Ok(());
        };
        self.spill_refusal(&dir, data_size, metadata_size)?;
        self.store.refresh_recency();
        let plan = self.store.spill_plan(data_size, metadata_size);
        if plan.is_empty() {
            return Ok(());
        }
        let segment = self.store.begin_spill(&plan)?;
        let generation = dir.generation();
        let written = dir.write_segment(segment, &self.arena, &plan);
        self.end_spill(segment, &plan, written, generation)
    }

    /// With a spill directory, when an allocation of this size does not
    /// fit: starts writing out the objects that make it fit, on a blocking
    /// thread, and returns true; the memory is freed (and waiting creates
    /// are woken) when the write is done. Meanwhile the victims stay
    /// readable and the store serves everyone else.
    pub fn start_spill(
        &mut self,
        me: &SharedRef,
        data_size: u64,
        metadata_size: u64,
    ) -> Result<bool, StoreError> {
        let Some(dir) = self.spill.clone() else {
            return Ok(false);
        };
        self.spill_refusal(&dir, data_size, metadata_size)?;
        self.store.refresh_recency();
        let plan = self.store.spill_plan(data_size, metadata_size);
        if plan.is_empty() {
            return Ok(false);
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.spill_for(data_size, metadata_size)?;
            return Ok(false);
        };
        let segment = self.store.begin_spill(&plan)?;
        self.spills_in_flight += 1;
        let (me, arena) = (me.clone(), self.arena.clone());
        // Taken here, under the lock: a removal noticed from now on makes
        // the spill count as failed.
        let generation = dir.generation();
        rt.spawn_blocking(move || {
            let written = dir.write_segment(segment, &arena, &plan);
            let mut sh = me.lock();
            sh.spills_in_flight -= 1;
            sh.spills_finished += 1;
            let _ = sh.end_spill(segment, &plan, written, generation);
            sh.retry_restores(&me);
            // Waiting creates look again even if the write failed.
            sh.space.notify_waiters();
            drop(sh);
            me.wake_blocked();
        });
        Ok(true)
    }

    /// Refuses a spill at once while the spill directory is failing (a
    /// write failed less than a second ago): creates that need room get a
    /// clear error instead of trying again and again.
    fn spill_refusal(&mut self, dir: &SpillDir, data: u64, meta: u64) -> Result<(), StoreError> {
        self.check_spill_dir();
        match dir.refusal() {
            None => Ok(()),
            Some(reason) => Err(StoreError::SpillFailed {
                requested: data.saturating_add(meta),
                reason,
            }),
        }
    }

    /// Whether the spill directory was removed under the store: if so, the
    /// objects spilled into it are dropped and reported lost (once, in the
    /// log), so that none reads as present but unreadable, and spilling
    /// goes on in a new directory. Cheap (one `fstat`): called before every
    /// spill, after a failed read, and once a second by the server.
    pub fn check_spill_dir(&mut self) {
        let Some(dir) = self.spill.clone() else {
            return;
        };
        if !dir.vanished() {
            return;
        }
        let (objects, bytes, fx) = self.store.forget_all_spilled();
        if objects > 0 {
            tracing::error!(
                objects,
                bytes,
                "the spill directory was removed under the store: the objects spilled into it \
                 are lost (they read as absent)"
            );
        }
        self.deliver(fx);
    }

    /// Completes a spill whose segment was written (or not), begun when the
    /// spill directory was at `generation`: one removed meanwhile took the
    /// segment with it, so the spill counts as failed and its objects stay
    /// in memory.
    fn end_spill(
        &mut self,
        segment: u64,
        plan: &[ferroplasma_store::SpillVictim],
        written: std::io::Result<Vec<u64>>,
        generation: u64,
    ) -> Result<(), StoreError> {
        let bytes: u64 = plan.iter().map(|v| v.len).sum();
        self.check_spill_dir();
        let moved = self
            .spill
            .as_ref()
            .is_some_and(|d| d.generation() != generation);
        let written = match written {
            Ok(_) if moved => Err(std::io::Error::other(
                "the spill directory was removed while the segment was written",
            )),
            w => w,
        };
        match written {
            Ok(offsets) => {
                let fx = self.store.finish_spill(segment, plan, &offsets);
                tracing::debug!(segment, objects = plan.len(), bytes, "spilled");
                self.deliver(fx);
                Ok(())
            }
            Err(e) => {
                // The spill directory logs the failure (once).
                tracing::debug!(error = %e, bytes, "spilling failed; the create is refused");
                let fx = self.store.abort_spill(plan);
                self.deliver(fx);
                Err(StoreError::SpillFailed {
                    requested: bytes,
                    reason: e.to_string(),
                })
            }
        }
    }

    /// Brings `id` back into memory now if it is spilled (spilling others
    /// to make room, here and now). A spilled object whose file cannot be
    /// read is dropped and logged: it then reads as absent, never as wrong
    /// bytes. For callers that cannot wait for [`Shared::request_restore`]:
    /// those off the runtime thread (cluster serving) and tests.
    pub fn unspill(&mut self, id: ObjectId) -> Result<(), StoreError> {
        let Some((data, meta)) = self.store.spilled_sizes(&id) else {
            return Ok(());
        };
        self.spill_for(data, meta)?;
        let dir = self
            .spill
            .clone()
            .expect("spilled objects imply a spill dir");
        let arena = self.arena.clone();
        let (loc, at, mut fx) = self.store.begin_restore(id)?;
        // Only after the read may the segment file go (fx may name it).
        let dead = std::mem::take(&mut fx.dead_segments);
        self.deliver(fx);
        let read = dir.read_into(at, &arena, loc.offset);
        self.end_restore(id, read, dead);
        Ok(())
    }

    /// Starts bringing `id` back into memory if it is spilled, without
    /// blocking: its bytes are read on a blocking thread, and when no room
    /// can be had now but spills under way will make some, it waits for
    /// them. Meanwhile gets of it wait (watch it): when it is back, each
    /// watcher is handed a reference ([`Notice::Restored`]); when it cannot
    /// come back, they are told with a [`Notice::Sealed`], and asking again
    /// gives the error.
    ///
    /// `Err` when it cannot come back at all (memory full of objects in use,
    /// or the spill directory full). Outside a runtime (tests), restores
    /// here and now.
    ///
    /// [`Notice::Restored`]: ferroplasma_store::Notice::Restored
    /// [`Notice::Sealed`]: ferroplasma_store::Notice::Sealed
    pub fn request_restore(&mut self, me: &SharedRef, id: ObjectId) -> Result<Restore, StoreError> {
        if self.store.is_restoring(&id) || self.restores_waiting.contains(&id) {
            return Ok(Restore::Underway);
        }
        let Some((data, meta)) = self.store.spilled_sizes(&id) else {
            return Ok(Restore::NotSpilled);
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.unspill(id)?;
            return Ok(Restore::NotSpilled);
        };
        match self.store.begin_restore(id) {
            Ok((loc, at, mut fx)) => {
                let dead = std::mem::take(&mut fx.dead_segments);
                self.deliver(fx);
                let dir = self
                    .spill
                    .clone()
                    .expect("spilled objects imply a spill dir");
                let (me, arena) = (me.clone(), self.arena.clone());
                rt.spawn_blocking(move || {
                    let read = dir.read_into(at, &arena, loc.offset);
                    me.lock().end_restore(id, read, dead);
                    me.wake_blocked();
                });
                Ok(Restore::Underway)
            }
            Err(StoreError::StoreFull { .. }) if self.start_spill(me, data, meta)? => {
                self.restores_waiting.push(id);
                Ok(Restore::Underway)
            }
            Err(StoreError::StoreFull { .. }) if self.spills_in_flight > 0 => {
                self.restores_waiting.push(id);
                Ok(Restore::Underway)
            }
            Err(e) => Err(e),
        }
    }

    /// A spill was written: the restores that waited for room try again;
    /// the waiters of one that still cannot come back are told, and so are
    /// those of one no longer spilled (deleted while it waited): a get that
    /// does not wait then answers without it instead of waiting for a
    /// restore that will never come.
    fn retry_restores(&mut self, me: &SharedRef) {
        for id in std::mem::take(&mut self.restores_waiting) {
            match self.request_restore(me, id) {
                Ok(Restore::Underway) => continue,
                Ok(Restore::NotSpilled) => {}
                Err(e) => {
                    tracing::debug!(%id, error = %e, "a spilled object cannot come back yet");
                }
            }
            // Its gets hear that it is not coming (yet): those that do not
            // wait answer without it.
            let fx = self.store.wake_waiters(id);
            self.deliver(fx);
        }
    }

    /// Completes a restore whose bytes were read (or not).
    fn end_restore(&mut self, id: ObjectId, read: std::io::Result<()>, dead_segments: Vec<u64>) {
        if let Err(e) = &read {
            self.check_spill_dir();
            tracing::warn!(%id, error = %e, "a spilled object could not be read back; dropped");
        }
        let mut fx = self.store.finish_restore(id, read.is_ok());
        fx.dead_segments.extend(dead_segments);
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
