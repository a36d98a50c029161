//! One client connection: handshake (with the arena fd), then requests,
//! parked gets, notices and subscription events until the client leaves.
//!
//! Nothing a client sends can stop the store: a malformed frame or a protocol
//! violation ends this connection only, with a logged reason, and the state
//! machine then drops everything the client held.

use crate::cluster::{Cluster, Completion};
use crate::convert;
use crate::fdpass::send_with_fds;
use crate::shared::{now_us, SharedRef};
use bytes::{Buf, BytesMut};
use ferroplasma_protocol::frame::{
    frame_len, HEADER_LEN, MAX_IDS_PER_REQUEST, MAX_INLINE_SIZE, MAX_REQUEST_FRAME,
};
use ferroplasma_protocol::pb::{self, reply, request};
use ferroplasma_protocol::{ObjectId, PROTOCOL_VERSION};
use ferroplasma_store::{ClientId, Location, Notice, StoreError};
use prost::Message;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How long a new connection may take to send its `Connect`.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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

/// A get still waiting for some of its objects.
#[derive(Debug)]
struct PendingGet {
    request_id: u64,
    ids: Vec<ObjectId>,
    found: Vec<Option<Location>>,
    deadline: Option<Instant>,
}

impl PendingGet {
    fn complete(&self) -> bool {
        self.found.iter().all(Option::is_some)
    }

    fn wants(&self, id: &ObjectId) -> bool {
        self.ids
            .iter()
            .zip(&self.found)
            .any(|(i, f)| i == id && f.is_none())
    }
}

/// A create waiting for space (`Create.wait_ms != 0`).
#[derive(Debug)]
struct PendingCreate {
    request_id: u64,
    id: ObjectId,
    data_size: u64,
    /// Metadata bytes the store writes (empty when the creator writes them).
    metadata: Vec<u8>,
    metadata_size: u64,
    deadline: Option<Instant>,
    /// The id is claimed cluster-wide: release the claim if the create fails.
    claimed: bool,
}

/// Serves one accepted connection to its end.
pub async fn serve(mut stream: UnixStream, shared: SharedRef, cluster: Option<Arc<Cluster>>) {
    let peer = stream.peer_cred().ok().and_then(|c| c.pid()).unwrap_or(0);
    let (client, rx) =
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&mut stream, &shared)).await {
            Ok(Ok(v)) => v,
            Ok(Err(Close::Eof)) => return,
            Ok(Err(e)) => {
                tracing::warn!(peer_pid = peer, reason = ?e, "handshake failed; connection closed");
                return;
            }
            Err(_) => {
                tracing::warn!(peer_pid = peer, "no Connect within 10 s; connection closed");
                return;
            }
        };
    tracing::debug!(client, peer_pid = peer, "client connected");
    let (rd, wr) = stream.into_split();
    let space = shared.lock().space.clone();
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let mut conn = Connection {
        cluster,
        done_tx,
        done_rx,
        space,
        creates: Vec::new(),
        client,
        shared: shared.clone(),
        rd,
        wr,
        inbuf: BytesMut::with_capacity(64 * 1024),
        out: Vec::with_capacity(4096),
        rx,
        pending: Vec::new(),
        subscribed: None,
    };
    let end = conn.run().await;
    match end {
        Close::Eof => tracing::debug!(client, "client disconnected"),
        Close::Io(e) => tracing::debug!(client, error = %e, "client connection error"),
        Close::Violation(reason) => {
            tracing::warn!(client, peer_pid = peer, %reason, "closing connection: protocol violation")
        }
    }
    shared.lock().disconnect(client);
}

async fn handshake(
    stream: &mut UnixStream,
    shared: &SharedRef,
) -> Result<(ClientId, mpsc::Receiver<Notice>), Close> {
    let mut header = [0u8; HEADER_LEN];
    if let Err(e) = stream.read_exact(&mut header).await {
        return Err(if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Close::Eof
        } else {
            e.into()
        });
    }
    let len = frame_len(header, MAX_REQUEST_FRAME).map_err(|e| Close::Violation(e.to_string()))?;
    let mut body = vec![0u8; len];
    if let Err(e) = stream.read_exact(&mut body).await {
        return Err(if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Close::Eof
        } else {
            e.into()
        });
    }
    let req = pb::Request::decode(body.as_slice())
        .map_err(|e| Close::Violation(format!("undecodable first message: {e}")))?;
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
    let (client, rx, arena, capacity) = {
        let mut sh = shared.lock();
        let (client, rx) = sh.register();
        (client, rx, sh.arena.clone(), sh.store.capacity())
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
        })),
    };
    let frame = ferroplasma_protocol::frame::encode_frame(&reply);
    if let Err(e) = send_with_fds(stream, &frame, &[arena.fd().as_raw_fd()]).await {
        shared.lock().disconnect(client);
        return Err(e.into());
    }
    tracing::debug!(client, name = %c.client_name, "handshake done");
    Ok((client, rx))
}

fn error_frame(request_id: u64, code: pb::ErrorCode, message: &str) -> Vec<u8> {
    ferroplasma_protocol::frame::encode_frame(&pb::Reply {
        request_id,
        body: Some(reply::Body::Error(pb::Error {
            code: code as i32,
            message: message.to_string(),
            object_id: Vec::new(),
        })),
    })
}

struct Connection {
    client: ClientId,
    shared: SharedRef,
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
    inbuf: BytesMut,
    /// Replies produced since the last flush; written in one call.
    out: Vec<u8>,
    rx: mpsc::Receiver<Notice>,
    pending: Vec<PendingGet>,
    /// Creates waiting for space, oldest first.
    creates: Vec<PendingCreate>,
    /// Woken when space may have been freed.
    space: std::sync::Arc<tokio::sync::Notify>,
    /// How events are framed, once the connection subscribed.
    subscribed: Option<pb::EventFraming>,
    /// This store's cluster, if it is in one.
    cluster: Option<Arc<Cluster>>,
    /// Cluster operations report back through this channel.
    done_tx: mpsc::UnboundedSender<Completion>,
    done_rx: mpsc::UnboundedReceiver<Completion>,
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
    async fn run(&mut self) -> Close {
        loop {
            if let Err(c) = self.drain_frames() {
                let _ = self.flush().await;
                return c;
            }
            if let Err(e) = self.flush().await {
                return e.into();
            }
            let deadline = self
                .pending
                .iter()
                .filter_map(|p| p.deadline)
                .chain(self.creates.iter().filter_map(|c| c.deadline))
                .min();
            let space = self.space.clone();
            tokio::select! {
                biased;
                _ = space.notified(), if !self.creates.is_empty() => self.retry_creates(None),
                Some(done) = self.done_rx.recv() => self.on_completion(done),
                notice = self.rx.recv() => match notice {
                    Some(n) => self.on_notice(n),
                    None => return Close::Violation(
                        "too many undelivered events (client not reading its subscription)".into()),
                },
                r = self.rd.read_buf(&mut self.inbuf) => match r {
                    Ok(0) => return Close::Eof,
                    Ok(_) => {}
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
            if self.inbuf.len() < HEADER_LEN {
                return Ok(());
            }
            let header: [u8; HEADER_LEN] = self.inbuf[..HEADER_LEN].try_into().expect("4 bytes");
            let len = frame_len(header, MAX_REQUEST_FRAME).map_err(|e| {
                self.push_error(0, pb::ErrorCode::TooLarge, &e.to_string());
                Close::Violation(e.to_string())
            })?;
            if self.inbuf.len() < HEADER_LEN + len {
                self.inbuf.reserve(HEADER_LEN + len - self.inbuf.len());
                return Ok(());
            }
            self.inbuf.advance(HEADER_LEN);
            let body = self.inbuf.split_to(len);
            let req = pb::Request::decode(&body[..]).map_err(|e| {
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
        let len = r.encoded_len();
        self.out.extend_from_slice(&(len as u32).to_le_bytes());
        r.encode(&mut self.out).expect("Vec grows");
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
        if let request::Body::Release(r) = body {
            return self.release(r);
        }
        match self.dispatch(rid, body) {
            Ok(Some(b)) => self.push_reply(rid, b),
            Ok(None) => {}
            Err(Refusal(e)) => self.push_reply(rid, reply::Body::Error(e)),
        }
        Ok(())
    }

    fn dispatch(&mut self, rid: u64, body: request::Body) -> Result<Option<reply::Body>, Refusal> {
        use request::Body as B;
        let client = self.client;
        let ok = || Some(reply::Body::Ok(pb::Ok {}));
        match body {
            B::Connect(_) => Err(refuse(
                pb::ErrorCode::ProtocolViolation,
                "already connected".into(),
            )),
            B::Create(mut c) => {
                let id = parse_id(&c.object_id)?;
                check_inline("metadata", c.metadata.len())?;
                if !c.metadata.is_empty() {
                    if c.metadata_size != 0 {
                        return Err(refuse(
                            pb::ErrorCode::InvalidRequest,
                            "Create gives both metadata and metadata_size: send the bytes \
                             (up to the inline limit) or only their size"
                                .into(),
                        ));
                    }
                    c.metadata_size = c.metadata.len() as u64;
                }
                if self.needs_claim(&id) {
                    self.start_claim(rid, id, B::Create(c));
                    return Ok(None);
                }
                self.create(rid, id, c, false)
            }
            B::CreateAndSeal(c) => {
                let id = parse_id(&c.object_id)?;
                check_inline("data", c.data.len())?;
                check_inline("metadata", c.metadata.len())?;
                if self.needs_claim(&id) {
                    self.start_claim(rid, id, B::CreateAndSeal(c));
                    return Ok(None);
                }
                self.create_and_seal(id, c)
            }
            B::Seal(s) => {
                let id = parse_id(&s.object_id)?;
                let mut sh = self.shared.lock();
                let fx = sh.store.seal(client, id, now_us()).map_err(store_refusal)?;
                sh.deliver(fx);
                Ok(ok())
            }
            B::Abort(a) => {
                let id = parse_id(&a.object_id)?;
                let mut sh = self.shared.lock();
                let fx = sh.store.abort(client, id).map_err(store_refusal)?;
                sh.deliver(fx);
                Ok(ok())
            }
            B::Get(g) => self.get(rid, g),
            B::Release(_) => unreachable!("handled before dispatch"),
            B::Contains(c) if c.cluster && self.cluster.is_some() => {
                let ids = parse_ids(&c.object_ids)?;
                let cl = self.cluster.clone().expect("checked");
                self.spawn_reply(rid, async move {
                    let present = cl.contains(ids).await?;
                    Ok(reply::Body::Contains(pb::ContainsReply { present }))
                });
                Ok(None)
            }
            B::Contains(c) => {
                let ids = parse_ids(&c.object_ids)?;
                let sh = self.shared.lock();
                let present = ids.iter().map(|id| sh.store.contains(id)).collect();
                Ok(Some(reply::Body::Contains(pb::ContainsReply { present })))
            }
            B::Delete(d) if self.cluster.is_some() => {
                let ids = parse_ids(&d.object_ids)?;
                let cl = self.cluster.clone().expect("checked");
                self.spawn_reply(rid, async move {
                    let status = cl.delete(ids).await?;
                    Ok(reply::Body::Delete(pb::DeleteReply { status }))
                });
                Ok(None)
            }
            B::Delete(d) => {
                let ids = parse_ids(&d.object_ids)?;
                let mut sh = self.shared.lock();
                let mut status = Vec::with_capacity(ids.len());
                for id in ids {
                    let (outcome, fx) = sh.store.delete(id);
                    sh.deliver(fx);
                    status.push(convert::delete_status(outcome));
                }
                Ok(Some(reply::Body::Delete(pb::DeleteReply { status })))
            }
            B::List(l) if l.cluster && self.cluster.is_some() => {
                let cl = self.cluster.clone().expect("checked");
                self.spawn_reply(rid, async move {
                    let objects = cl.list().await;
                    Ok(reply::Body::List(pb::ListReply { objects }))
                });
                Ok(None)
            }
            B::List(_) => {
                let sh = self.shared.lock();
                let cluster = self.cluster.as_deref();
                let objects = sh
                    .store
                    .list()
                    .iter()
                    .map(|o| pb::ObjectInfo {
                        cached: cluster.is_some_and(|c| c.is_cached(&o.id)),
                        ..convert::info(o)
                    })
                    .collect();
                Ok(Some(reply::Body::List(pb::ListReply { objects })))
            }
            B::ClusterStatus(_) => Ok(Some(reply::Body::ClusterStatus(match &self.cluster {
                Some(c) => c.status(),
                None => pb::ClusterStatusReply::default(),
            }))),
            B::Evict(e) => {
                let mut sh = self.shared.lock();
                let (freed, count, fx) = sh.store.evict(e.num_bytes);
                sh.deliver(fx);
                Ok(Some(reply::Body::Evict(pb::EvictReply {
                    freed_bytes: freed,
                    objects_evicted: count,
                })))
            }
            B::Subscribe(s) => {
                self.shared.lock().store.subscribe(client);
                self.subscribed = Some(s.framing());
                Ok(ok())
            }
            B::Stats(_) => {
                let sh = self.shared.lock();
                Ok(Some(reply::Body::Stats(convert::stats(&sh.store.stats()))))
            }
        }
    }

    /// In a cluster, a create first claims its id cluster-wide (the create
    /// resumes in `on_completion`); an id taken locally needs no round trip
    /// to be refused. A lone store never claims.
    fn needs_claim(&self, id: &ObjectId) -> bool {
        self.cluster.is_some() && !self.shared.lock().store.exists(id)
    }

    /// Claims `id` cluster-wide, then resumes `request` (Create or
    /// CreateAndSeal) in `on_completion`.
    fn start_claim(&self, rid: u64, id: ObjectId, request: request::Body) {
        let Some(cl) = self.cluster.clone() else {
            return;
        };
        let tx = self.done_tx.clone();
        tokio::spawn(async move {
            let result = match cl.claim(id).await {
                Ok(true) => Ok(()),
                Ok(false) => Err(crate::cluster::wire_error(
                    pb::ErrorCode::ObjectExists,
                    format!("object {id} already exists in the cluster"),
                    Some(id),
                )),
                Err(e) => Err(e),
            };
            let _ = tx.send(Completion::Claimed {
                request_id: rid,
                request,
                result,
            });
        });
    }

    /// Runs a cluster operation and answers request `rid` with its result.
    fn spawn_reply(
        &self,
        rid: u64,
        op: impl std::future::Future<Output = Result<reply::Body, pb::Error>> + Send + 'static,
    ) {
        let tx = self.done_tx.clone();
        tokio::spawn(async move {
            let body = op.await;
            let _ = tx.send(Completion::Reply {
                request_id: rid,
                body,
            });
        });
    }

    /// Gives a claimed id back after its create failed.
    fn unclaim(&self, id: ObjectId) {
        if self.cluster.is_some() {
            self.shared.lock().deliver(ferroplasma_store::Effects {
                aborted: vec![id],
                ..Default::default()
            });
        }
    }

    fn on_completion(&mut self, done: Completion) {
        match done {
            Completion::Reply { request_id, body } => match body {
                Ok(b) => self.push_reply(request_id, b),
                Err(e) => self.push_reply(request_id, reply::Body::Error(e)),
            },
            Completion::Claimed {
                request_id,
                result: Err(e),
                ..
            } => self.push_reply(request_id, reply::Body::Error(e)),
            Completion::Claimed {
                request_id: rid,
                request,
                result: Ok(()),
            } => {
                let r = match request {
                    request::Body::Create(c) => match parse_id(&c.object_id) {
                        Ok(id) => {
                            let r = self.create(rid, id, c, true);
                            if r.is_err() {
                                self.unclaim(id);
                            }
                            r
                        }
                        Err(e) => Err(e),
                    },
                    request::Body::CreateAndSeal(c) => match parse_id(&c.object_id) {
                        Ok(id) => {
                            let r = self.create_and_seal(id, c);
                            if r.is_err() {
                                self.unclaim(id);
                            }
                            r
                        }
                        Err(e) => Err(e),
                    },
                    _ => Ok(None),
                };
                match r {
                    Ok(Some(b)) => self.push_reply(rid, b),
                    Ok(None) => {}
                    Err(Refusal(e)) => self.push_reply(rid, reply::Body::Error(e)),
                }
            }
            Completion::FetchFailed { id, error } => self.fail_gets(id, error),
        }
    }

    /// Answers every pending get that waits for `id` with `error`, giving
    /// back the references those gets had taken.
    fn fail_gets(&mut self, id: ObjectId, error: pb::Error) {
        let (failed, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|p| p.wants(&id));
        self.pending = rest;
        for p in failed {
            {
                let mut sh = self.shared.lock();
                for (i, f) in p.ids.iter().zip(&p.found) {
                    match f {
                        Some(_) => {
                            if let Ok(fx) = sh.store.release(self.client, *i) {
                                sh.deliver(fx);
                            }
                        }
                        None if !self.pending.iter().any(|q| q.wants(i)) => {
                            sh.store.unwatch(self.client, *i)
                        }
                        None => {}
                    }
                }
            }
            self.push_reply(p.request_id, reply::Body::Error(error.clone()));
        }
    }

    /// A Create: allocates (waiting for space when asked).
    fn create(
        &mut self,
        rid: u64,
        id: ObjectId,
        c: pb::Create,
        claimed: bool,
    ) -> Result<Option<reply::Body>, Refusal> {
        match self.try_create(id, c.data_size, c.metadata_size, &c.metadata) {
            Err(Waitable(e)) if c.wait_ms != 0 => {
                tracing::debug!(client = self.client, %id, wait_ms = c.wait_ms, "create waits for space: {}", e.message);
                self.creates.push(PendingCreate {
                    request_id: rid,
                    id,
                    data_size: c.data_size,
                    metadata: c.metadata,
                    metadata_size: c.metadata_size,
                    deadline: (c.wait_ms > 0)
                        .then(|| Instant::now() + Duration::from_millis(c.wait_ms as u64)),
                    claimed,
                });
                Ok(None)
            }
            Err(Waitable(e)) => Err(Refusal(e)),
            Ok(r) => r.map(Some),
        }
    }

    /// A CreateAndSeal: a small object in one message.
    fn create_and_seal(
        &mut self,
        id: ObjectId,
        c: pb::CreateAndSeal,
    ) -> Result<Option<reply::Body>, Refusal> {
        let client = self.client;
        let mut sh = self.shared.lock();
        let now = now_us();
        if !sh.store.exists(&id) {
            sh.spill_for(c.data.len() as u64, c.metadata.len() as u64)
                .map_err(store_refusal)?;
        }
        let (loc, mut fx) = sh
            .store
            .create(
                client,
                id,
                c.data.len() as u64,
                c.metadata.len() as u64,
                now,
            )
            .map_err(store_refusal)?;
        sh.arena.write(loc.offset, &c.data);
        sh.arena.write(loc.metadata_offset(), &c.metadata);
        fx.extend(sh.store.seal(client, id, now).map_err(store_refusal)?);
        fx.extend(sh.store.release(client, id).map_err(store_refusal)?);
        sh.deliver(fx);
        Ok(Some(reply::Body::Ok(pb::Ok {})))
    }

    /// Creates an object. `Err(Waitable)` is a store-full refusal that
    /// waiting could cure; `Ok(Err)` any other refusal.
    /// `metadata` is written when given; `meta` is its size (or the size of
    /// the metadata the creator writes itself).
    fn try_create(
        &mut self,
        id: ObjectId,
        data_size: u64,
        meta: u64,
        metadata: &[u8],
    ) -> Result<Result<reply::Body, Refusal>, Waitable> {
        let mut sh = self.shared.lock();
        let fits_at_all = data_size.saturating_add(meta) <= sh.store.capacity();
        // Spill only for a create that can succeed (not for a taken id).
        let room = if sh.store.exists(&id) {
            Ok(())
        } else {
            sh.spill_for(data_size, meta)
        };
        let created =
            room.and_then(|()| sh.store.create(self.client, id, data_size, meta, now_us()));
        match created {
            Ok((loc, fx)) => {
                sh.arena.write(loc.metadata_offset(), metadata);
                sh.deliver(fx);
                Ok(Ok(reply::Body::Create(pb::CreateReply {
                    location: Some(convert::location(loc)),
                })))
            }
            Err(e @ (StoreError::StoreFull { .. } | StoreError::SpillFull { .. }))
                if fits_at_all =>
            {
                Err(Waitable(convert::error(&e)))
            }
            Err(e) => Ok(Err(store_refusal(e))),
        }
    }

    /// Retries the creates waiting for space, in order; with `now`, also
    /// answers those whose wait ran out.
    fn retry_creates(&mut self, now: Option<Instant>) {
        for p in std::mem::take(&mut self.creates) {
            match self.try_create(p.id, p.data_size, p.metadata_size, &p.metadata) {
                Ok(Ok(body)) => self.push_reply(p.request_id, body),
                Ok(Err(Refusal(e))) => {
                    if p.claimed {
                        self.unclaim(p.id);
                    }
                    self.push_reply(p.request_id, reply::Body::Error(e))
                }
                Err(Waitable(mut e)) => {
                    if now.is_some_and(|n| p.deadline.is_some_and(|d| d <= n)) {
                        if p.claimed {
                            self.unclaim(p.id);
                        }
                        e.message = format!("waited for space in vain: {}", e.message);
                        self.push_reply(p.request_id, reply::Body::Error(e));
                    } else {
                        self.creates.push(p);
                    }
                }
            }
        }
    }

    fn get(&mut self, rid: u64, g: pb::Get) -> Result<Option<reply::Body>, Refusal> {
        let ids = parse_ids(&g.object_ids)?;
        let mut sh = self.shared.lock();
        for id in &ids {
            sh.unspill(*id).map_err(store_refusal)?;
        }
        let found: Vec<Option<Location>> = ids
            .iter()
            .map(|id| sh.store.get(self.client, *id))
            .collect();
        let pending = PendingGet {
            request_id: rid,
            ids,
            found,
            deadline: (g.timeout_ms > 0)
                .then(|| Instant::now() + Duration::from_millis(g.timeout_ms as u64)),
        };
        if pending.complete() || g.timeout_ms == 0 {
            return Ok(Some(get_reply(&pending)));
        }
        let mut remote = Vec::new();
        for (id, f) in pending.ids.iter().zip(&pending.found) {
            if f.is_none() {
                sh.store.watch(self.client, *id);
                if !sh.store.exists(id) {
                    remote.push(*id);
                }
            }
        }
        drop(sh);
        if let Some(cl) = &self.cluster {
            for id in remote {
                cl.want(id, pending.deadline, self.done_tx.clone());
            }
        }
        self.pending.push(pending);
        Ok(None)
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

    fn on_notice(&mut self, notice: Notice) {
        match notice {
            Notice::Event(e) => {
                let event = convert::event(&e);
                if self.subscribed == Some(pb::EventFraming::PlasmaFrames) {
                    self.out
                        .extend_from_slice(&(event.encoded_len() as u64).to_le_bytes());
                    event.encode(&mut self.out).expect("Vec grows");
                } else {
                    self.push_reply(0, reply::Body::Event(event));
                }
            }
            Notice::Sealed(id) => {
                let mut sh = self.shared.lock();
                let mut still_missing = false;
                for p in &mut self.pending {
                    for (i, f) in p.ids.iter().zip(p.found.iter_mut()) {
                        if *i == id && f.is_none() {
                            *f = sh.store.get(self.client, id);
                            still_missing |= f.is_none();
                        }
                    }
                }
                // Evicted or deleted again before we got to it: keep waiting.
                if still_missing {
                    sh.store.watch(self.client, id);
                }
                drop(sh);
                self.answer_where(|p, _| p.complete(), Instant::now());
            }
        }
    }

    fn expire(&mut self, now: Instant) {
        self.answer_where(|p, now| p.deadline.is_some_and(|d| d <= now), now);
    }

    /// Answers and removes the pending gets `done` selects; withdraws the
    /// watches no remaining get needs.
    fn answer_where(&mut self, done: impl Fn(&PendingGet, Instant) -> bool, now: Instant) {
        let (finished, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|p| done(p, now));
        self.pending = rest;
        for p in &finished {
            for (id, f) in p.ids.iter().zip(&p.found) {
                if f.is_none() && !self.pending.iter().any(|q| q.wants(id)) {
                    self.shared.lock().store.unwatch(self.client, *id);
                }
            }
            self.push_reply(p.request_id, get_reply(p));
        }
    }
}

fn get_reply(p: &PendingGet) -> reply::Body {
    reply::Body::Get(pb::GetReply {
        results: p
            .found
            .iter()
            .map(|f| pb::GetResult {
                location: f.map(convert::location),
            })
            .collect(),
    })
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

fn check_inline(what: &str, len: usize) -> Result<(), Refusal> {
    if len as u64 > MAX_INLINE_SIZE {
        return Err(refuse(
            pb::ErrorCode::TooLarge,
            format!(
                "{what} of {len} bytes exceeds the inline limit of {MAX_INLINE_SIZE}; \
                 use Create + Seal for large objects"
            ),
        ));
    }
    Ok(())
}

fn store_refusal(e: ferroplasma_store::StoreError) -> Refusal {
    Refusal(convert::error(&e))
}
