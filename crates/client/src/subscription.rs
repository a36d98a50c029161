//! A stream of seal and delete events on a connection of its own.

use crate::connection::Conn;
use crate::error::{ClientError, Result};
use ferroplasma_protocol::frame::{read_message, write_message, MAX_REPLY_FRAME};
pub use ferroplasma_protocol::pb::EventFraming;
use ferroplasma_protocol::pb::{self, reply, request};
use ferroplasma_protocol::ObjectId;
pub use ferroplasma_protocol::{Event, EventKind};
use std::io::Read;
use std::path::Path;
use std::time::Duration;

/// Events from the store, in the order they happened.
#[derive(Debug)]
pub struct Subscription {
    conn: Conn,
    framing: EventFraming,
}

impl Subscription {
    pub(crate) fn open(path: &Path, framing: EventFraming) -> Result<Self> {
        let mut conn = Conn::open(path, "subscription")?.conn;
        // Read the reply with exact reads, so that no event that follows it
        // is buffered here: from now on the socket holds only events, and a
        // caller may read it directly (`as_raw_fd`).
        write_message(
            &mut conn.stream,
            &pb::Request {
                request_id: 1,
                body: Some(request::Body::Subscribe(pb::Subscribe {
                    framing: framing as i32,
                })),
            },
        )?;
        let r: pb::Reply = read_message(&mut conn.stream, MAX_REPLY_FRAME)?;
        match r.body {
            Some(reply::Body::Ok(_)) => Ok(Self { conn, framing }),
            Some(reply::Body::Error(e)) => Err(e.into()),
            other => Err(ClientError::Protocol(format!(
                "expected the Subscribe reply, got {other:?}"
            ))),
        }
    }

    /// Waits for the next event.
    pub fn next_event(&mut self) -> Result<Event> {
        self.conn
            .stream
            .set_read_timeout(None)
            .map_err(ClientError::Disconnected)?;
        self.read()
    }

    /// Waits up to `timeout` for the next event; `None` if none came.
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Option<Event>> {
        let t = if timeout.is_zero() {
            Duration::from_nanos(1)
        } else {
            timeout
        };
        self.conn
            .stream
            .set_read_timeout(Some(t))
            .map_err(ClientError::Disconnected)?;
        match self.read() {
            Ok(e) => Ok(Some(e)),
            Err(ClientError::Disconnected(io))
                if matches!(
                    io.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The socket, for `poll`/`select` by callers with an event loop.
    pub fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.conn.stream.as_raw_fd()
    }

    fn read(&mut self) -> Result<Event> {
        if self.framing == EventFraming::PlasmaFrames {
            let mut len = [0u8; 8];
            self.conn
                .stream
                .read_exact(&mut len)
                .map_err(ClientError::Disconnected)?;
            let len = u64::from_le_bytes(len);
            if len > MAX_REPLY_FRAME {
                return Err(ClientError::Protocol(format!(
                    "a {len}-byte event message is over the {MAX_REPLY_FRAME}-byte limit"
                )));
            }
            let mut body = vec![0u8; len as usize];
            self.conn
                .stream
                .read_exact(&mut body)
                .map_err(ClientError::Disconnected)?;
            return decode_plasma_event(&body);
        }
        loop {
            let r: pb::Reply = read_message(&mut self.conn.stream, MAX_REPLY_FRAME)?;
            if let Some(e) = event_of(r)? {
                return Ok(e);
            }
        }
    }
}

impl Iterator for Subscription {
    type Item = Result<Event>;
    fn next(&mut self) -> Option<Self::Item> {
        match self.next_event() {
            Err(ClientError::Disconnected(_)) => None,
            other => Some(other),
        }
    }
}

/// The event in a reply frame, if it holds one.
fn event_of(r: pb::Reply) -> Result<Option<Event>> {
    match r.body {
        Some(reply::Body::Event(e)) => event(e).map(Some),
        Some(reply::Body::Error(e)) => Err(e.into()),
        _ => Ok(None),
    }
}

fn event(e: pb::Event) -> Result<Event> {
    let id =
        ObjectId::from_slice(&e.object_id).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let kind = if e.kind == pb::EventKind::DeletedEvent as i32 {
        EventKind::Deleted
    } else {
        EventKind::Sealed
    };
    Ok(Event {
        kind,
        id,
        data_size: e.data_size,
        metadata_size: e.metadata_size,
    })
}

/// Decodes the body of one message of a [`EventFraming::PlasmaFrames`]
/// subscription (the bytes after its 8-byte length).
pub fn decode_plasma_event(body: &[u8]) -> Result<Event> {
    use prost::Message;
    let e = pb::Event::decode(body)
        .map_err(|e| ClientError::Protocol(format!("bad event message: {e}")))?;
    event(e)
}

/// Decodes the complete event frames in `data` (bytes read from a
/// subscription's socket by the caller, e.g. through an event loop).
pub fn decode_event_frames(mut data: &[u8]) -> Result<Vec<Event>> {
    use prost::Message;
    let mut out = Vec::new();
    while data.len() >= 4 {
        let len = ferroplasma_protocol::frame::frame_len(
            data[..4].try_into().expect("4 bytes"),
            MAX_REPLY_FRAME,
        )?;
        if data.len() < 4 + len {
            break;
        }
        let r = pb::Reply::decode(&data[4..4 + len])
            .map_err(|e| ClientError::Protocol(format!("bad event frame: {e}")))?;
        out.extend(event_of(r)?);
        data = &data[4 + len..];
    }
    Ok(out)
}
