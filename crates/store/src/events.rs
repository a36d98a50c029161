//! What the state machine asks the daemon to tell clients.

use crate::object::ClientId;
use ferroplasma_protocol::ObjectId;

/// Kind of a subscription event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// An object was sealed.
    Sealed,
    /// An object was deleted or evicted.
    Deleted,
}

/// A subscription event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Sealed or deleted.
    pub kind: EventKind,
    /// The object.
    pub id: ObjectId,
    /// Data bytes (0 for deletions).
    pub data_size: u64,
    /// Metadata bytes (0 for deletions).
    pub metadata_size: u64,
}

/// A message for one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// An object the client watched is sealed: retry its pending gets.
    Sealed(ObjectId),
    /// A subscription event.
    Event(Event),
}

/// Notices produced by one operation, in order.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// `(recipient, notice)` pairs.
    pub notices: Vec<(ClientId, Notice)>,
}

impl Effects {
    /// Queues a notice.
    pub fn push(&mut self, to: ClientId, notice: Notice) {
        self.notices.push((to, notice));
    }

    /// Appends another operation's effects.
    pub fn extend(&mut self, other: Effects) {
        self.notices.extend(other.notices);
    }

    /// True when there is nothing to deliver.
    pub fn is_empty(&self) -> bool {
        self.notices.is_empty()
    }
}
