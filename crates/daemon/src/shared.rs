//! State shared by all connections: the state machine, the arena, and each
//! client's queue of notices. Held under one mutex that is never held across
//! an `.await`.

use crate::arena::Arena;
use ferroplasma_store::{ClientId, Effects, Notice, Store};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::mpsc;

/// Notices a client may have queued before it is cut off as too slow.
pub const NOTICE_QUEUE: usize = 1 << 16;

/// The store's state.
#[derive(Debug)]
pub struct Shared {
    /// The object table.
    pub store: Store,
    /// The memory objects live in.
    pub arena: Arc<Arena>,
    outboxes: HashMap<ClientId, mpsc::Sender<Notice>>,
}

/// A handle on [`Shared`].
#[derive(Debug, Clone)]
pub struct SharedRef(Arc<Mutex<Shared>>);

impl SharedRef {
    /// Wraps a fresh state.
    pub fn new(store: Store, arena: Arena) -> Self {
        Self(Arc::new(Mutex::new(Shared {
            store,
            arena: Arc::new(arena),
            outboxes: HashMap::new(),
        })))
    }

    /// Locks the state. A panic while it was held (a bug) does not take the
    /// other connections down with it.
    pub fn lock(&self) -> MutexGuard<'_, Shared> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
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

    /// Forgets a connection and everything it held.
    pub fn disconnect(&mut self, client: ClientId) {
        self.outboxes.remove(&client);
        let fx = self.store.disconnect(client);
        self.deliver(fx);
    }

    /// Queues each notice for its client. A client whose queue is full is cut
    /// off (its connection sees the queue closed and ends).
    pub fn deliver(&mut self, fx: Effects) {
        for (to, notice) in fx.notices {
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
