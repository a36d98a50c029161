//! Which stores this client talks to: before it sends anything, the client
//! reads the uid of the process serving the socket (`SO_PEERCRED`, set by
//! the kernel) and hangs up unless it is this process's own user, root, or
//! a uid it was told to trust. Another user who starts a store at the
//! socket path first (a squatter) would otherwise receive every object
//! this client puts, and hand back bytes that `get` unpickles.
//!
//! Root is trusted because it can read any process's memory anyway; a
//! store run by another user is trusted only when named, by
//! [`Trust::with_uids`] or the environment variable [`TRUST_ENV`].

use crate::error::{ClientError, Result};
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// The environment variable naming the uids of stores to trust besides
/// this user's own and root's: `FERROPLASMA_TRUST_UID=1001,1002`.
pub const TRUST_ENV: &str = "FERROPLASMA_TRUST_UID";

/// The store owners a client accepts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trust {
    uids: Vec<u32>,
}

impl Trust {
    /// This user, root, and the uids in [`TRUST_ENV`].
    pub fn from_env() -> Result<Self> {
        let mut t = Self::default();
        if let Some(v) = std::env::var_os(TRUST_ENV) {
            let v = v.to_string_lossy();
            for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let uid = part.parse::<u32>().map_err(|_| {
                    ClientError::InvalidRequest(format!(
                        "{TRUST_ENV}={v}: {part:?} is not a uid (give numbers, e.g. 1001,1002)"
                    ))
                })?;
                t.uids.push(uid);
            }
        }
        Ok(t)
    }

    /// These uids besides.
    pub fn with_uids(mut self, uids: &[u32]) -> Self {
        self.uids.extend_from_slice(uids);
        self
    }

    fn trusts(&self, uid: u32) -> bool {
        uid == 0 || uid == nix::unistd::geteuid().as_raw() || self.uids.contains(&uid)
    }

    /// Refuses a store served by a user this client does not trust.
    pub(crate) fn check(&self, stream: &UnixStream, path: &Path) -> Result<()> {
        let cred = getsockopt(stream, PeerCredentials).map_err(|e| {
            ClientError::PermissionDenied(format!(
                "cannot tell who serves {} ({e}), so the client will not use it",
                path.display()
            ))
        })?;
        let owner = cred.uid();
        if self.trusts(owner) {
            return Ok(());
        }
        let me = nix::unistd::geteuid().as_raw();
        let name = nix::unistd::User::from_uid(owner.into())
            .ok()
            .flatten()
            .map(|u| format!(" ({})", u.name))
            .unwrap_or_default();
        Err(ClientError::PermissionDenied(format!(
            "the store at {} is run by uid {owner}{name}, not by you (uid {me}): it would see \
             everything you put, so this client will not use it. Start your own store on a \
             socket of your own, or, if you trust that user, set {TRUST_ENV}={owner}",
            path.display()
        )))
    }
}
