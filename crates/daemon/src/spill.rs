//! The spill directory: segment files that hold objects moved out of
//! shared memory. The state machine decides what to spill and keeps the
//! books; this module only writes, reads and removes the files.
//!
//! Each store makes a private subdirectory (`ferroplasma-spill-<pid>`) and
//! removes it when it stops, so a crashed store's leftovers are recognisable
//! and never read back by another store.

use crate::arena::Arena;
use crate::DaemonError;
use ferroplasma_store::{SpillRef, SpillVictim};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The spill directory of one store.
#[derive(Debug)]
pub struct SpillDir {
    dir: PathBuf,
}

impl SpillDir {
    /// Creates the store's private subdirectory under `parent`.
    pub fn create(parent: &Path) -> Result<Self, DaemonError> {
        let dir = parent.join(format!("ferroplasma-spill-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| {
            DaemonError::io(format!("creating spill directory {}", dir.display()), e)
        })?;
        Ok(Self { dir })
    }

    /// The directory segment files go to.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn segment_path(&self, segment: u64) -> PathBuf {
        self.dir.join(format!("segment-{segment}.spill"))
    }

    /// Writes the victims' allocations from the arena into a new segment
    /// file, one after another; returns each one's offset in the file. On
    /// an error (a full disk) the partial file is removed.
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
        let path = self.segment_path(segment);
        let result = (|| {
            let file = File::create(&path)?;
            let total: u64 = victims.iter().map(|v| v.len).sum();
            let reserved = total == 0
                || nix::fcntl::fallocate(
                    std::os::fd::AsRawFd::as_raw_fd(&file),
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
        if result.is_err() {
            let _ = std::fs::remove_file(&path);
        }
        result
    }

    /// Reads a spilled allocation back into the arena at `offset`.
    pub fn read_into(&self, at: SpillRef, arena: &Arena, offset: u64) -> std::io::Result<()> {
        let f = File::open(self.segment_path(at.segment))?;
        arena.fill(offset, at.len, |buf| f.read_exact_at(buf, at.offset))
    }

    /// Removes a segment no object lives in any more.
    pub fn remove(&self, segment: u64) {
        if let Err(e) = std::fs::remove_file(self.segment_path(segment)) {
            tracing::warn!(segment, error = %e, "could not remove a spill segment");
        }
    }
}

impl Drop for SpillDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_written_without_a_flush_reads_back() {
        let parent = std::env::temp_dir().join(format!("fp-seg-{}", std::process::id()));
        std::fs::create_dir_all(&parent).unwrap();
        let dir = SpillDir::create(&parent).unwrap();
        let arena = Arena::create(1 << 20, None, false).unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        arena.write(4096, &data);
        let victims = [SpillVictim {
            id: ferroplasma_protocol::ObjectId::random(),
            offset: 4096,
            len: data.len() as u64,
        }];
        let offsets = dir.write_segment(9, &arena, &victims).unwrap();
        let meta = std::fs::metadata(dir.segment_path(9)).unwrap();
        assert_eq!(meta.len(), data.len() as u64, "exactly the reserved length");
        let at = SpillRef {
            segment: 9,
            offset: offsets[0],
            len: data.len() as u64,
        };
        dir.read_into(at, &arena, 600_000).unwrap();
        assert_eq!(arena.bytes(600_000, data.len() as u64), &data[..]);
        drop(dir);
        let _ = std::fs::remove_dir_all(&parent);
    }
}
