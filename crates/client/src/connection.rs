//! One socket to the store: the handshake (receiving the arena descriptors)
//! and blocking request/reply exchanges.

use crate::error::{ClientError, Result};
use ferroplasma_protocol::frame::{frame_len, write_message, HEADER_LEN, MAX_REPLY_FRAME};
use ferroplasma_protocol::pb::{self, reply, request};
use ferroplasma_protocol::PROTOCOL_VERSION;
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use prost::Message;
use std::io::{IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// A connected, handshaken socket.
#[derive(Debug)]
pub(crate) struct Conn {
    pub stream: UnixStream,
    next_id: u64,
    /// Encoded frames waiting to go out with the next write.
    pub outbuf: Vec<u8>,
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
        let stream = UnixStream::connect(path).map_err(|source| ClientError::StoreUnavailable {
            path: path.to_path_buf(),
            source,
        })?;
        let mut conn = Conn {
            stream,
            next_id: 1,
            outbuf: Vec::new(),
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

    /// Queues a request (after whatever is already queued); returns its id.
    pub fn queue(&mut self, body: request::Body) -> u64 {
        let request_id = self.next_id;
        self.next_id += 1;
        let req = pb::Request {
            request_id,
            body: Some(body),
        };
        self.outbuf
            .extend_from_slice(&(req.encoded_len() as u32).to_le_bytes());
        req.encode(&mut self.outbuf).expect("Vec grows");
        request_id
    }

    /// Writes everything queued in one call.
    pub fn flush(&mut self) -> Result<()> {
        if !self.outbuf.is_empty() {
            let r = self.stream.write_all(&self.outbuf);
            self.outbuf.clear();
            r.map_err(ClientError::Disconnected)?;
        }
        Ok(())
    }

    /// Sends `body` and waits for its reply (an error reply becomes `Err`).
    pub fn call(&mut self, body: request::Body) -> Result<reply::Body> {
        let id = self.queue(body);
        self.flush()?;
        loop {
            let mut header = [0u8; HEADER_LEN];
            self.stream
                .read_exact(&mut header)
                .map_err(ClientError::Disconnected)?;
            let len = frame_len(header, MAX_REPLY_FRAME)?;
            let mut body = vec![0u8; len];
            self.stream
                .read_exact(&mut body)
                .map_err(ClientError::Disconnected)?;
            let reply = pb::Reply::decode(body.as_slice())
                .map_err(|e| ClientError::Protocol(format!("undecodable reply: {e}")))?;
            if reply.request_id != id {
                // Stray frames (request 0: an error about an earlier frame).
                if let Some(reply::Body::Error(e)) = reply.body {
                    return Err(e.into());
                }
                continue;
            }
            return match reply.body {
                Some(reply::Body::Error(e)) => Err(e.into()),
                Some(b) => Ok(b),
                None => Err(ClientError::Protocol("empty reply".into())),
            };
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
