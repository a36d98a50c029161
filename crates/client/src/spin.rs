//! Waiting for a reply by looking at the socket for a few tens of
//! microseconds before blocking on it.
//!
//! A thread that blocks and is woken again costs far more than the store
//! takes to answer a short request: on a virtual machine, each side's
//! wake-up from idle is a trip through the hypervisor (a 1-byte round trip
//! over a Unix socket between two processes on this project's 2-core VM:
//! 70 µs when both sides block, 27–29 µs when one side polls, 5 µs when
//! both do). So for requests the store answers at once (everything but a
//! get or a create that may wait), the client polls the socket with
//! non-blocking peeks for up to `FERROPLASMA_SPIN_US` microseconds (50 by
//! default, 0 turns it off, at most 10,000), yielding the CPU to any other
//! thread that wants it between looks, before it blocks; the store
//! does the same on its side (`ferroplasma store --spin-us`). A reply that
//! takes longer than the window costs the window's CPU time and nothing
//! else.

use nix::errno::Errno;
use nix::sys::socket::{recv, MsgFlags};
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The environment variable that sets the window, in microseconds.
pub const SPIN_ENV: &str = "FERROPLASMA_SPIN_US";
/// The window when the variable is unset or not a number.
pub const DEFAULT_SPIN_US: u64 = 50;
/// The longest window honoured (larger values are cut to it).
pub const MAX_SPIN_US: u64 = 10_000;

/// The window of this process, read from [`SPIN_ENV`] once.
pub(crate) fn configured() -> Duration {
    static WINDOW: OnceLock<Duration> = OnceLock::new();
    *WINDOW.get_or_init(|| window_of(std::env::var(SPIN_ENV).ok().as_deref()))
}

/// The window a value of [`SPIN_ENV`] asks for.
fn window_of(value: Option<&str>) -> Duration {
    let us = value
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(DEFAULT_SPIN_US)
        .min(MAX_SPIN_US);
    Duration::from_micros(us)
}

/// Looks at `socket` until it has bytes to read or has ended, for at most
/// `window`; the read that follows then does not block (or blocks, when
/// the window passed first). A signal that interrupts a look is reported
/// as [`std::io::ErrorKind::Interrupted`], as a blocking read reports it.
pub(crate) fn until_readable(socket: &impl AsRawFd, window: Duration) -> std::io::Result<()> {
    let deadline = Instant::now() + window;
    let mut byte = [0u8; 1];
    loop {
        match recv(
            socket.as_raw_fd(),
            &mut byte,
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_PEEK,
        ) {
            Err(Errno::EAGAIN) => {}
            Err(Errno::EINTR) => return Err(std::io::ErrorKind::Interrupted.into()),
            // Bytes, the end of the stream, or an error the read reports.
            _ => return Ok(()),
        }
        if Instant::now() >= deadline {
            return Ok(());
        }
        // Runnable, so the CPU does not halt, but any other thread that
        // wants it gets it first: on a busy machine the look costs others
        // nothing.
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    #[test]
    fn the_window_comes_from_the_variable_within_bounds() {
        assert_eq!(window_of(None), Duration::from_micros(DEFAULT_SPIN_US));
        assert_eq!(window_of(Some("0")), Duration::ZERO);
        assert_eq!(window_of(Some(" 120 ")), Duration::from_micros(120));
        assert_eq!(
            window_of(Some("-1")),
            Duration::from_micros(DEFAULT_SPIN_US)
        );
        assert_eq!(
            window_of(Some("lots")),
            Duration::from_micros(DEFAULT_SPIN_US)
        );
        assert_eq!(
            window_of(Some("99999999999999999999999")),
            Duration::from_micros(DEFAULT_SPIN_US)
        );
        assert_eq!(
            window_of(Some(&u64::MAX.to_string())),
            Duration::from_micros(MAX_SPIN_US)
        );
    }

    #[test]
    fn a_look_returns_when_bytes_arrive_the_peer_closes_or_the_window_passes() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let t = Instant::now();
        until_readable(&b, Duration::from_millis(20)).unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(20),
            "nothing came: the whole window"
        );
        a.write_all(b"x").unwrap();
        let t = Instant::now();
        until_readable(&b, Duration::from_secs(10)).unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "bytes waiting: at once"
        );
        let mut byte = [0u8; 1];
        std::io::Read::read_exact(&mut &b, &mut byte).unwrap();
        assert_eq!(&byte, b"x", "a look takes nothing from the stream");
        drop(a);
        let t = Instant::now();
        until_readable(&b, Duration::from_secs(10)).unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the end of the stream: at once"
        );
    }
}
