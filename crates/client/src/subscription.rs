//! A stream of seal and delete events on a connection of its own.

use crate::connection::Conn;
use crate::error::{ClientError, Result};
use ferroplasma_protocol::frame::{write_message, FrameCodec};
pub use ferroplasma_protocol::pb::EventFraming;
use ferroplasma_protocol::pb::{self, reply, request};
use ferroplasma_protocol::ObjectId;
pub use ferroplasma_protocol::{Event, EventKind};
use std::path::Path;
use std::time::Duration;

/// Events from the store, in the order they happened.
#[derive(Debug)]
pub struct Subscription {
    conn: Conn,
    framing: EventFraming,
}

impl Subscription {
    pub(crate) fn open(
        path: &Path,
        trust: &crate::trust::Trust,
        framing: EventFraming,
        existing: bool,
    ) -> Result<Self> {
        let mut conn = Conn::open(path, "subscription", trust)?.conn;
        write_message(
            &mut conn.stream(),
            &pb::Request {
                request_id: 1,
                body: Some(request::Body::Subscribe(pb::Subscribe {
                    framing: framing as i32,
                    existing,
                })),
            },
        )?;
        // Plasma's framing is for callers that read the socket themselves:
        // then no byte past a frame is read here, the reply included.
        let plasma = framing == EventFraming::PlasmaFrames;
        conn.reader.set_codec(FrameCodec::REPLIES, plasma);
        let r: pb::Reply = conn.reader.read_message()?;
        match r.body {
            Some(reply::Body::Ok(_)) => {}
            Some(reply::Body::Error(e)) => return Err(e.into()),
            other => {
                return Err(ClientError::Protocol(format!(
                    "expected the Subscribe reply, got {other:?}"
                )))
            }
        }
        if plasma {
            conn.reader.set_codec(FrameCodec::PLASMA_EVENTS, true);
        }
        Ok(Self { conn, framing })
    }

    /// Waits for the next event.
    pub fn next_event(&mut self) -> Result<Event> {
        self.conn
            .stream()
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
            .stream()
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
        self.conn.stream().as_raw_fd()
    }

    fn read(&mut self) -> Result<Event> {
        if self.framing == EventFraming::PlasmaFrames {
            return event(self.conn.reader.read_message()?);
        }
        loop {
            if let Some(e) = event_of(self.conn.read_reply(std::time::Duration::ZERO)?)? {
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
/// subscription's socket by the caller, e.g. through an event loop); bytes
/// after the last complete frame are ignored.
pub fn decode_event_frames(data: &[u8]) -> Result<Vec<Event>> {
    let mut buf = bytes::BytesMut::from(data);
    let mut out = Vec::new();
    while let Some(r) = FrameCodec::REPLIES.decode_message::<pb::Reply>(&mut buf)? {
        out.extend(event_of(r)?);
    }
    Ok(out)
}
