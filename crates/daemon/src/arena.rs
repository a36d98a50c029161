//! The shared-memory arena: one file (an anonymous memfd, or an unlinked file
//! in a tmpfs/hugetlbfs directory) mapped once by the store and once by each
//! client, which receives its descriptor over the socket.

use crate::DaemonError;
use memmap2::MmapRaw;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

/// Size of a huge page (the default on x86_64).
pub const HUGE_PAGE: u64 = 2 << 20;

/// A mapped, shareable region of memory.
#[derive(Debug)]
pub struct Arena {
    file: File,
    map: MmapRaw,
    size: u64,
}

impl Arena {
    /// Creates an arena of `size` bytes (rounded up to the page size in use).
    pub fn create(size: u64, dir: Option<&Path>, hugepages: bool) -> Result<Self, DaemonError> {
        let page = if hugepages { HUGE_PAGE } else { 4096 };
        let size = size.div_ceil(page) * page;
        let file = match dir {
            None => memfd(hugepages, false)?,
            Some(d) => unlinked_file_in(d)?,
        };
        let arena = Self::map(file, size, hugepages)?;
        if !hugepages {
            ask_for_transparent_huge_pages(&arena.map);
        }
        Ok(arena)
    }

    /// A memfd of `size` bytes that only the store can write, however a
    /// client reopens the descriptor it was given (`/proc/self/fd/N`): once
    /// it is mapped here, the kernel refuses new writable mappings and
    /// writes of it (`F_SEAL_FUTURE_WRITE`), and no seal can be added or
    /// removed (`F_SEAL_SEAL`). For the object table clients read.
    pub fn create_store_writable(size: u64) -> Result<Self, DaemonError> {
        Self::create_sealed(size, nix::fcntl::SealFlag::F_SEAL_FUTURE_WRITE)
    }

    /// A memfd of `size` bytes that a client may write but never resize:
    /// the store maps it too, and a client that truncated it would make the
    /// store's next read of it fault (SIGBUS). For a client's holds region.
    pub fn create_fixed_size(size: u64) -> Result<Self, DaemonError> {
        Self::create_sealed(size, nix::fcntl::SealFlag::empty())
    }

    /// A memfd mapped here, then sealed against resizing, against further
    /// seals, and with `extra`.
    fn create_sealed(size: u64, extra: nix::fcntl::SealFlag) -> Result<Self, DaemonError> {
        use nix::fcntl::{fcntl, FcntlArg, SealFlag};
        let size = size.div_ceil(4096) * 4096;
        let arena = Self::map(memfd(false, true)?, size, false)?;
        // Before the seals: a writable mapping is refused after them.
        back_with_huge_pages(&arena.file, size);
        let seals = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL | extra;
        fcntl(arena.file.as_raw_fd(), FcntlArg::F_ADD_SEALS(seals)).map_err(|e| {
            DaemonError::arena(
                "sealing shared memory (needs Linux 5.1 or later)",
                std::io::Error::from(e),
            )
        })?;
        Ok(arena)
    }

    fn map(file: File, size: u64, hugepages: bool) -> Result<Self, DaemonError> {
        file.set_len(size)
            .map_err(|e| DaemonError::arena(format!("reserving {size} bytes"), e))?;
        let map = MmapRaw::map_raw(&file).map_err(|e| {
            let hint = if hugepages {
                " (are huge pages reserved? see /proc/sys/vm/nr_hugepages)"
            } else {
                ""
            };
            DaemonError::arena(format!("mapping {size} bytes{hint}"), e)
        })?;
        Ok(Self { file, map, size })
    }

    /// The file and its mapping, apart: a caller that hands the file to
    /// one client and keeps only the mapping holds no descriptor for it.
    pub fn into_parts(self) -> (File, MmapRaw) {
        (self.file, self.map)
    }

    /// Bytes in the arena.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The descriptor clients map.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// A second descriptor of the same memory (to send to a client).
    pub fn dup_fd(&self) -> Result<OwnedFd, DaemonError> {
        self.file
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| DaemonError::arena("duplicating a descriptor", e))
    }

    /// A descriptor of the same memory opened read-only: a client can map
    /// it, but the kernel refuses to map it writable.
    pub fn read_only_fd(&self) -> Result<OwnedFd, DaemonError> {
        let path = format!("/proc/self/fd/{}", self.file.as_raw_fd());
        std::fs::File::open(&path)
            .map(OwnedFd::from)
            .map_err(|e| DaemonError::arena(format!("reopening {path} read-only"), e))
    }

    /// The start of the mapping (for typed views of shared structures).
    pub fn ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// Copies `bytes` into the arena at `offset`.
    ///
    /// # Panics
    /// If the range lies outside the arena (the allocator never hands out
    /// such ranges, so this is a bug, not bad input).
    pub fn write(&self, offset: u64, bytes: &[u8]) {
        let end = offset
            .checked_add(bytes.len() as u64)
            .expect("offset overflow");
        assert!(end <= self.size, "write past the arena end");
        // Safety: the range [offset, end) lies inside the live mapping (checked
        // above), the source is a distinct Rust slice so the ranges cannot
        // overlap, and the store only writes to allocations no client can
        // see yet (before seal), so nobody reads these bytes concurrently.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.map.as_mut_ptr().add(offset as usize),
                bytes.len(),
            );
        }
    }

    /// The bytes of an allocation, for writing it out to a spill file.
    ///
    /// # Panics
    /// If the range lies outside the arena (a bug, as for [`Arena::write`]).
    pub fn bytes(&self, offset: u64, len: u64) -> &[u8] {
        let end = offset.checked_add(len).expect("offset overflow");
        assert!(end <= self.size, "read past the arena end");
        // Safety: the range lies inside the live mapping (checked above),
        // which outlives the returned borrow of `self`. The store only reads
        // sealed allocations this way; sealed bytes are immutable by the
        // protocol, so no client writes them while the slice lives.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(offset as usize), len as usize) }
    }

    /// Fills `len` bytes at `offset` with `fill` (restoring a spilled
    /// object into its new allocation).
    ///
    /// # Panics
    /// If the range lies outside the arena (a bug, as for [`Arena::write`]).
    pub fn fill<E>(
        &self,
        offset: u64,
        len: u64,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let end = offset.checked_add(len).expect("offset overflow");
        assert!(end <= self.size, "write past the arena end");
        // Safety: the range lies inside the live mapping (checked above) and
        // the slice does not outlive this call. It is a fresh allocation that
        // no client has been told about yet, so nobody else reads or writes
        // it while the slice exists.
        let buf = unsafe {
            std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(offset as usize), len as usize)
        };
        fill(buf)
    }

    /// The bytes of an allocation, writable, for receiving a pulled object
    /// from another cluster member straight into place.
    ///
    /// # Safety
    /// The caller must own the range exclusively while the slice lives: a
    /// fresh, unsealed allocation of its own that no client has been told
    /// about, with no other live slice over it.
    ///
    /// # Panics
    /// If the range lies outside the arena (a bug, as for [`Arena::write`]).
    #[allow(clippy::mut_from_ref)] // shared memory: exclusivity is the caller's promise
    pub unsafe fn region_mut(&self, offset: u64, len: u64) -> &mut [u8] {
        let end = offset.checked_add(len).expect("offset overflow");
        assert!(end <= self.size, "write past the arena end");
        // Safety: the range lies inside the live mapping (checked above),
        // which outlives the borrow of `self`; exclusivity is the caller's
        // promise (see above).
        unsafe {
            std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(offset as usize), len as usize)
        }
    }

    /// Makes the kernel allocate every page of the arena now (fallocate), so
    /// that a short filesystem fails the start with a clear error instead of
    /// a client dying of SIGBUS on a page of its object later.
    pub fn reserve(&self) -> Result<(), DaemonError> {
        nix::fcntl::fallocate(
            std::os::fd::AsRawFd::as_raw_fd(&self.file),
            nix::fcntl::FallocateFlags::empty(),
            0,
            self.size as i64,
        )
        .map_err(|e| {
            DaemonError::arena(
                format!(
                    "reserving all {} bytes of the arena (--prefault)",
                    self.size
                ),
                std::io::Error::from(e),
            )
        })
    }

    /// Whether the arena lies in huge pages (a `--hugepages` memfd or a
    /// hugetlbfs `--dir`): their pages are reserved up front, and giving
    /// them back would give up the reservation (a later write could then
    /// find no page, SIGBUS), so the store keeps them.
    pub fn is_hugetlb(&self) -> bool {
        nix::sys::statfs::fstatfs(&self.file)
            .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::HUGETLBFS_MAGIC)
    }

    /// Gives the pages of `[offset, offset + len)` back to the kernel (the
    /// range reads as zeros afterwards, and is backed again when written):
    /// for free ranges of the arena, once objects were deleted, so that the
    /// store's memory falls with its contents. Only whole 2 MiB blocks
    /// inside the range are given back (a huge page's size, and few calls).
    pub fn give_back(&self, offset: u64, len: u64) -> Result<u64, DaemonError> {
        use nix::fcntl::{fallocate, FallocateFlags};
        const BLOCK: u64 = 2 << 20;
        let start = offset.div_ceil(BLOCK) * BLOCK;
        let end = (offset + len).min(self.size) / BLOCK * BLOCK;
        if end <= start {
            return Ok(0);
        }
        fallocate(
            self.file.as_raw_fd(),
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            start as i64,
            (end - start) as i64,
        )
        .map_err(|e| DaemonError::io("giving free memory back", std::io::Error::from(e)))?;
        Ok(end - start)
    }

    /// Touches every page so the kernel backs the whole arena now.
    pub fn prefault(&self) {
        let base = self.map.as_mut_ptr();
        let mut off = 0u64;
        while off < self.size {
            // Safety: `off < size`, so the byte is inside the live mapping;
            // no object exists yet at start, so nobody else uses the memory.
            // A volatile read+write keeps the compiler from skipping it.
            unsafe {
                let p = base.add(off as usize);
                p.write_volatile(p.read_volatile());
            }
            off += 4096;
        }
    }
}

/// Backs a fresh memfd with 2 MiB pages (each whole 2 MiB of it), before
/// anyone else maps it: the object table and the holds regions, which
/// clients read at random places and map at 2 MiB boundaries
/// (`ferroplasma_client::aligned_map`), so that a read among millions of
/// objects costs no page walk of 4 KiB pages. `MADV_COLLAPSE` (Linux 6.1)
/// does it whatever `shmem_enabled` says; on an empty file it costs only
/// the allocation (one byte per 2 MiB is touched first: it collapses what
/// is there). Done here, it costs no one a wait: a client that collapses a
/// table in use copies it while its readers wait for each page. A kernel
/// that refuses leaves 4 KiB pages, as before.
fn back_with_huge_pages(file: &File, size: u64) {
    use ferroplasma_client::aligned_map::{AlignedMap, HUGE_PAGE};
    let whole = (size as usize) / HUGE_PAGE * HUGE_PAGE;
    if whole == 0 {
        return;
    }
    let m = match AlignedMap::map(file.as_fd(), whole, true) {
        Ok(m) => m,
        Err(e) => {
            tracing::debug!("mapping for 2 MiB pages failed: {e}");
            return;
        }
    };
    for at in (0..whole).step_by(HUGE_PAGE) {
        // Safety: `at < whole`, inside the writable mapping just made; the
        // file is new and no one else maps it yet, so nothing else reads
        // or writes this byte; writing a zero over a zero changes nothing.
        unsafe { m.as_ptr().add(at).write_volatile(0) };
    }
    if let Err(e) = m.collapse(0, whole) {
        tracing::debug!(bytes = whole, "2 MiB pages for shared memory refused: {e}");
    }
}

/// Where the kernel says whether shared memory may use transparent huge pages.
const SHMEM_THP: &str = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";

/// Asks for 2 MiB pages on the arena (`MADV_HUGEPAGE`; clients do the same
/// on their mappings). The kernel grants it when shared-memory transparent
/// huge pages are `advise`, `within_size` or `always`: a process reading a
/// large object then takes one page fault per 2 MiB instead of one per
/// 64 KiB, and reads a 100 MB object 2.5x faster the first time
/// (docs/benchmarks.md). With `never`, the store says how to turn it on.
fn ask_for_transparent_huge_pages(map: &MmapRaw) {
    if let Err(e) = map.advise(memmap2::Advice::HugePage) {
        tracing::debug!("madvise(MADV_HUGEPAGE) on the arena failed: {e}");
        return;
    }
    // Once, for the store's arena (the first one made): every client's
    // holds region is an arena too.
    static CHECKED: std::sync::Once = std::sync::Once::new();
    CHECKED.call_once(|| {
        let setting = std::fs::read_to_string(SHMEM_THP).unwrap_or_default();
        let chosen = setting.split(['[', ']']).nth(1).unwrap_or("");
        if matches!(chosen, "never" | "deny") {
            tracing::info!(
                "the kernel maps shared memory in 4 KiB pages ({SHMEM_THP} is {chosen}): \
                 first reads of large objects pay a page fault per 64 KiB; \
                 `echo advise > {SHMEM_THP}` lets the store use 2 MiB pages \
                 (docs/operations.md)"
            );
        }
    });
}

/// A memfd of mode 0600: another user cannot reopen the descriptor it was
/// given (`/proc/self/fd/N`) for writing (a memfd starts out 0777).
fn memfd(hugepages: bool, sealable: bool) -> Result<File, DaemonError> {
    use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
    let mut flags = MemFdCreateFlag::MFD_CLOEXEC;
    if hugepages {
        flags |= MemFdCreateFlag::MFD_HUGETLB;
    }
    if sealable {
        flags |= MemFdCreateFlag::MFD_ALLOW_SEALING;
    }
    let fd: OwnedFd = memfd_create(c"ferroplasma-arena", flags)
        .map_err(|e| DaemonError::arena("memfd_create", std::io::Error::from(e)))?;
    nix::sys::stat::fchmod(
        fd.as_raw_fd(),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .map_err(|e| DaemonError::arena("making the memfd private", std::io::Error::from(e)))?;
    Ok(File::from(fd))
}

fn unlinked_file_in(dir: &Path) -> Result<File, DaemonError> {
    use std::os::unix::fs::OpenOptionsExt;
    let id = ferroplasma_protocol::ObjectId::random().to_hex();
    let path = dir.join(format!(
        "ferroplasma-arena-{}-{}",
        std::process::id(),
        &id[..8]
    ));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| DaemonError::arena(format!("creating {}", path.display()), e))?;
    std::fs::remove_file(&path)
        .map_err(|e| DaemonError::arena(format!("unlinking {}", path.display()), e))?;
    Ok(file)
}
