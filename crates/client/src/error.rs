//! The client's error type: store refusals by kind, plus local failures.

use ferroplasma_protocol::{pb, ObjectId, ProtocolError};
use std::path::PathBuf;

/// Everything a client call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing answers on the socket.
    #[error(
        "no ferroplasma store at {path}: {cause}. Start one with `ferroplasma store`, \
         or point FERROPLASMA_SOCKET at a running store"
    )]
    StoreUnavailable {
        /// The socket tried.
        path: PathBuf,
        /// Why connecting failed (part of the message).
        cause: std::io::Error,
    },
    /// The id is taken.
    #[error("{message}")]
    ObjectExists {
        /// The store's message.
        message: String,
        /// The id.
        id: Option<ObjectId>,
    },
    /// No such object.
    #[error("{message}")]
    ObjectNotFound {
        /// The store's message.
        message: String,
        /// The id.
        id: Option<ObjectId>,
    },
    /// Not enough memory, even after eviction.
    #[error("{0}")]
    StoreFull(String),
    /// Seal/abort of an object another client created, or already sealed.
    #[error("{0}")]
    InvalidState(String),
    /// A size or count over the store's limits.
    #[error("{0}")]
    TooLarge(String),
    /// This connection already has as many gets waiting (or objects
    /// awaited) as the store allows: retry when some finish.
    #[error("{0}")]
    TooManyWaiting(String),
    /// The store serves its maximum of clients (`--max-clients`) and
    /// refused this connection: retry when some have disconnected.
    #[error("{0}")]
    StoreBusy(String),
    /// The request was malformed (e.g. an id that is not 20 bytes).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// Client and store speak different protocol versions.
    #[error("{0}")]
    VersionMismatch(String),
    /// The peer broke the protocol (or sent something this client cannot read).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Release of an object this client holds no reference to.
    #[error("this client holds no reference to object {0}")]
    NotHeld(ObjectId),
    /// The client was created in a parent process; its socket belongs there.
    #[error(
        "this client was connected in process {parent}, before a fork; \
         connect a new client in this process"
    )]
    Forked {
        /// The pid that connected.
        parent: u32,
    },
    /// Every copy of the object was on cluster members that died.
    #[error("{message}")]
    ObjectLost {
        /// The store's message.
        message: String,
        /// The id.
        id: Option<ObjectId>,
    },
    /// A cluster member the request needed did not answer.
    #[error("{0}")]
    ClusterUnavailable(String),
    /// Not allowed: the store is run by a user this client does not trust,
    /// or this client's user may only read the store.
    #[error("{0}")]
    PermissionDenied(String),
    /// The connection to the store broke.
    #[error("lost the connection to the store: {0}")]
    Disconnected(#[source] std::io::Error),
    /// A signal interrupted the wait for the store's reply and the
    /// installed interrupt check abandoned the call (see
    /// [`crate::interrupt`]); the connection is still usable.
    #[error("interrupted by a signal while waiting for the store; the request was abandoned")]
    Interrupted,
}

impl ClientError {
    /// A read that a signal interrupted (`EINTR`): not a broken connection.
    pub(crate) fn is_signal(&self) -> bool {
        matches!(self, ClientError::Disconnected(io) if io.kind() == std::io::ErrorKind::Interrupted)
    }
}

impl From<ProtocolError> for ClientError {
    fn from(e: ProtocolError) -> Self {
        match e {
            ProtocolError::Io(io) => ClientError::Disconnected(io),
            ProtocolError::Closed => ClientError::Disconnected(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the store closed the connection",
            )),
            other => ClientError::Protocol(other.to_string()),
        }
    }
}

impl From<pb::Error> for ClientError {
    fn from(e: pb::Error) -> Self {
        use pb::ErrorCode as C;
        let id = ObjectId::from_slice(&e.object_id).ok();
        let m = e.message;
        match C::try_from(e.code).unwrap_or(C::Unspecified) {
            C::ObjectExists => ClientError::ObjectExists { message: m, id },
            C::ObjectNotFound => ClientError::ObjectNotFound { message: m, id },
            C::StoreFull => ClientError::StoreFull(m),
            C::NotCreator | C::AlreadySealed => ClientError::InvalidState(m),
            C::TooLarge => ClientError::TooLarge(m),
            C::TooManyWaiting => ClientError::TooManyWaiting(m),
            C::StoreBusy => ClientError::StoreBusy(m),
            C::InvalidRequest => ClientError::InvalidRequest(m),
            C::VersionMismatch => ClientError::VersionMismatch(m),
            C::ObjectLost => ClientError::ObjectLost { message: m, id },
            C::ClusterUnavailable => ClientError::ClusterUnavailable(m),
            C::PermissionDenied => ClientError::PermissionDenied(m),
            C::ProtocolViolation | C::Unspecified => ClientError::Protocol(m),
        }
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;
