//! The handshake: the client's `Connect`, answered with the arena's
//! descriptor (read-only to a reader), the shared table's and the client's
//! holds region; and the answer to a client over `--max-clients`.

use super::Close;
use crate::fdpass::send_with_fds;
use crate::shared::SharedRef;
use bytes::BytesMut;
use ferroplasma_protocol::frame::{FrameCodec, MAX_INLINE_SIZE, MAX_REQUEST_FRAME};
use ferroplasma_protocol::pb::{self, reply, request};
use ferroplasma_protocol::PROTOCOL_VERSION;
use ferroplasma_store::{ClientId, Notice};
use prost::Message;
use std::os::fd::AsRawFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

/// Answers a client over `--max-clients` that the store is busy, and hangs up.
/// (The caller logs it, at a bounded rate.)
pub async fn refuse_busy(mut stream: UnixStream, max: u32) {
    let msg = format!(
        "the store already serves its maximum of {max} clients: retry when some have \
         disconnected, or start the store with more --max-clients"
    );
    let _ = stream
        .write_all(&error_frame(0, pb::ErrorCode::StoreBusy, &msg))
        .await;
}

/// Reads the `Connect` (bytes after it stay in `inbuf` for the connection)
/// and answers it with the arena's descriptor.
pub(super) async fn handshake(
    stream: &mut UnixStream,
    inbuf: &mut BytesMut,
    shared: &SharedRef,
    read_only: bool,
) -> Result<(ClientId, mpsc::Receiver<Notice>), Close> {
    let body = loop {
        match FrameCodec::REQUESTS.decode(inbuf) {
            Ok(Some(body)) => break body,
            Ok(None) => {}
            Err(e) => return Err(Close::Violation(e.to_string())),
        }
        if stream.read_buf(inbuf).await? == 0 {
            return Err(Close::Eof);
        }
    };
    let req = pb::Request::decode(body)
        .map_err(|e| Close::Violation(format!("undecodable first message: {e}")))?;
    if let Some(request::Body::AttachTable(a)) = req.body {
        attach_table(stream, shared, req.request_id, a).await;
        return Err(Close::Eof);
    }
    let Some(request::Body::Connect(c)) = req.body else {
        let msg = "the first request must be Connect";
        let _ = stream
            .write_all(&error_frame(
                req.request_id,
                pb::ErrorCode::ProtocolViolation,
                msg,
            ))
            .await;
        return Err(Close::Violation(msg.into()));
    };
    if c.protocol_version != PROTOCOL_VERSION {
        let msg = format!(
            "client speaks protocol version {}, this store speaks {PROTOCOL_VERSION}; \
             use a client and store of the same release",
            c.protocol_version
        );
        let _ = stream
            .write_all(&error_frame(
                req.request_id,
                pb::ErrorCode::VersionMismatch,
                &msg,
            ))
            .await;
        return Err(Close::Violation(msg));
    }
    let (client, rx, arena, capacity, table, cluster_member) = {
        let mut sh = shared.lock();
        let (client, rx) = sh.register(super::NOTICE_QUEUE);
        let table = match sh.table.clone() {
            Some(f) => match f.add_client(client) {
                Ok(attached) => Some(attached),
                Err(e) => {
                    // Not fatal: this client asks the store for everything.
                    tracing::warn!(client, error = %e, "no shared table for this client");
                    None
                }
            },
            None => None,
        };
        (
            client,
            rx,
            sh.arena.clone(),
            sh.store.capacity(),
            table,
            sh.cluster_client.is_some(),
        )
    };
    let reply = pb::Reply {
        request_id: req.request_id,
        body: Some(reply::Body::Connect(pb::ConnectReply {
            protocol_version: PROTOCOL_VERSION,
            capacity,
            arenas: vec![pb::Arena {
                arena_id: 0,
                size: arena.size(),
            }],
            client_id: client,
            max_inline_size: MAX_INLINE_SIZE,
            max_frame_size: MAX_REQUEST_FRAME,
            table_slots: table.as_ref().map_or(0, |t| t.slots as u64),
            read_only,
            table_token: table.as_ref().map_or_else(Vec::new, |t| t.token.to_vec()),
            cluster_member,
        })),
    };
    let frame = ferroplasma_protocol::frame::encode_frame(&reply);
    // A reader gets a read-only descriptor of the arena, which it cannot
    // reopen writable (the arena's file is the store user's, mode 0600).
    let ro_fd = if read_only {
        match arena.read_only_fd() {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::warn!(client, error = %e, "no read-only descriptor of the arena");
                shared.lock().disconnect(client);
                return Err(Close::Violation(e.to_string()));
            }
        }
    } else {
        None
    };
    let mut fds = vec![ro_fd
        .as_ref()
        .map_or_else(|| arena.fd().as_raw_fd(), |fd| fd.as_raw_fd())];
    if let Some(t) = &table {
        fds.push(t.table.as_raw_fd());
        fds.push(t.holds.as_raw_fd());
    }
    if let Err(e) = send_with_fds(stream, &frame, &fds).await {
        shared.lock().disconnect(client);
        return Err(e.into());
    }
    tracing::debug!(client, name = %c.client_name, "handshake done");
    Ok((client, rx))
}

/// Answers an `AttachTable` (the first and only request of a client's
/// second connection, after its table was replaced): the table in use and
/// the client's holds region in it, if the token is that client's.
async fn attach_table(
    stream: &mut UnixStream,
    shared: &SharedRef,
    request_id: u64,
    a: pb::AttachTable,
) {
    let attached = {
        let sh = shared.lock();
        sh.table
            .as_ref()
            .and_then(|t| t.attach(a.client_id, &a.token))
    };
    let refuse = |msg: &str| error_frame(request_id, pb::ErrorCode::InvalidRequest, msg);
    match attached {
        None => {
            let _ = stream
                .write_all(&refuse(
                    "AttachTable: no such client, or not its token (a client asks for the new \
                     table with the client_id and table_token of its own connection)",
                ))
                .await;
        }
        Some(Err(e)) => {
            let _ = stream.write_all(&refuse(&e.to_string())).await;
        }
        Some(Ok(t)) => {
            let frame = ferroplasma_protocol::frame::encode_frame(&pb::Reply {
                request_id,
                body: Some(reply::Body::AttachTable(pb::AttachTableReply {
                    table_slots: t.slots as u64,
                })),
            });
            let _ =
                send_with_fds(stream, &frame, &[t.table.as_raw_fd(), t.holds.as_raw_fd()]).await;
        }
    }
}

pub(super) fn error_frame(request_id: u64, code: pb::ErrorCode, message: &str) -> Vec<u8> {
    ferroplasma_protocol::frame::encode_frame(&pb::Reply {
        request_id,
        body: Some(reply::Body::Error(pb::Error {
            code: code as i32,
            message: message.to_string(),
            object_id: Vec::new(),
        })),
    })
}
