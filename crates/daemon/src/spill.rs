//! The spill directory: segment files that hold objects moved out of
//! shared memory. The state machine decides what to spill and keeps the
//! books; this module only writes, reads and removes the files, and keeps
//! the directory private and healthy.
//!
//! Privacy, as OpenSSH's StrictModes and PostgreSQL's data directory do it:
//! - each store makes its own subdirectory of `--spill-dir` with an
//!   unpredictable name (`ferroplasma-spill-<pid>-<random>`), mode 0700,
//!   with a `mkdir` that fails if anything is there already, then opens it
//!   without following links and checks its owner and mode;
//! - the parent must not be writable by other users unless it is sticky
//!   (like `/tmp`), so nobody else can rename the directory away;
//! - segment files are created relative to the directory's descriptor
//!   with `O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600, and opened for
//!   reading with `O_NOFOLLOW`: a link planted in the directory is never
//!   followed, and a directory swapped in at the same path is never used.
//!
//! Health: a failed write (a full disk, a directory removed under the
//! store) is logged once and makes spills refuse at once for
//! [`RETRY_AFTER`], so creates that need room fail fast with a clear error
//! instead of spinning; a directory that was removed is made again (a new
//! private one), and the objects spilled into the old one are reported lost
//! by the caller ([`SpillDir::vanished`]).

use crate::arena::Arena;
use crate::DaemonError;
use ferroplasma_store::{SpillRef, SpillVictim};
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long spills are refused after one failed, before the next try.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The directory in use: its path, its name in the parent, and an open
/// descriptor of it.
#[derive(Debug)]
struct Place {
    path: PathBuf,
    name: String,
    fd: OwnedFd,
}

/// The last failure, while spills are refused.
#[derive(Debug)]
struct Failure {
    at: Instant,
    reason: String,
}

#[derive(Debug)]
struct Inner {
    /// `--spill-dir`, opened once: every later step is relative to it, so
    /// the path being swapped afterwards changes nothing. Opened (and
    /// checked) again only if it was itself removed.
    parent_fd: OwnedFd,
    place: Place,
    failure: Option<Failure>,
    /// Bumped when the directory is found removed: a spill written while
    /// it changed went to a file that is gone.
    generation: u64,
    /// The removal was reported (by [`SpillDir::vanished`]) and no new
    /// directory could be made yet.
    gone_reported: bool,
}

/// The spill directory of one store.
#[derive(Debug)]
pub struct SpillDir {
    /// `--spill-dir`, for messages.
    parent: PathBuf,
    inner: Mutex<Inner>,
}

impl SpillDir {
    /// Creates the store's private subdirectory under `parent`, after
    /// checking that `parent` is a directory other users cannot tamper
    /// with.
    pub fn create(parent: &Path) -> Result<Self, DaemonError> {
        let parent_fd = open_parent(parent)?;
        let place = make_private(parent, &parent_fd)?;
        Ok(Self {
            parent: parent.to_path_buf(),
            inner: Mutex::new(Inner {
                parent_fd,
                place,
                failure: None,
                generation: 0,
                gone_reported: false,
            }),
        })
    }

    /// Changes when the directory is found removed (see
    /// [`SpillDir::vanished`]): a spill that started before and ends after
    /// a change wrote into a removed directory, and must not be recorded.
    pub fn generation(&self) -> u64 {
        self.inner().generation
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The directory segment files go to.
    pub fn path(&self) -> PathBuf {
        self.inner().place.path.clone()
    }

    /// Why spills are refused right now (a write failed less than
    /// [`RETRY_AFTER`] ago), or `None` when a spill may be tried.
    pub fn refusal(&self) -> Option<String> {
        let inner = self.inner();
        let f = inner.failure.as_ref()?;
        (f.at.elapsed() < RETRY_AFTER).then(|| f.reason.clone())
    }

    /// Whether the directory was found removed under the store since the
    /// last call: `true` once per removal, and every object spilled before
    /// it is gone (the caller reports them lost). A new private directory
    /// takes its place when it can be made, tried at most once per
    /// [`RETRY_AFTER`]; until then spills are refused.
    pub fn vanished(&self) -> bool {
        let mut inner = self.inner();
        let gone = match nix::sys::stat::fstat(inner.place.fd.as_raw_fd()) {
            Ok(st) => st.st_nlink == 0,
            Err(_) => true,
        };
        if !gone {
            return false;
        }
        let report = !inner.gone_reported;
        if report {
            inner.gone_reported = true;
            inner.generation += 1;
        }
        let may_try = inner
            .failure
            .as_ref()
            .is_none_or(|f| report || f.at.elapsed() >= RETRY_AFTER);
        if !may_try {
            return report;
        }
        let parent_gone =
            nix::sys::stat::fstat(inner.parent_fd.as_raw_fd()).map_or(true, |st| st.st_nlink == 0);
        let renewed = if parent_gone {
            // Made again by its owner, perhaps: open and check it anew.
            open_parent(&self.parent).and_then(|fd| {
                let place = make_private(&self.parent, &fd)?;
                inner.parent_fd = fd;
                Ok(place)
            })
        } else {
            make_private(&self.parent, &inner.parent_fd)
        };
        match renewed {
            Ok(place) => {
                tracing::warn!(
                    old = %inner.place.path.display(), new = %place.path.display(),
                    "the spill directory was removed under the store; spilling goes on in a new one"
                );
                inner.place = place;
                inner.failure = None;
                inner.gone_reported = false;
            }
            Err(e) => {
                let reason = format!(
                    "the spill directory {} was removed and a new one cannot be made: {e}",
                    inner.place.path.display()
                );
                if report {
                    tracing::error!("{reason}; creates that need room are refused until it can");
                }
                inner.failure = Some(Failure {
                    at: Instant::now(),
                    reason,
                });
            }
        }
        report
    }

    fn segment_name(segment: u64) -> String {
        format!("segment-{segment}.spill")
    }

    /// Opens a segment file relative to the directory's descriptor, never
    /// following a link.
    fn open(&self, segment: u64, flags: OFlag) -> std::io::Result<File> {
        let inner = self.inner();
        let fd = openat(
            Some(inner.place.fd.as_raw_fd()),
            Self::segment_name(segment).as_str(),
            flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )?;
        // Safety: `openat` returned a new descriptor that nothing else owns.
        Ok(File::from(unsafe {
            <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd)
        }))
    }

    fn unlink(&self, segment: u64) -> std::io::Result<()> {
        let inner = self.inner();
        nix::unistd::unlinkat(
            Some(inner.place.fd.as_raw_fd()),
            Self::segment_name(segment).as_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        )
        .map_err(std::io::Error::from)
    }

    /// Writes the victims' allocations from the arena into a new segment
    /// file, one after another; returns each one's offset in the file. On
    /// an error (a full disk, a removed directory) the partial file is
    /// removed, the error is logged once, and spills are refused for
    /// [`RETRY_AFTER`].
    ///
    /// The file's blocks are reserved first (fallocate), so a full disk is
    /// an error here and not a lost write-back later; the data is then left
    /// to the page cache, not flushed: a spilled object lives as long as the
    /// store process, whose own death takes the directory with it, so
    /// waiting for the disk (which blocked the store for the length of an
    /// fsync) buys nothing. Where the filesystem cannot reserve blocks, the
    /// write is flushed as before.
    pub fn write_segment(
        &self,
        segment: u64,
        arena: &Arena,
        victims: &[SpillVictim],
    ) -> std::io::Result<Vec<u64>> {
        let mut created = false;
        let result = (|| {
            let file = self.open(segment, OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL)?;
            created = true;
            let total: u64 = victims.iter().map(|v| v.len).sum();
            let reserved = total == 0
                || nix::fcntl::fallocate(
                    file.as_raw_fd(),
                    nix::fcntl::FallocateFlags::empty(),
                    0,
                    total as i64,
                )
                .map(|_| true)
                .or_else(|e| match e {
                    nix::errno::Errno::EOPNOTSUPP => Ok(false),
                    e => Err(std::io::Error::from(e)),
                })?;
            let mut f = std::io::BufWriter::with_capacity(1 << 20, file);
            let mut offsets = Vec::with_capacity(victims.len());
            let mut pos = 0u64;
            for v in victims {
                offsets.push(pos);
                f.write_all(arena.bytes(v.offset, v.len))?;
                pos += v.len;
            }
            let file = f.into_inner().map_err(|e| e.into_error())?;
            if !reserved {
                file.sync_data()?;
            }
            Ok(offsets)
        })();
        match &result {
            Ok(_) => self.note_success(),
            Err(e) => {
                if created {
                    let _ = self.unlink(segment);
                }
                self.note_failure(e);
            }
        }
        result
    }

    fn note_failure(&self, e: &std::io::Error) {
        let mut inner = self.inner();
        let reason = format!("writing to {} failed: {e}", inner.place.path.display());
        if inner.failure.is_none() {
            tracing::warn!(
                "spilling stopped: {reason}; creates that need room are refused (tried again \
                 at most once per {RETRY_AFTER:?}, and this is not logged again until it works)"
            );
        }
        inner.failure = Some(Failure {
            at: Instant::now(),
            reason,
        });
    }

    fn note_success(&self) {
        let mut inner = self.inner();
        if inner.failure.take().is_some() {
            tracing::info!(dir = %inner.place.path.display(), "spilling works again");
        }
    }

    /// Reads a spilled allocation back into the arena at `offset`.
    pub fn read_into(&self, at: SpillRef, arena: &Arena, offset: u64) -> std::io::Result<()> {
        let f = self.open(at.segment, OFlag::O_RDONLY)?;
        arena.fill(offset, at.len, |buf| f.read_exact_at(buf, at.offset))
    }

    /// Removes a segment no object lives in any more (one already gone with
    /// its directory is no error).
    pub fn remove(&self, segment: u64) {
        match self.unlink(segment) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(segment, error = %e, "could not remove a spill segment"),
        }
    }
}

impl Drop for SpillDir {
    /// Removes the segments and the directory, through the descriptors.
    fn drop(&mut self) {
        let inner = self.inner();
        let dir = inner.place.fd.as_raw_fd();
        if let Ok(entries) = std::fs::read_dir(format!("/proc/self/fd/{dir}")) {
            for e in entries.flatten() {
                let _ = nix::unistd::unlinkat(
                    Some(dir),
                    e.file_name().as_os_str(),
                    nix::unistd::UnlinkatFlags::NoRemoveDir,
                );
            }
        }
        let _ = nix::unistd::unlinkat(
            Some(inner.parent_fd.as_raw_fd()),
            inner.place.name.as_str(),
            nix::unistd::UnlinkatFlags::RemoveDir,
        );
    }
}

/// Opens `--spill-dir` once, and refuses one that other users could tamper
/// with: it must be a directory owned by this user or root, and not
/// writable by others unless sticky (as `/tmp` is, where nobody may rename
/// another's entries). The checks are made on the opened directory itself.
fn open_parent(parent: &Path) -> Result<OwnedFd, DaemonError> {
    let raw = nix::fcntl::open(
        parent,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        nix::errno::Errno::ENOTDIR => DaemonError::BadConfig(format!(
            "--spill-dir {} is not a directory",
            parent.display()
        )),
        e => DaemonError::io(
            format!(
                "using --spill-dir {}: create the directory first",
                parent.display()
            ),
            e,
        ),
    })?;
    // Safety: `open` returned a new descriptor that nothing else owns.
    let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    let st = nix::sys::stat::fstat(fd.as_raw_fd())
        .map_err(|e| DaemonError::io(format!("using --spill-dir {}", parent.display()), e))?;
    let me = nix::unistd::geteuid().as_raw();
    let mode = st.st_mode & 0o7777;
    if st.st_uid != me && st.st_uid != 0 {
        return Err(DaemonError::BadConfig(format!(
            "--spill-dir {} belongs to uid {}, not to this user ({me}) or root: \
             another user could remove or replace the store's files; use a directory of your own",
            parent.display(),
            st.st_uid
        )));
    }
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(DaemonError::BadConfig(format!(
            "--spill-dir {} is writable by other users (mode {mode:o}) and not sticky: they could \
             rename the store's files away; chmod go-w it, or use a directory of your own",
            parent.display()
        )));
    }
    Ok(fd)
}

/// Makes a new private subdirectory in `parent_fd` (0700, a name nobody
/// can guess, created only if nothing is there) and opens it without
/// following links; checks that it is this user's and private.
fn make_private(parent: &Path, parent_fd: &OwnedFd) -> Result<Place, DaemonError> {
    let pid = std::process::id();
    let mut last = None;
    for _ in 0..16 {
        let name = format!("ferroplasma-spill-{pid}-{:016x}", random_u64());
        let path = parent.join(&name);
        match nix::sys::stat::mkdirat(
            Some(parent_fd.as_raw_fd()),
            name.as_str(),
            Mode::from_bits_truncate(0o700),
        ) {
            Ok(()) => return open_private(parent_fd, path, name),
            Err(nix::errno::Errno::EEXIST) => last = Some(nix::errno::Errno::EEXIST),
            Err(e) => {
                return Err(DaemonError::io(
                    format!("creating spill directory {}", path.display()),
                    e,
                ))
            }
        }
    }
    Err(DaemonError::io(
        format!("creating a spill directory in {}", parent.display()),
        last.map_or_else(|| std::io::Error::other("every name was taken"), Into::into),
    ))
}

fn open_private(parent_fd: &OwnedFd, path: PathBuf, name: String) -> Result<Place, DaemonError> {
    let what = || format!("opening spill directory {}", path.display());
    let raw = openat(
        Some(parent_fd.as_raw_fd()),
        name.as_str(),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| DaemonError::io(what(), e))?;
    // Safety: `openat` returned a new descriptor that nothing else owns.
    let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    let st = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(|e| DaemonError::io(what(), e))?;
    let me = nix::unistd::geteuid().as_raw();
    if st.st_uid != me || st.st_mode & 0o077 != 0 {
        return Err(DaemonError::BadConfig(format!(
            "spill directory {} is not private (owner {}, mode {:o}); refusing to use it",
            path.display(),
            st.st_uid,
            st.st_mode & 0o7777
        )));
    }
    Ok(Place { path, name, fd })
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        return fastrand::u64(..);
    }
    u64::from_le_bytes(b)
}

#[cfg(test)]
#[path = "spill_tests.rs"]
mod tests;
