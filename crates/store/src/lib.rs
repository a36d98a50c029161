//! The ferroplasma object table: allocation, references, eviction, waits and
//! subscriptions, as a state machine with no I/O. The daemon feeds it
//! requests (and the time) and delivers the [`Effects`] it returns.
//!
//! Module map:
//! - [`store`] — [`Store`], the state machine: objects' lives (create,
//!   seal, get, release, delete) in `store/mod.rs`; `store/eviction.rs`
//!   (making room), `store/spilling.rs` (spilling and restoring, the books'
//!   side), `store/queries.rs` (list, stats), `store/listing.rs` (the
//!   snapshot of ids and the rows of a page, for lists that page),
//!   `store/leases.rs` (leases, and objects made in them).
//! - [`allocator`] — best-fit, 64-byte-aligned, coalescing range allocator.
//! - [`object`] — object entries (88 bytes each), [`Location`],
//!   [`ObjectInfo`], [`ObjectState`].
//! - `dense` — the compact id-keyed table the objects (and [`Lru`]'s
//!   nodes) live in: entries in chunks, a sharded index of positions, the
//!   eviction order as a list through it; it gives memory back as it
//!   empties.
//! - `trim` — asks the allocator to return freed memory to the system.
//! - [`events`] — [`Effects`], [`Notice`] and subscription [`Event`]s.
//! - [`stats`] — [`Stats`].
//! - `spill` — the books of spilled objects and spill segments ([`SpillRef`]).
//! - [`error`] — [`StoreError`].
//! - [`policy`] — [`EvictionPolicy`]: which objects to evict (the store
//!   evicts them).
//! - [`lru`] — [`Lru`]: least recently released first, as a policy of its
//!   own (the store keeps the same order in its table by default).
//! - `clients` — per-client references, creations and waits.
//! - `lease` — a range of the arena a client allocates small objects in
//!   itself (writes without a round trip); `store/leases.rs` takes them in.
//! - [`readers`] — [`Readers`]: the hook for readers that take references
//!   without asking (the shared object table).

pub mod allocator;
mod clients;
mod dense;
pub mod error;
pub mod events;
pub mod lease;
pub mod lru;
pub mod object;
pub mod policy;
pub mod readers;
mod spill;
pub mod stats;
pub mod store;
mod trim;

pub use error::StoreError;
pub use events::{Effects, Event, EventKind, Notice};
pub use lease::LeaseTops;
pub use lru::Lru;
pub use object::{ClientId, Location, ObjectInfo, ObjectState, MAX_METADATA, MAX_REFS};
pub use policy::EvictionPolicy;
pub use readers::Readers;
pub use spill::SpillRef;
pub use stats::{Stats, Usage};
pub use store::{DeleteOutcome, SpillVictim, Store};
