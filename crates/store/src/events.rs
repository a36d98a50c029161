//! What the state machine asks the daemon to tell clients.

use crate::object::ClientId;
pub use ferroplasma_protocol::{Event, EventKind, ObjectId};

/// A message for one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// An object the client watched is sealed: retry its pending gets.
    Sealed(ObjectId),
    /// An object the client watched was brought back from the spill
    /// directory, and the client was handed one reference to it (which it
    /// must release or hand on).
    Restored(ObjectId),
    /// A subscription event.
    Event(Event),
    /// An unsealed object was discarded (for the cluster agent, which
    /// releases its id).
    Aborted(ObjectId),
}

/// What one operation asks the daemon to do: notices to deliver, in order,
/// spill segment files that no longer hold any object, and unsealed objects
/// that were discarded (a cluster releases their ids).
#[derive(Debug, Default, PartialEq, Eq)]
#[must_use = "effects must be delivered (Shared::deliver): dropped, their notices are lost and gets waiting on them hang"]
pub struct Effects {
    /// `(recipient, notice)` pairs.
    pub notices: Vec<(ClientId, Notice)>,
    /// Spill segments to remove from the spill directory.
    pub dead_segments: Vec<u64>,
    /// Unsealed objects discarded (aborted, or their creator left).
    pub aborted: Vec<ObjectId>,
}

impl Effects {
    /// Queues a notice.
    pub fn push(&mut self, to: ClientId, notice: Notice) {
        self.notices.push((to, notice));
    }

    /// Appends another operation's effects.
    pub fn extend(&mut self, other: Effects) {
        self.notices.extend(other.notices);
        self.dead_segments.extend(other.dead_segments);
        self.aborted.extend(other.aborted);
    }

    /// True when there is nothing to deliver.
    pub fn is_empty(&self) -> bool {
        self.notices.is_empty() && self.dead_segments.is_empty() && self.aborted.is_empty()
    }
}
