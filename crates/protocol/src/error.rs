//! The protocol crate's error type.

/// What can go wrong while framing or decoding protocol messages.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// A frame announced more bytes than the limit allows.
    #[error("frame of {size} bytes exceeds the limit of {limit} bytes")]
    FrameTooLarge {
        /// The announced size.
        size: u64,
        /// The limit in force.
        limit: u64,
    },
    /// The bytes of a frame are not a valid message.
    #[error("malformed message: {0}")]
    Decode(#[from] prost::DecodeError),
    /// An object id of the wrong length.
    #[error("object id must be {expected} bytes, got {got}")]
    BadObjectId {
        /// Always [`crate::id::ObjectId::LEN`].
        expected: usize,
        /// The length received.
        got: usize,
    },
    /// Text that is not an object id in hex.
    #[error("{0:?} is not an object id: give its 40 hex digits")]
    BadHexId(String),
    /// The peer closed the connection.
    #[error("connection closed by peer")]
    Closed,
    /// An I/O error on the socket.
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
}
