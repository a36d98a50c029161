//! [`Lease`]: a range of the arena leased to one client (writes without a
//! round trip; the store's side is `store/leases.rs`).

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
}
