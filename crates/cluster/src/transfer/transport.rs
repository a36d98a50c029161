//! The bulk transport's interface: [`Transport`] pulls a batch of objects
//! from a member into a [`Landing`]; a [`Source`] pins local objects while
//! they are sent. The TCP implementation (`client`, `server`, in the format
//! of `codec`) is the one in use; an RDMA one (UCX or libfabric, registering
//! the arena once) would implement the same traits.

use crate::local::Pinned;
use crate::transfer::codec::{Absent, Arrival};
use ferroplasma_protocol::ObjectId;
use std::future::Future;
use std::pin::Pin;

/// Why a pull failed.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// The member could not be reached or the connection broke.
    #[error("transfer from {peer} failed: {source}")]
    Io {
        /// The member's bulk address.
        peer: String,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// The member stopped sending for longer than the timeout.
    #[error("transfer from {0} stalled")]
    Stalled(String),
    /// The member sent something that is not the protocol.
    #[error("transfer from {peer}: {what}")]
    Protocol {
        /// The member's bulk address.
        peer: String,
        /// What was wrong.
        what: String,
    },
}

/// Where pulled objects land: the local store allocates each frame's
/// objects once their sizes are known. Objects allocated and not yet
/// [`Landing::arrived`] when the pull fails, or when the landing is
/// dropped, are discarded.
pub trait Landing: Send {
    /// Allocates one frame's objects, each with its metadata in place, and
    /// returns for each the bytes to receive its data into, or `None` when
    /// it cannot be taken here (its bytes are then read and dropped; the
    /// landing keeps the reason).
    fn allocate<'s>(&'s mut self, objects: &[Arrival<'_>]) -> Vec<Option<&'s mut [u8]>>;
    /// Every object of the last [`Landing::allocate`] was received whole.
    fn arrived(&mut self);
    /// The request's object at `index` does not come, for that reason.
    fn not_there(&mut self, index: usize, why: Absent<'_>);
}

/// The local objects a member serves to others.
pub trait Source: Send + Sync {
    /// Pins sealed objects for sending, in the order of `ids`, and stops
    /// after the first object that brings the data pinned to `max_bytes`
    /// or more (at least one entry when `ids` is not empty). May block (to
    /// bring spilled objects back) when [`Source::is_spilled`] says so: the
    /// caller then runs it on a blocking thread.
    fn pin(&self, ids: &[ObjectId], max_bytes: u64) -> Pinned;
    /// Whether pinning any of `ids` has to read it back from disk first.
    fn is_spilled(&self, _ids: &[ObjectId]) -> bool {
        false
    }
    /// The directory entries of `ids` (protobuf), for a `LOOKUP` of
    /// objects that are not here; empty: no entry.
    fn entries(&self, ids: &[ObjectId]) -> Vec<Vec<u8>> {
        vec![Vec::new(); ids.len()]
    }
    /// Counts objects sent.
    fn served(&self, objects: u64, bytes: u64);
}

/// The boxed future a [`Transport`] pull returns.
pub type PullFuture<'a> = Pin<Box<dyn Future<Output = Result<(), TransferError>> + Send + 'a>>;

/// Pulls objects from other members.
pub trait Transport: Send + Sync + std::fmt::Debug {
    /// Pulls `ids` (at most `MAX_PULL_IDS`) from the member whose bulk
    /// address is `peer` into `landing`, in one request of `kind`
    /// (`PULL` or `LOOKUP`).
    fn pull<'a>(
        &'a self,
        peer: &'a str,
        kind: u8,
        ids: &'a [ObjectId],
        landing: &'a mut dyn Landing,
    ) -> PullFuture<'a>;
    /// Forgets pooled connections to `peer` (it died or restarted).
    fn forget(&self, peer: &str);
}
