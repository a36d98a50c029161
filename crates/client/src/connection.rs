//! One socket to the store: the handshake (receiving the arena descriptors)
//! and reading frames through the protocol crate's codec.

use crate::error::{ClientError, Result};
use crate::trust::Trust;
use ferroplasma_protocol::frame::{write_message, FrameCodec, FrameReader};
use ferroplasma_protocol::pb::{self, reply, request};
use ferroplasma_protocol::PROTOCOL_VERSION;
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// A connected, handshaken socket.
#[derive(Debug)]
pub(crate) struct Conn {
    /// Reads (and buffers) frames from the socket.
    pub reader: FrameReader<UnixStream>,
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
    pub fn open(path: &Path, name: &str, trust: &Trust) -> Result<Handshake> {
        let mut stream = connect_trusted(path, trust)?;
        let req = pb::Request {
            request_id: 0,
            body: Some(request::Body::Connect(pb::Connect {
                protocol_version: PROTOCOL_VERSION,
                client_name: name.to_string(),
            })),
        };
        // A store that refuses the connection (too many clients) says why
        // and closes at once: the write may then fail (broken pipe) with the
        // reason already waiting to be read.
        let wrote = write_message(&mut stream, &req);
        let (reply, fds, rest) = match recv_reply_with_fds(&stream) {
            Ok(r) => r,
            Err(e) => {
                wrote?;
                return Err(e);
            }
        };
        let conn = Conn {
            reader: FrameReader::new(stream, FrameCodec::REPLIES).with_buffered(&rest),
        };
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

    /// Asks the store, on a connection of its own, for the object table in
    /// use now and this client's holds region in it (after the table the
    /// client has was replaced): its slots and the two descriptors.
    pub fn attach_table(
        path: &Path,
        trust: &Trust,
        client_id: u64,
        token: &[u8],
    ) -> Result<(u64, OwnedFd, OwnedFd)> {
        let mut stream = connect_trusted(path, trust)?;
        let req = pb::Request {
            request_id: 0,
            body: Some(request::Body::AttachTable(pb::AttachTable {
                protocol_version: PROTOCOL_VERSION,
                client_id,
                token: token.to_vec(),
            })),
        };
        write_message(&mut stream, &req)?;
        let (reply, fds, _) = recv_reply_with_fds(&stream)?;
        match reply.body {
            Some(reply::Body::AttachTable(a)) => {
                let mut fds = fds.into_iter();
                match (fds.next(), fds.next()) {
                    (Some(table), Some(holds)) => Ok((a.table_slots, table, holds)),
                    _ => Err(ClientError::Protocol(
                        "the store sent no table descriptors".into(),
                    )),
                }
            }
            Some(reply::Body::Error(e)) => Err(e.into()),
            other => Err(ClientError::Protocol(format!(
                "expected an AttachTable reply, got {other:?}"
            ))),
        }
    }

    /// The socket.
    pub fn stream(&self) -> &UnixStream {
        self.reader.get_ref()
    }

    /// Reads the next reply, with as few reads as the kernel allows (usually
    /// one: header and body arrive together). With a `spin` window and
    /// nothing buffered, it first looks at the socket for that long
    /// (`crate::spin`) before the read that blocks.
    pub fn read_reply(&mut self, spin: std::time::Duration) -> Result<pb::Reply> {
        if !spin.is_zero() && self.reader.buffered() == 0 {
            crate::spin::until_readable(self.reader.get_ref(), spin)
                .map_err(ClientError::Disconnected)?;
        }
        Ok(self.reader.read_message()?)
    }
}

/// Connects to the store's socket; nothing is sent to a store of a user
/// this client does not trust.
fn connect_trusted(path: &Path, trust: &Trust) -> Result<UnixStream> {
    let stream = UnixStream::connect(path).map_err(|cause| ClientError::StoreUnavailable {
        path: path.to_path_buf(),
        cause,
    })?;
    trust.check(&stream, path)?;
    Ok(stream)
}

/// Receives the handshake reply, collecting any descriptors sent with it;
/// also returns the bytes read past it.
fn recv_reply_with_fds(stream: &UnixStream) -> Result<(pb::Reply, Vec<OwnedFd>, Vec<u8>)> {
    let mut fds = Vec::new();
    let mut buf = bytes::BytesMut::new();
    let mut chunk = vec![0u8; 4096];
    loop {
        if let Some(reply) = FrameCodec::REPLIES
            .decode_message::<pb::Reply>(&mut buf)
            .map_err(|e| ClientError::Protocol(format!("bad handshake reply: {e}")))?
        {
            return Ok((reply, fds, buf.to_vec()));
        }
        let mut cmsg = nix::cmsg_space!([RawFd; 8]);
        let mut iov = [IoSliceMut::new(&mut chunk)];
        let msg = match recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            // A signal: nothing was read; read again.
            Err(nix::errno::Errno::EINTR) => continue,
            r => r.map_err(|e| ClientError::Disconnected(e.into()))?,
        };
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
