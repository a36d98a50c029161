//! Blocking Rust client for the ferroplasma object store.
//!
//! A [`Client`] connects to a store's Unix socket, receives the store's
//! shared memory once (as a file descriptor) and maps it; afterwards every
//! request carries only ids and offsets, and object bytes are read and
//! written in place, without copies.
//!
//! Module map:
//! - [`client`] — [`Client`] and its operations; [`DeleteStatus`], [`Stats`].
//! - `get` — [`Client::get`]: sealed local objects from the shared table
//!   (`Client::get_local`), the rest from the store (`Client::get_rest`).
//! - [`listing`] — [`Client::list`] and [`ListPages`], a listing read a page at a time; [`ObjectInfo`], its rows.
//! - [`buffer`] — [`ObjectBuffer`] (sealed, read-only, releases on drop) and
//!   [`MutableBuffer`] (being created; holds the creator's reference;
//!   consumed by `seal` and `abort`).
//! - [`mapping`] — [`mapping::Mapping`], the arena mapped into this process.
//! - `creators` — the creator's reference of each created object: ended
//!   once, by the buffer's drop or an explicit release.
//! - [`subscription`] — [`Subscription`], a stream of seal/delete [`Event`]s.
//! - [`error`] — [`ClientError`].
//! - `fast_creates` — [`Client::create`] and [`Client::create_and_seal`]
//!   of small objects without a round trip, on top of `fast_writes`.
//! - `fast_writes` — creating, writing and sealing small objects without
//!   a round trip: leases of the arena, a ring of records, claims.
//! - `new_ids` — [`Client::new_id`]: ids for new objects, handed out by
//!   a cluster member already claimed cluster-wide.
//! - `session` — one connection shared by a client's clones and buffers:
//!   the mapped arena and the reply multiplexer (threads share the socket).
//! - `releases` — references held, and releases batched into the next
//!   request or sent by a flusher thread within 1 ms.
//! - `connection` — the socket, the handshake and reading replies.
//! - `spin` — looking at the socket for a reply for a few tens of
//!   microseconds before blocking (`FERROPLASMA_SPIN_US`).
//! - `shared_table` — the store's shared table: the object table in shared memory: gets, contains
//!   and releases of sealed local objects without a round trip.
//! - `fork` — cheap detection of use after `fork()`.
//! - [`aligned_map`] — shared memory mapped at a 2 MiB boundary and put in
//!   2 MiB pages (the shared table's regions; the store uses it to create
//!   them in 2 MiB pages).
//! - [`trust`] — [`Trust`]: which users' stores this client talks to.
//! - [`interrupt`] — what a wait for a reply does when a signal arrives.

pub mod aligned_map;
pub mod buffer;
pub mod client;
mod connection;
mod creators;
pub mod error;
mod fast_creates;
mod fast_writes;
mod fork;
mod get;
pub mod interrupt;
pub mod listing;
pub mod mapping;
mod new_ids;
mod releases;
mod session;
mod shared_table;
mod spin;
pub mod subscription;
pub mod trust;

pub use buffer::{MutableBuffer, ObjectBuffer};
pub use client::{Client, ClusterStatus, DeleteStatus, Stats};
pub use error::{ClientError, Result};
pub use ferroplasma_protocol::pb::{MemberHealth, MemberStatus};
pub use ferroplasma_protocol::shared_table::prefetch;
pub use ferroplasma_protocol::{default_socket_path, ObjectId, DEFAULT_SOCKET, SOCKET_ENV};
pub use interrupt::set_interrupt_check;
pub use listing::{ListPages, ObjectInfo};
pub use spin::{DEFAULT_SPIN_US, MAX_SPIN_US, SPIN_ENV};
pub use subscription::{
    decode_event_frames, decode_plasma_event, Event, EventFraming, EventKind, Subscription,
};
