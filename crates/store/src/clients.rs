//! What the store remembers about each connected client, so that a client
//! that disconnects or dies leaves nothing behind.

use ferroplasma_protocol::{IdHasher, ObjectId};
use std::collections::{HashMap, HashSet};

/// Per-client bookkeeping.
#[derive(Debug, Default)]
pub(crate) struct ClientState {
    /// References held, per object (a client may hold several to one object).
    pub refs: HashMap<ObjectId, u64, IdHasher>,
    /// Unsealed objects this client created.
    pub created: HashSet<ObjectId, IdHasher>,
    /// Objects this client waits to see sealed.
    pub watching: HashSet<ObjectId, IdHasher>,
    /// Ranges of the arena this client creates small objects in itself.
    pub leases: Vec<crate::lease::Lease>,
}
