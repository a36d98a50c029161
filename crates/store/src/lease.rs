//! [`Lease`]: a range of the arena leased to one client (writes without a
//! round trip; the store's side is `store/leases.rs`), and [`LeaseTops`],
//! how the store closes a client's open lease to take its rest back.

use crate::object::ClientId;

/// Where clients publish how far they allocated in their open lease (the
/// daemon's rings, in shared memory).
pub trait LeaseTops: std::fmt::Debug + Send + Sync {
    /// Closes `client`'s open lease: from now on it allocates nothing more
    /// in it. How far it had allocated, as it says (`None`: nothing to
    /// close); the store checks that it lies in the lease.
    fn close(&self, client: ClientId) -> Option<u64>;
}

/// One lease: `[start, end)` of the arena.
#[derive(Debug)]
pub struct Lease {
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// Where the next object may start: objects lie in the order they were
    /// allocated, and nothing before this is free room any more.
    pub(crate) next: u64,
    /// Ranges before `next` that no object took: freed with the lease.
    pub(crate) holes: Vec<(u64, u64)>,
    /// The client may still allocate in it (its newest lease, not closed)
    /// and publishes how far it did: the store may close it.
    pub(crate) open: bool,
}
