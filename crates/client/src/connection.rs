//! One socket to the store: the handshake (receiving the arena descriptors)
//! and blocking request/reply exchanges.

use crate::error::{ClientError, Result};
use ferroplasma_protocol::frame::{frame_len, write_message, HEADER_LEN, MAX_REPLY_FRAME};
use ferroplasma_protocol::pb::{self, reply, request};
use ferroplasma_protocol::PROTOCOL_VERSION;
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use prost::Message;
use std::io::{IoSliceMut, Read};

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// A connected, handshaken socket.
#[derive(Debug)]
pub(crate) struct Conn {
    pub stream: UnixStream,
    /// Bytes read from the socket and not yet parsed.
    inbuf: Vec<u8>,
    /// Where the unparsed bytes in `inbuf` start and end.
    inpos: usize,
    inend: usize,
}

/// What the handshake returns.
#[derive(Debug)]
pub(crate) struct Handshake {
    pub conn: Conn,
    pub reply: pb::ConnectReply,
    pub fds: Vec<OwnedFd>,
}

impl Conn {
    /// Connects and handshakes; receives the arena descriptors.
    pub fn open(path: &Path, name: &str) -> Result<Handshake> {
        let stream = UnixStream::connect(path).map_err(|cause| ClientError::StoreUnavailable {
            path: path.to_path_buf(),
            cause,
        })?;
        let mut conn = Conn {
            stream,
            inbuf: vec![0; 64 * 1024],
            inpos: 0,
            inend: 0,
        };
        let req = pb::Request {
            request_id: 0,
            body: Some(request::Body::Connect(pb::Connect {
                protocol_version: PROTOCOL_VERSION,
                client_name: name.to_string(),
            })),
        };
        write_message(&mut conn.stream, &req)?;
        let (body, fds) = recv_frame_with_fds(&conn.stream)?;
        let reply = pb::Reply::decode(body.as_slice())
            .map_err(|e| ClientError::Protocol(format!("bad handshake reply: {e}")))?;
        match reply.body {
            Some(reply::Body::Connect(c)) => Ok(Handshake {
                conn,
                reply: c,
                fds,
            }),
            Some(reply::Body::Error(e)) => Err(e.into()),
            other => Err(ClientError::Protocol(format!(
                "expected a Connect reply, got {other:?}"
            ))),
        }
    }
}

impl Conn {
    /// Reads the next reply, with as few reads as the kernel allows (usually
    /// one: header and body arrive together). `inbuf[inpos..inend]` holds
    /// bytes read and not yet parsed; the buffer is zeroed only when it grows.
    pub fn read_reply(&mut self) -> Result<pb::Reply> {
        loop {
            let avail = &self.inbuf[self.inpos..self.inend];
            let mut need = HEADER_LEN;
            if avail.len() >= HEADER_LEN {
                let len = frame_len(avail[..HEADER_LEN].try_into().expect("4"), MAX_REPLY_FRAME)?;
                need = HEADER_LEN + len;
                if avail.len() >= need {
                    let reply = pb::Reply::decode(&avail[HEADER_LEN..need])
                        .map_err(|e| ClientError::Protocol(format!("undecodable reply: {e}")))?;
                    self.inpos += need;
                    if self.inpos == self.inend {
                        self.inpos = 0;
                        self.inend = 0;
                    }
                    return Ok(reply);
                }
            }
            // Make room for the rest of this frame at the end of the buffer.
            if self.inpos > 0 {
                self.inbuf.copy_within(self.inpos..self.inend, 0);
                self.inend -= self.inpos;
                self.inpos = 0;
            }
            if self.inbuf.len() < need {
                self.inbuf.resize(need.next_power_of_two(), 0);
            }
            let n = self
                .stream
                .read(&mut self.inbuf[self.inend..])
                .map_err(ClientError::Disconnected)?;
            if n == 0 {
                return Err(ClientError::Disconnected(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the store closed the connection",
                )));
            }
            self.inend += n;
        }
    }
}

/// Receives one whole frame, collecting any descriptors sent with it.
fn recv_frame_with_fds(stream: &UnixStream) -> Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut fds = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 4096];
    loop {
        if buf.len() >= HEADER_LEN {
            let len = frame_len(buf[..HEADER_LEN].try_into().expect("4"), MAX_REPLY_FRAME)?;
            if buf.len() >= HEADER_LEN + len {
                buf.drain(..HEADER_LEN);
                return Ok((buf, fds));
            }
        }
        let mut cmsg = nix::cmsg_space!([RawFd; 8]);
        let mut iov = [IoSliceMut::new(&mut chunk)];
        let msg = recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| ClientError::Disconnected(e.into()))?;
        let n = msg.bytes;
        for c in msg
            .cmsgs()
            .map_err(|e| ClientError::Disconnected(e.into()))?
        {
            if let ControlMessageOwned::ScmRights(raw) = c {
                for fd in raw {
                    // Safety: the kernel just installed this descriptor in our
                    // table for us (SCM_RIGHTS); nothing else owns it.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        if n == 0 {
            return Err(ClientError::Disconnected(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the store closed the connection during the handshake",
            )));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}
