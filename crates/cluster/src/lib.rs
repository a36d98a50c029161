//! Many ferroplasma stores, one namespace: membership, the partitioned
//! object directory, and pulling objects between members (docs/cluster.md).
//! The daemon starts a [`Cluster`] over its store through [`LocalStore`].
//!
//! Module map:
//! - [`cluster`] — [`Cluster`], this member's view: config, counters,
//!   status, members joining and dying.
//! - `start` — [`Cluster::start`]: ports, the cluster's thread and the
//!   heartbeat thread, their tasks.
//! - [`local`] — [`LocalStore`] and [`Memory`]: what the cluster needs of
//!   the local store.
//! - [`error`] — [`ClusterError`].
//! - [`wire`] — protobuf conversions and the peer protocol's limits.
//! - [`pb`] — generated gRPC code of the peer protocol.
//! - [`directory`] — ring, directory entries, membership, the directory
//!   agent.
//! - [`ops`] — cluster-wide claim, update, lookup, contains, delete, list.
//! - [`transfer`] — remote gets, the bulk transport, landing and serving.
//! - [`peers`] — gRPC channels, the peer service, heartbeats, token, retries.
//! - [`net`] — the network ports' guard and rate-limited logs (also used by
//!   the daemon's metrics endpoint).
//! - `sync` — locking and the clock.
//!
//! Lock order. The crate's locks, and the order in which one may be taken
//! while another is held (a lock is only ever taken after those before it
//! in this list; every other pair never nests):
//! 1. `Cluster::membership` (`Mutex<Membership>`): a fetch round holds it
//!    while it ends fetches (`inflight`).
//! 2. `Cluster::granted` (`Mutex<HashSet<ObjectId>>`): a re-registration
//!    holds it while it lists the store (`LocalStore::list`, the store's
//!    lock).
//! 3. `Cluster::inflight` (`Mutex<HashMap<ObjectId, Inflight>>`): a fetch's
//!    prune holds it while it asks the store what exists.
//! 4. `Cluster::directory` (`Mutex<Directory>`): held while the ring is read
//!    or replaced (a claim, a re-registration, a ring change).
//! 5. `Cluster::ring` (`Mutex<Ring>`).
//! 6. The local store's own lock (the daemon's `Shared`), taken inside each
//!    [`LocalStore`] method and never held on return; `LocalStore::land`
//!    calls back under it, and that callback takes `cached`.
//! 7. `Cluster::cached` (`Mutex<Copies>`).
//! 8. Leaves, which nest nothing: `Peers::channels`
//!    (`Mutex<HashMap<String, Client>>`, of `Cluster::peers` and
//!    `Cluster::hb_peers`), `Cluster::info` (`Mutex<MemberInfo>`),
//!    `Cluster::fresh` (`Mutex<Vec<ObjectId>>`), `TcpTransport::pool` and
//!    `TcpTransport::slots` (`Mutex<HashMap<..>>`), each `RateLimited`'s
//!    `Mutex`.
//!
//! None is held across an `.await`. The heartbeat thread takes only
//! `membership`, `directory` (a claim, a lookup) and leaves; no lock is
//! held long: what goes through every directory entry (a member's death,
//! a new ring, a re-registration) does so a piece at a time.

pub mod cluster;
pub mod directory;
pub mod error;
pub mod local;
pub mod net;
pub mod ops;
pub mod pb;
pub mod peers;
mod start;
mod sync;
pub mod transfer;
pub mod wire;

#[cfg(test)]
mod testkit;
#[cfg(test)]
mod thread_tests;

pub use cluster::{Cluster, ClusterConfig, Completion, Completions, Counters};
pub use error::ClusterError;
pub use local::{LocalStore, Memory};
pub use wire::wire_error;
