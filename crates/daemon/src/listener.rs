//! The store's Unix socket: refuse to start over a live store, replace a
//! stale socket file (and, when asked, a regular file), create it with
//! restricted permissions, remove it at exit.

use crate::DaemonError;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Removes the socket file when dropped, if it is still the one we made
/// (unless told to keep it).
#[derive(Debug)]
pub struct SocketGuard {
    path: PathBuf,
    ino: u64,
    keep: bool,
}

impl SocketGuard {
    /// Leaves the socket file when the store stops (`--keep-socket`).
    pub fn keep(&mut self) {
        self.keep = true;
    }
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        if std::fs::metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Binds a listening socket at `path` with permissions `mode`; with
/// `replace_file`, a regular file at `path` is removed first.
pub fn bind(
    path: &Path,
    mode: u32,
    replace_file: bool,
) -> Result<(std::os::unix::net::UnixListener, SocketGuard), DaemonError> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if replace_file && meta.file_type().is_file() {
            tracing::info!(path = %path.display(), "replacing a regular file with the socket (--replace-file)");
            std::fs::remove_file(path)
                .map_err(|e| DaemonError::io(format!("removing {}", path.display()), e))?;
        } else if !meta.file_type().is_socket() {
            return Err(DaemonError::NotASocket(path.to_path_buf()));
        } else {
            replace_stale_socket(path)?;
        }
    }
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() && !parent.exists() {
            return Err(DaemonError::BadConfig(format!(
                "the socket's directory {} does not exist: create it first \
                 (mkdir -p {}), or pass another --socket",
                parent.display(),
                parent.display()
            )));
        }
    }
    // Create the file with no permissions for others from the start (umask),
    // then set the requested mode: there is no window where others could
    // connect.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = std::os::unix::net::UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let listener = bound.map_err(|e| DaemonError::io(format!("binding {}", path.display()), e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| DaemonError::io(format!("chmod {}", path.display()), e))?;
    let ino = std::fs::metadata(path)
        .map_err(|e| DaemonError::io(format!("stat {}", path.display()), e))?
        .ino();
    listener
        .set_nonblocking(true)
        .map_err(|e| DaemonError::io("set_nonblocking", e))?;
    Ok((
        listener,
        SocketGuard {
            path: path.to_path_buf(),
            ino,
            keep: false,
        },
    ))
}

/// Removes a socket file no store answers on; refuses a live one.
fn replace_stale_socket(path: &Path) -> Result<(), DaemonError> {
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(DaemonError::AlreadyRunning(path.to_path_buf()));
    }
    tracing::info!(path = %path.display(), "replacing a stale socket file");
    std::fs::remove_file(path)
        .map_err(|e| DaemonError::io(format!("removing stale {}", path.display()), e))
}
