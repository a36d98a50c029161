//! [`AlignedMap`]: a shared mapping placed at a 2 MiB boundary, so that the
//! kernel can map it in 2 MiB pages, and asked for them (`MADV_COLLAPSE`).
//!
//! Why: a batched get of random objects among millions touches the object
//! table and this client's holds at a random page each, and with 4 KiB pages
//! each of those costs a TLB miss (a page walk, which a virtual machine does
//! twice over). Linux maps shared memory in 2 MiB pages only where the
//! mapping's address and the file's offset agree modulo 2 MiB, and, where
//! `/sys/kernel/mm/transparent_hugepage/shmem_enabled` is `never` (the
//! default), only after `MADV_COLLAPSE` (Linux 6.1) has put the memory in
//! 2 MiB pages. Neither `memmap2` nor the kernel's own choice of address
//! places a mapping at such a boundary, hence this type.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

/// A huge page on x86_64 and aarch64 (with 4 KiB base pages).
pub const HUGE_PAGE: usize = 2 << 20;

/// A shared mapping of a file from offset 0, at a 2 MiB-aligned address when
/// it is at least that long.
#[derive(Debug)]
pub struct AlignedMap {
    ptr: NonNull<u8>,
    len: usize,
}

// Safety: the mapping is plain memory owned by this value until it is
// dropped; what is stored there is shared through atomics by its users, as
// with `memmap2::MmapRaw`, which is `Send` and `Sync` too.
unsafe impl Send for AlignedMap {}
// Safety: as above: `&AlignedMap` hands out only raw pointers.
unsafe impl Sync for AlignedMap {}

impl AlignedMap {
    /// Maps the first `len` bytes of `fd`, read-only or read-write.
    pub fn map(fd: BorrowedFd<'_>, len: usize, writable: bool) -> io::Result<Self> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an empty mapping",
            ));
        }
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        let (at, flags) = if len >= HUGE_PAGE {
            (reserve_aligned(len)?, libc::MAP_SHARED | libc::MAP_FIXED)
        } else {
            (std::ptr::null_mut(), libc::MAP_SHARED)
        };
        // Safety: either the kernel chooses the address, or `at` is the start
        // of `len` bytes this function reserved (`reserve_aligned`), which
        // nothing else uses: MAP_FIXED replaces only that reservation.
        let p = unsafe { libc::mmap(at, len, prot, flags, fd.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            if !at.is_null() {
                // Safety: the reservation made above, unused.
                unsafe { libc::munmap(at, len) };
            }
            return Err(e);
        }
        let ptr = NonNull::new(p as *mut u8).ok_or_else(|| io::Error::other("mapped at 0"))?;
        Ok(Self { ptr, len })
    }

    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never: an empty mapping is refused by [`map`](Self::map).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Backs `[at, at + n)` now (`MADV_POPULATE_WRITE` if `write`, which
    /// allocates the pages, else `MADV_POPULATE_READ`), so that later
    /// touches take no page fault. Linux 5.14 and later.
    pub fn populate(&self, at: usize, n: usize, write: bool) -> io::Result<()> {
        let advice = if write {
            libc::MADV_POPULATE_WRITE
        } else {
            libc::MADV_POPULATE_READ
        };
        self.advise(at, n, advice)
    }

    /// Puts `[at, at + n)` (whole 2 MiB pages of it) in 2 MiB pages
    /// (`MADV_COLLAPSE`, Linux 6.1): the memory is copied into huge pages
    /// that every process mapping it at a 2 MiB boundary then maps as such.
    /// What was written stays; writers and readers elsewhere wait out the
    /// copy of the page they touch. Only pages already backed are kept in
    /// place: call [`populate`](Self::populate) first.
    pub fn collapse(&self, at: usize, n: usize) -> io::Result<()> {
        #[cfg(target_env = "gnu")]
        let advice = libc::MADV_COLLAPSE;
        #[cfg(not(target_env = "gnu"))]
        let advice = 25; // the Linux value; libc names it for glibc only
        self.advise(at, n, advice)
    }

    /// Bytes of this mapping this process maps in 2 MiB pages now
    /// (`ShmemPmdMapped` in `/proc/self/smaps`; 0 if it cannot be read).
    pub fn huge_bytes(&self) -> u64 {
        let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
            return 0;
        };
        let start = format!("{:x}-", self.as_ptr() as usize);
        let lines = smaps.lines().skip_while(|l| !l.starts_with(&start)).skip(1);
        lines
            // This mapping's fields, up to the next mapping's line.
            .take_while(|l| {
                l.split_whitespace()
                    .next()
                    .is_some_and(|k| k.ends_with(':'))
            })
            .find(|l| l.starts_with("ShmemPmdMapped:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }

    fn advise(&self, at: usize, n: usize, advice: libc::c_int) -> io::Result<()> {
        let end = at.checked_add(n).filter(|&e| e <= self.len);
        if end.is_none() || n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "outside the mapping",
            ));
        }
        // The kernel wants a page-aligned start.
        let start = at & !4095;
        // Safety: `[start, at + n)` lies inside this mapping (checked above;
        // `start` rounds down within it), and these advices change how the
        // memory is backed, never what it holds.
        let r = unsafe { libc::madvise(self.as_ptr().add(start).cast(), at + n - start, advice) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl Drop for AlignedMap {
    fn drop(&mut self) {
        // Safety: the mapping made in `map`, `len` bytes, unmapped once;
        // nothing borrows it beyond `self` (its users hold the value).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Whether this kernel puts shared memory in 2 MiB pages when asked
/// (`MADV_COLLAPSE`: Linux 6.1 and later, where huge pages are not denied).
pub fn kernel_collapses() -> bool {
    let Ok(fd) = nix::sys::memfd::memfd_create(
        c"ferroplasma-probe",
        nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
    ) else {
        return false;
    };
    let f = std::fs::File::from(fd);
    if f.set_len(HUGE_PAGE as u64).is_err() {
        return false;
    }
    let Ok(m) = AlignedMap::map(std::os::fd::AsFd::as_fd(&f), HUGE_PAGE, true) else {
        return false;
    };
    m.populate(0, 4096, true).is_ok() && m.collapse(0, HUGE_PAGE).is_ok()
}

/// Reserves `len` bytes of address space at a 2 MiB boundary (inaccessible,
/// no memory behind it) and returns its start.
fn reserve_aligned(len: usize) -> io::Result<*mut libc::c_void> {
    let span = len
        .checked_add(HUGE_PAGE)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "too long to map"))?;
    // Safety: a fresh anonymous reservation at an address the kernel picks.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let base = p as usize;
    let start = base.next_multiple_of(HUGE_PAGE);
    // Safety: the head and tail cut here lie inside the reservation just
    // made (`start - base < HUGE_PAGE`, `start + len <= base + span`).
    unsafe {
        if start > base {
            libc::munmap(p, start - base);
        }
        let tail = base + span - (start + len);
        if tail > 0 {
            libc::munmap((start + len) as *mut libc::c_void, tail);
        }
    }
    Ok(start as *mut libc::c_void)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    fn memfd(len: usize) -> std::fs::File {
        let fd = nix::sys::memfd::memfd_create(
            c"aligned-map-test",
            nix::sys::memfd::MemFdCreateFlag::empty(),
        )
        .expect("memfd");
        let f = std::fs::File::from(fd);
        f.set_len(len as u64).expect("size");
        f
    }

    #[test]
    fn a_long_mapping_starts_at_a_2_mib_boundary_and_shares_the_files_bytes() {
        let len = 3 * HUGE_PAGE + 4096;
        let mut f = memfd(len);
        f.write_all(b"hello").unwrap();
        let m = AlignedMap::map(f.as_fd(), len, true).unwrap();
        assert_eq!(m.as_ptr() as usize % HUGE_PAGE, 0);
        assert_eq!(m.len(), len);
        // Safety: inside the mapping.
        let got = unsafe { std::slice::from_raw_parts(m.as_ptr(), 5) };
        assert_eq!(got, b"hello");
        // Safety: inside the writable mapping; the file sees it.
        unsafe { m.as_ptr().add(len - 1).write(9) };
        let ro = AlignedMap::map(f.as_fd(), len, false).unwrap();
        // Safety: inside the mapping.
        assert_eq!(unsafe { ro.as_ptr().add(len - 1).read() }, 9);
    }

    #[test]
    fn a_short_mapping_is_placed_by_the_kernel() {
        let f = memfd(8192);
        let m = AlignedMap::map(f.as_fd(), 8192, false).unwrap();
        assert_eq!(m.as_ptr() as usize % 4096, 0);
        assert!(AlignedMap::map(f.as_fd(), 0, false).is_err());
    }

    #[test]
    fn populate_and_collapse_keep_the_bytes_and_refuse_ranges_outside() {
        let len = 2 * HUGE_PAGE;
        let f = memfd(len);
        let m = AlignedMap::map(f.as_fd(), len, true).unwrap();
        m.populate(0, len, true).unwrap();
        // Safety: inside the writable mapping.
        unsafe { m.as_ptr().add(HUGE_PAGE + 77).write(5) };
        // Refused by kernels before 6.1 and where huge pages are denied:
        // the bytes must stay either way.
        let _ = m.collapse(0, len);
        // Safety: inside the mapping.
        assert_eq!(unsafe { m.as_ptr().add(HUGE_PAGE + 77).read() }, 5);
        assert!(m.populate(len - 4096, 8192, false).is_err());
        assert!(m.collapse(len, 1).is_err());
    }
}
