//! Subscription events, as the store produces them and clients receive them.

use crate::ObjectId;

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// It was sealed.
    Sealed,
    /// It was deleted or evicted.
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
