//! The cluster's error type: why a member could not start.

/// Why a cluster member could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A flag's value that cannot be used.
    #[error("{0}")]
    BadConfig(String),
    /// An I/O error (a port, the cluster's runtime or thread).
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl ClusterError {
    pub(crate) fn io(what: impl Into<String>, source: impl Into<std::io::Error>) -> Self {
        Self::Io {
            what: what.into(),
            source: source.into(),
        }
    }
}
