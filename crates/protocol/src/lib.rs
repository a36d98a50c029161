//! Frames and messages shared by the ferroplasma store and its clients.
//!
//! The wire protocol is written down in `docs/protocol.md`; this crate is its
//! Rust rendering, with no I/O policy of its own.
//!
//! Module map:
//! - [`pb`] — the protobuf messages generated from `proto/ferroplasma/store/v1/store.proto`.
//! - [`id`] — [`ObjectId`], the 20-byte object identifier.
//! - [`frame`] — length-prefixed framing, limits, blocking frame read/write helpers.
//! - [`layout`] — where data and metadata lie inside an allocation (64-byte alignment).
//! - [`event`] — [`Event`], what subscribers are told.
//! - [`shared_table`] — the shared table: the object table in shared memory and the hold protocol
//!   (gets without a round trip).
//! - [`fast_writes`] — writes without a round trip: the claims, rings and
//!   leases by which a client creates and seals small objects itself.
//! - [`error`] — [`ProtocolError`], this crate's error type.

pub mod error;
pub mod event;
pub mod fast_writes;
pub mod frame;
pub mod id;
pub mod layout;
pub mod shared_table;

/// Generated protobuf messages (package `ferroplasma.store.v1`).
#[allow(missing_docs, clippy::all, missing_debug_implementations)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/ferroplasma.store.v1.rs"));
}

pub use error::ProtocolError;
pub use event::{Event, EventKind};
pub use id::{pack_ids, unpack_ids, ObjectId};

/// The protocol version this crate speaks; sent in `Connect` and checked by the store.
pub const PROTOCOL_VERSION: u32 = 1;

/// The hasher for maps keyed by object ids (and by the store's client ids,
/// looked up for every notice and reference): fast, and seeded per process
/// so that clients cannot choose ids that collide.
pub type IdHasher = foldhash::fast::RandomState;

/// The socket every client and command uses when none is given.
pub const DEFAULT_SOCKET: &str = "/tmp/ferroplasma.sock";

/// The environment variable that overrides [`DEFAULT_SOCKET`].
pub const SOCKET_ENV: &str = "FERROPLASMA_SOCKET";

/// The socket path to use: `explicit`, else `$FERROPLASMA_SOCKET`, else [`DEFAULT_SOCKET`].
pub fn default_socket_path(explicit: Option<&std::path::Path>) -> std::path::PathBuf {
    if let Some(p) = explicit {
        return p.to_path_buf();
    }
    match std::env::var_os(SOCKET_ENV) {
        Some(v) if !v.is_empty() => v.into(),
        _ => DEFAULT_SOCKET.into(),
    }
}
