//! The cluster-wide operations behind a client's requests, each routed to
//! its ids' owner and backup; each file holds an operation's calling side
//! (a method of `Cluster` the daemon or another room calls) and its
//! answering side (what the peer service runs when another member asks).
//!
//! - [`claim`] — reserving an id cluster-wide for a create.
//! - [`fresh`] — ids claimed ahead, in batches, handed to clients.
//! - [`update`] — news of copies, applied to the directory.
//! - [`lookup`] — where ids are, waiting for seals when asked.
//! - [`contains`] — whether ids are sealed on some live member.
//! - [`delete`] — every copy and entry of ids, everywhere.
//! - [`list`] — every live member's objects.

pub mod claim;
pub mod contains;
pub mod delete;
pub mod fresh;
pub mod list;
pub mod lookup;
pub mod update;
