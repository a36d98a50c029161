//! Gather sends and scatter receives on a connected stream socket.
//!
//! A send hands the kernel every buffer of a frame in one `sendmsg` (at
//! most `IOV_MAX` at a time), with no copy into a contiguous buffer first.
//! A receive reads the stream straight into the places the caller chose,
//! which may be memory not yet initialized: the kernel writes it through
//! raw `iovec`s, and no Rust reference to it exists until it is filled.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;
use nix::sys::socket::{sendmsg, MsgFlags};

/// Linux's `IOV_MAX`: at most this many buffers per call.
pub const IOV_MAX: usize = 1024;

/// Sends every byte of `parts`, in order (`MSG_NOSIGNAL`: a closed peer is
/// an `EPIPE` error, never a signal).
pub fn send_all(fd: BorrowedFd<'_>, parts: &[&[u8]]) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| IoSlice::new(p))
        .collect();
    let mut rest: &mut [IoSlice<'_>] = &mut slices;
    while !rest.is_empty() {
        let n = rest.len().min(IOV_MAX);
        let sent = match sendmsg::<()>(
            fd.as_raw_fd(),
            &rest[..n],
            &[],
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(sent) => sent,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        if sent == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut rest, sent);
    }
    Ok(())
}

/// A place to receive into: `len` writable bytes at `ptr`.
#[derive(Debug, Clone, Copy)]
pub struct Place {
    pub ptr: *mut u8,
    pub len: usize,
}

/// Fills every place completely, in order, from the stream; the peer
/// closing first is an `UnexpectedEof` error.
///
/// # Safety
/// Each place must be `len` bytes the caller may write, valid for the whole
/// call, and no other reference to them may be used meanwhile.
pub unsafe fn recv_places(fd: BorrowedFd<'_>, places: &[Place]) -> io::Result<()> {
    let mut iov: Vec<libc::iovec> = places
        .iter()
        .filter(|p| p.len > 0)
        .map(|p| libc::iovec {
            iov_base: p.ptr.cast(),
            iov_len: p.len,
        })
        .collect();
    let mut at = 0;
    while at < iov.len() {
        let n = (iov.len() - at).min(IOV_MAX);
        // Safety: `iov[at..at + n]` describe writable memory the caller
        // vouched for (and what is left of it after earlier reads).
        let got = unsafe { libc::readv(fd.as_raw_fd(), iov[at..].as_ptr(), n as libc::c_int) };
        if got < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if got == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the connection",
            ));
        }
        let mut got = got as usize;
        while got > 0 {
            let v = &mut iov[at];
            if got >= v.iov_len {
                got -= v.iov_len;
                at += 1;
            } else {
                // Safety: `got` < `iov_len`, so the new base stays inside
                // the same place.
                v.iov_base = unsafe { v.iov_base.cast::<u8>().add(got) }.cast();
                v.iov_len -= got;
                got = 0;
            }
        }
    }
    Ok(())
}

/// Fills `buf` from the stream.
pub fn recv_exact(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<()> {
    let place = Place {
        ptr: buf.as_mut_ptr(),
        len: buf.len(),
    };
    // Safety: `buf` is writable for the call and borrowed mutably by it.
    unsafe { recv_places(fd, &[place]) }
}

/// Reads and drops `n` bytes of the stream.
pub fn skip(fd: BorrowedFd<'_>, mut n: u64) -> io::Result<()> {
    let mut scratch = vec![0u8; n.min(1 << 20) as usize];
    while n > 0 {
        let k = n.min(scratch.len() as u64) as usize;
        recv_exact(fd, &mut scratch[..k])?;
        n -= k as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn thousands_of_parts_arrive_in_order() {
        let (a, b) = UnixStream::pair().unwrap();
        let parts: Vec<Vec<u8>> = (0..3000u32).map(|i| i.to_le_bytes().repeat(3)).collect();
        let sender = std::thread::spawn(move || {
            let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
            send_all(a.as_fd(), &refs).unwrap();
        });
        let mut got = vec![0u8; 3000 * 12];
        let places: Vec<Place> = got
            .chunks_mut(12)
            .map(|c| Place {
                ptr: c.as_mut_ptr(),
                len: 12,
            })
            .collect();
        // Safety: each place is a distinct chunk of `got`, unused meanwhile.
        unsafe { recv_places(b.as_fd(), &places) }.unwrap();
        sender.join().unwrap();
        for (i, c) in got.chunks(12).enumerate() {
            assert_eq!(c, (i as u32).to_le_bytes().repeat(3));
        }
    }

    #[test]
    fn a_peer_closing_early_is_an_error() {
        let (a, b) = UnixStream::pair().unwrap();
        send_all(a.as_fd(), &[b"abc"]).unwrap();
        drop(a);
        let mut buf = [0u8; 8];
        let e = recv_exact(b.as_fd(), &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }
}
