//! Store-wide counters and memory figures.

/// A snapshot of the store's figures.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Stats {
    /// Usable bytes.
    pub capacity: u64,
    /// Bytes held by allocations.
    pub used: u64,
    /// Objects in the table, sealed or not.
    pub objects: u64,
    /// Sealed objects.
    pub sealed_objects: u64,
    /// Objects with at least one reference.
    pub referenced_objects: u64,
    /// Connected clients.
    pub clients: u64,
    /// Objects evicted since start.
    pub evictions: u64,
    /// Bytes evicted since start.
    pub evicted_bytes: u64,
    /// Largest free range.
    pub largest_free_block: u64,
    /// Number of free ranges.
    pub free_blocks: u64,
    /// `1 - largest_free_block / free bytes`.
    pub fragmentation: f64,
    /// Bytes held by sealed, unreferenced objects.
    pub evictable_bytes: u64,
    /// Objects whose bytes are in the spill directory.
    pub spilled_objects: u64,
    /// Bytes of those objects (their allocations).
    pub spilled_bytes: u64,
    /// Bytes of segment files in the spill directory.
    pub spill_dir_bytes: u64,
    /// Segment files in the spill directory.
    pub spill_segments: u64,
    /// Objects spilled since start.
    pub spills: u64,
    /// Objects restored from the spill directory since start.
    pub restores: u64,
    /// Objects some client waits to see sealed.
    pub awaited_objects: u64,
}

/// The figures a cluster member sends in every heartbeat ([`crate::Store::usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Usable bytes.
    pub capacity: u64,
    /// Bytes held by allocations.
    pub used: u64,
    /// Objects in the table, sealed or not.
    pub objects: u64,
}
