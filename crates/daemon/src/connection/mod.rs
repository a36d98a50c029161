//! One client connection: handshake (with the arena fd), then requests,
//! parked gets, notices and subscription events until the client leaves.
//!
//! Nothing a client sends can stop the store: a malformed frame or a protocol
//! violation ends this connection only, with a logged reason, and the state
//! machine then drops everything the client held.
//!
//! Files: this one (the connection loop, framing, handing requests on),
//! `handshake` (the first request, answered with the descriptors),
//! `dispatch` (each request), `gets` (gets waiting for objects),
//! `creates` (creates, and those waiting for space), `continuations`
//! (cluster operations that finish later), `listing` (lists that page).

mod continuations;
mod creates;
mod dispatch;
mod handshake;
mod listing;
/// The objects a request names, for its span: the first few in hex and how
/// many more.
fn ids_of(body: &request::Body) -> String {
    use request::Body as B;
    let one = |raw: &[u8]| {
        ObjectId::from_slice(raw)
            .map(|id| id.to_hex())
            .unwrap_or_default()
    };
    let packed = |raw: &[u8]| {
        let ids: Vec<String> = raw.chunks(ObjectId::LEN).map(one).collect();
        match ids.len() {
            0..=3 => ids.join(","),
            n => format!("{},… ({n} ids)", ids[..3].join(",")),
        }
    };
    match body {
        B::Create(c) => one(&c.object_id),
        B::CreateAndSeal(c) => one(&c.object_id),
        B::Seal(c) => one(&c.object_id),
        B::Abort(c) => one(&c.object_id),
        B::Settle(c) => one(&c.object_id),
        B::Get(g) => packed(&g.object_ids),
        B::Release(r) => packed(&r.object_ids),
        B::Contains(c) => packed(&c.object_ids),
        B::Delete(d) => packed(&d.object_ids),
        _ => String::new(),
    }
}

/// The metric label of a request.
fn op_of(body: &request::Body) -> Option<Op> {
    use request::Body as B;
    Some(match body {
        B::Create(_) => Op::create,
        B::CreateAndSeal(_) => Op::create_and_seal,
        B::Seal(_) => Op::seal,
        B::Abort(_) => Op::abort,
        B::Get(_) => Op::get,
        B::Release(_) => Op::release,
        B::Contains(_) => Op::contains,
        B::Delete(_) => Op::delete,
        B::Evict(_) => Op::evict,
        B::List(_) => Op::list,
        B::Stats(_) => Op::stats,
        B::Subscribe(_) => Op::subscribe,
        B::ClusterStatus(_) => Op::cluster_status,
        B::Lease(_) => Op::lease,
        B::Settle(_) => Op::settle,
        B::NewIds(_) => Op::new_ids,
        B::Connect(_) | B::AttachTable(_) => return None,
    })
}

#[cfg(test)]
mod fuzz_tests;
mod gets;
#[cfg(test)]
mod testkit;
#[cfg(test)]
mod wakeups_tests;

use creates::PendingCreate;
use gets::ParkedGets;
pub use gets::NOTICE_QUEUE;
use handshake::handshake;
pub use handshake::refuse_busy;

use crate::convert;
use crate::instruments::{Instruments, Op};
use crate::shared::SharedRef;
use bytes::BytesMut;
use ferroplasma_cluster::net::rate_log::RateLimited;
use ferroplasma_cluster::{Cluster, Completion};
use ferroplasma_protocol::frame::{FrameCodec, MAX_IDS_PER_REQUEST};
use ferroplasma_protocol::pb::{self, reply, request};
use ferroplasma_protocol::ObjectId;
use ferroplasma_store::{ClientId, Notice};
use prost::Message;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How long a new connection may take to send its `Connect`.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Queued notices handled in one turn of a connection's loop after the one
/// that woke it (the rest wait for the next turn, so that a flood of
/// notices cannot starve the client's own requests).
const NOTICE_BURST: usize = 1024;

/// Why a connection ended.
#[derive(Debug)]
enum Close {
    /// The client hung up.
    Eof,
    /// A socket error.
    Io(std::io::Error),
    /// The client broke the protocol; the reason is logged.
    Violation(String),
}

impl From<std::io::Error> for Close {
    fn from(e: std::io::Error) -> Self {
        Close::Io(e)
    }
}

/// Serves one accepted connection to its end.
pub async fn serve(mut stream: UnixStream, shared: SharedRef, cluster: Option<Arc<Cluster>>) {
    let cred = stream.peer_cred().ok();
    let peer = cred.and_then(|c| c.pid()).unwrap_or(0);
    // Root and the store's own user may write; any other allowed user reads.
    let read_only = cred.is_none_or(|c| c.uid() != 0 && c.uid() != nix::unistd::geteuid().as_raw());
    let mut inbuf = BytesMut::with_capacity(64 * 1024);
    let (client, rx) = match tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        handshake(&mut stream, &mut inbuf, &shared, read_only),
    )
    .await
    {
        Ok(Ok(v)) => v,
        Ok(Err(Close::Eof)) => return,
        Ok(Err(e)) => {
            if let Some(suppressed) = HANDSHAKE_FAILED.admit() {
                tracing::warn!(peer_pid = peer, reason = ?e, suppressed, "handshake failed; connection closed");
            }
            return;
        }
        Err(_) => {
            if let Some(suppressed) = NO_CONNECT.admit() {
                tracing::warn!(
                    peer_pid = peer,
                    suppressed,
                    "no Connect within 10 s; connection closed"
                );
            }
            return;
        }
    };
    tracing::debug!(client, peer_pid = peer, "client connected");
    let mut conn = Connection::new(client, rx, shared.clone(), cluster, stream, inbuf);
    conn.read_only = read_only;
    let end = conn.run().await;
    match end {
        Close::Eof => tracing::debug!(client, "client disconnected"),
        Close::Io(e) => tracing::debug!(client, error = %e, "client connection error"),
        Close::Violation(reason) => {
            if let Some(suppressed) = VIOLATION.admit() {
                tracing::warn!(client, peer_pid = peer, %reason, suppressed, "closing connection: protocol violation")
            }
        }
    }
    shared.lock().disconnect(client);
}

// Lines any local client can cause by misbehaving, at a bounded rate.
static HANDSHAKE_FAILED: RateLimited = RateLimited::new();
static NO_CONNECT: RateLimited = RateLimited::new();
static VIOLATION: RateLimited = RateLimited::new();

struct Connection {
    client: ClientId,
    /// The peer is another user the store allows: it may read, and put
    /// objects by value, but not write in the arena, delete or evict.
    read_only: bool,
    shared: SharedRef,
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
    inbuf: BytesMut,
    /// Replies produced since the last flush; written in one call.
    out: Vec<u8>,
    rx: mpsc::Receiver<Notice>,
    gets: ParkedGets,
    /// Creates waiting for space, oldest first.
    creates: Vec<PendingCreate>,
    /// `room_mark` when the parked creates last tried.
    room_seen: (u64, u64),
    /// Request counters and answer times (the metrics endpoint's).
    instruments: Arc<Instruments>,
    /// Woken when space may have been freed.
    space: std::sync::Arc<tokio::sync::Notify>,
    /// How events are framed, once the connection subscribed.
    subscribed: Option<pb::EventFraming>,
    /// This store's cluster, if it is in one.
    cluster: Option<Arc<Cluster>>,
    /// Cluster operations report back through this channel.
    done_tx: mpsc::UnboundedSender<Completion>,
    done_rx: mpsc::UnboundedReceiver<Completion>,
    /// Paged listings under way.
    listings: listing::Listings,
}

impl Drop for Connection {
    /// Its parked creates stop waiting (and counting in the stats), and
    /// give back their ids' cluster claims.
    fn drop(&mut self) {
        if !self.creates.is_empty() {
            self.shared.lock().waiting_creates -= self.creates.len();
            if self.cluster.is_some() {
                for p in self.creates.iter().filter(|p| p.claimed) {
                    continuations::unclaim(&self.shared, p.id);
                }
            }
        }
    }
}

/// A request that is answered with an error and leaves the connection open.
struct Refusal(pb::Error);

/// A store-full refusal of a create that may succeed once space is freed.
struct Waitable(pb::Error);

fn refuse(code: pb::ErrorCode, message: String) -> Refusal {
    Refusal(pb::Error {
        code: code as i32,
        message,
        object_id: Vec::new(),
    })
}

impl Connection {
    /// The connection of a client that completed its handshake; `inbuf`
    /// holds what it sent after its `Connect`.
    fn new(
        client: ClientId,
        rx: mpsc::Receiver<Notice>,
        shared: SharedRef,
        cluster: Option<Arc<Cluster>>,
        stream: UnixStream,
        inbuf: BytesMut,
    ) -> Self {
        let (rd, wr) = stream.into_split();
        let (space, instruments) = {
            let sh = shared.lock();
            (sh.space.clone(), sh.instruments.clone())
        };
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Connection {
            read_only: false,
            cluster,
            done_tx,
            done_rx,
            space,
            creates: Vec::new(),
            room_seen: (0, 0),
            instruments,
            client,
            shared,
            rd,
            wr,
            inbuf,
            out: Vec::with_capacity(4096),
            rx,
            gets: ParkedGets::default(),
            subscribed: None,
            listings: Default::default(),
        }
    }

    async fn run(&mut self) -> Close {
        loop {
            // Listen for freed space before anything below can free it or
            // wait (the flush waits for a slow reader): a notification in
            // between is then not lost. And space freed while the last
            // event was handled is looked at now, before waiting again.
            let space = self.space.clone();
            let freed = space.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if !self.creates.is_empty() {
                self.retry_creates(None);
            }
            if let Err(c) = self.drain_frames() {
                let _ = self.flush().await;
                return c;
            }
            if let Err(e) = self.flush().await {
                return e.into();
            }
            let deadline = self
                .gets
                .next_deadline()
                .into_iter()
                .chain(self.creates.iter().filter_map(|c| c.deadline))
                .min();
            tokio::select! {
                biased;
                _ = &mut freed, if !self.creates.is_empty() => self.retry_creates(None),
                Some(done) = self.done_rx.recv() => self.on_completion(done),
                notice = self.rx.recv() => match notice {
                    Some(n) => self.on_notices(n),
                    None => return Close::Violation(
                        "too many undelivered events (client not reading its subscription)".into()),
                },
                r = self.rd.read_buf(&mut self.inbuf) => match r {
                    Ok(0) => return Close::Eof,
                    Ok(_) => self.shared.spin().poke(),
                    Err(e) => return e.into(),
                },
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    let now = Instant::now();
                    self.expire(now);
                    self.retry_creates(Some(now));
                }
            }
        }
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        if !self.out.is_empty() {
            self.wr.write_all(&self.out).await?;
            self.out.clear();
        }
        Ok(())
    }

    /// Handles every complete frame in the input buffer.
    fn drain_frames(&mut self) -> Result<(), Close> {
        loop {
            let body = match FrameCodec::REQUESTS.decode(&mut self.inbuf) {
                Ok(Some(body)) => body,
                Ok(None) => return Ok(()),
                Err(e) => {
                    self.push_error(0, pb::ErrorCode::TooLarge, &e.to_string());
                    return Err(Close::Violation(e.to_string()));
                }
            };
            let req = pb::Request::decode(body).map_err(|e| {
                let msg = format!("undecodable request: {e}");
                self.push_error(0, pb::ErrorCode::ProtocolViolation, &msg);
                Close::Violation(msg)
            })?;
            self.handle(req)?;
        }
    }

    fn push_reply(&mut self, request_id: u64, body: reply::Body) {
        let r = pb::Reply {
            request_id,
            body: Some(body),
        };
        FrameCodec::REPLIES.encode(&r, &mut self.out);
    }

    /// Queues an event for this subscriber, framed as it asked.
    fn push_event(&mut self, e: &ferroplasma_store::Event) {
        let event = convert::event(e);
        if self.subscribed == Some(pb::EventFraming::PlasmaFrames) {
            FrameCodec::PLASMA_EVENTS.encode(&event, &mut self.out);
        } else {
            self.push_reply(0, reply::Body::Event(event));
        }
    }

    fn push_error(&mut self, request_id: u64, code: pb::ErrorCode, message: &str) {
        self.push_reply(
            request_id,
            reply::Body::Error(pb::Error {
                code: code as i32,
                message: message.to_string(),
                object_id: Vec::new(),
            }),
        );
    }

    fn handle(&mut self, req: pb::Request) -> Result<(), Close> {
        let rid = req.request_id;
        let Some(body) = req.body else {
            self.push_error(
                rid,
                pb::ErrorCode::InvalidRequest,
                "unknown or empty request type (is the client newer than the store?)",
            );
            return Ok(());
        };
        if self.subscribed.is_some() {
            let msg = "a subscribed connection only receives events";
            self.push_error(rid, pb::ErrorCode::ProtocolViolation, msg);
            return Err(Close::Violation(msg.into()));
        }
        let op = op_of(&body);
        if let Some(op) = op {
            self.instruments.request(op);
        }
        // At debug level, one span per request: every line logged while it
        // is handled, and by the continuations it starts (cluster lookups
        // and pulls), carries the client, the request and its objects.
        let span = if tracing::enabled!(tracing::Level::DEBUG) {
            tracing::debug_span!(
                "request",
                client = self.client,
                rid,
                op = %op.map(|o| format!("{o:?}")).unwrap_or_default(),
                ids = %ids_of(&body)
            )
        } else {
            tracing::Span::none()
        };
        let _in_span = span.enter();
        tracing::debug!("received");
        if let request::Body::Release(r) = body {
            return self.release(r);
        }
        let started = std::time::Instant::now();
        match self.dispatch(rid, body) {
            Ok(Some(b)) => {
                if let Some(op @ (Op::get | Op::create | Op::create_and_seal)) = op {
                    self.instruments
                        .answered(op, started.elapsed().as_secs_f64());
                }
                self.push_reply(rid, b)
            }
            Ok(None) => {}
            Err(Refusal(e)) => self.push_reply(rid, reply::Body::Error(e)),
        }
        Ok(())
    }

    fn release(&mut self, r: pb::Release) -> Result<(), Close> {
        let ids = parse_ids(&r.object_ids).map_err(|Refusal(e)| Close::Violation(e.message))?;
        let mut sh = self.shared.lock();
        for id in ids {
            let fx = sh
                .store
                .release(self.client, id)
                .map_err(|e| Close::Violation(format!("release: {e}")))?;
            sh.deliver(fx);
        }
        Ok(())
    }

    /// Handles `first` and the notices queued behind it (up to
    /// [`NOTICE_BURST`]): they come in bursts (a batch pulled from another
    /// member, a client sealing many), and the seals among them are taken
    /// under one lock of the state.
    fn on_notices(&mut self, first: Notice) {
        let mut sealed = Vec::new();
        let mut next = Some(first);
        let mut taken = 0;
        while let Some(notice) = next.take() {
            match notice {
                Notice::Event(e) => self.push_event(&e),
                Notice::Sealed(id) => sealed.push((id, false)),
                Notice::Restored(id) => sealed.push((id, true)),
                Notice::Aborted(_) => {} // for the cluster agent only
            }
            taken += 1;
            if taken <= NOTICE_BURST {
                next = self.rx.try_recv().ok();
            }
        }
        if !sealed.is_empty() {
            self.on_sealed_many(&sealed);
        }
    }
}

fn parse_id(raw: &[u8]) -> Result<ObjectId, Refusal> {
    ObjectId::from_slice(raw).map_err(|e| refuse(pb::ErrorCode::InvalidRequest, e.to_string()))
}

fn parse_ids(packed: &[u8]) -> Result<Vec<ObjectId>, Refusal> {
    let n = packed.len() / ObjectId::LEN;
    if n > MAX_IDS_PER_REQUEST {
        return Err(refuse(
            pb::ErrorCode::TooLarge,
            format!("{n} ids in one request; the limit is {MAX_IDS_PER_REQUEST}, split the batch"),
        ));
    }
    ferroplasma_protocol::unpack_ids(packed).map_err(|_| {
        refuse(
            pb::ErrorCode::InvalidRequest,
            format!(
                "object_ids holds {} bytes, not a multiple of {}",
                packed.len(),
                ObjectId::LEN
            ),
        )
    })
}

fn store_refusal(e: ferroplasma_store::StoreError) -> Refusal {
    Refusal(convert::error(&e))
}
