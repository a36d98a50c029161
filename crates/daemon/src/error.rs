//! The daemon's error type: why a store could not start or stopped.

use std::path::PathBuf;

/// Why the store could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Another store answers on the socket path.
    #[error(
        "a ferroplasma store is already running on {0}; stop it first, or pass another --socket"
    )]
    AlreadyRunning(PathBuf),
    /// The socket path exists and is not a socket.
    #[error(
        "{0} exists and is not a socket, so the store will not overwrite it: remove it, \
         pass another --socket, or pass --replace-file to replace a regular file there \
         (as Plasma's store did)"
    )]
    NotASocket(PathBuf),
    /// A size that cannot be used for the arena.
    #[error("invalid memory size: {0}")]
    BadSize(String),
    /// Flags that do not work together, or a malformed value.
    #[error("{0}")]
    BadConfig(String),
    /// Creating or mapping the shared memory failed.
    #[error("cannot create the shared-memory arena ({what})")]
    Arena {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Any other I/O error (socket, runtime).
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl From<ferroplasma_cluster::ClusterError> for DaemonError {
    fn from(e: ferroplasma_cluster::ClusterError) -> Self {
        use ferroplasma_cluster::ClusterError as C;
        match e {
            C::BadConfig(why) => Self::BadConfig(why),
            C::Io { what, source } => Self::Io { what, source },
        }
    }
}

impl DaemonError {
    pub(crate) fn io(what: impl Into<String>, source: impl Into<std::io::Error>) -> Self {
        Self::Io {
            what: what.into(),
            source: source.into(),
        }
    }

    pub(crate) fn arena(what: impl Into<String>, source: impl Into<std::io::Error>) -> Self {
        Self::Arena {
            what: what.into(),
            source: source.into(),
        }
    }
}
