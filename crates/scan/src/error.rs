//! The crate's one error type.

use arrow_schema::ArrowError;

/// Everything that can go wrong moving a scan's batches.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket failed or the peer hung up.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The peer sent something that is not the scan protocol.
    #[error("{0}")]
    Protocol(String),
    /// The server answered with an ERROR frame (`code`: auth, query, ...).
    #[error("{message}")]
    Remote { code: String, message: String },
    /// The query failed while producing a batch (DuckDB's message).
    #[error("{0}")]
    Query(String),
    /// Buffers that do not make the arrays the schema and descriptor say.
    #[error("{0}")]
    Layout(String),
    /// The store refused an object (full, gone, ...); the store client's
    /// own error.
    #[error("{0}")]
    Store(Box<dyn std::error::Error + Send + Sync>),
    /// The scan was closed while a call waited on it.
    #[error("the scan was closed")]
    Closed,
}

/// This crate's results.
pub type Result<T> = std::result::Result<T, Error>;

impl From<ArrowError> for Error {
    fn from(e: ArrowError) -> Self {
        Error::Layout(e.to_string())
    }
}
