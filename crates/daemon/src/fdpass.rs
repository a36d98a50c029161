//! Sending file descriptors with a message (SCM_RIGHTS) on a tokio socket.

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use std::io::IoSlice;
use std::os::fd::{AsRawFd, RawFd};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::UnixStream;

/// Writes `bytes` with `fds` attached to their first byte.
pub async fn send_with_fds(
    stream: &mut UnixStream,
    bytes: &[u8],
    fds: &[RawFd],
) -> std::io::Result<()> {
    let sent = loop {
        stream.writable().await?;
        let res = stream.try_io(Interest::WRITABLE, || {
            let iov = [IoSlice::new(bytes)];
            let cmsg = [ControlMessage::ScmRights(fds)];
            sendmsg::<()>(
                stream.as_raw_fd(),
                &iov,
                &cmsg,
                MsgFlags::MSG_NOSIGNAL,
                None,
            )
            .map_err(std::io::Error::from)
        });
        match res {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    };
    // The descriptors went with the first byte; the rest is plain data.
    stream.write_all(&bytes[sent..]).await
}
