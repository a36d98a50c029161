//! [`Client`]: the blocking API over one connection to a store.

use crate::buffer::{Mapping, MutableBuffer, ObjectBuffer};
use crate::connection::Conn;
use crate::creators::{CreatorRelease, Creators};
use crate::error::{ClientError, Result};
use crate::subscription::Subscription;
use ferroplasma_protocol::layout::metadata_offset;
use ferroplasma_protocol::pb::{self, reply, request};
use ferroplasma_protocol::{IdHasher, ObjectId};
use memmap2::MmapOptions;
use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

pub use pb::StatsReply as Stats;

/// Outcome of deleting one id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteStatus {
    /// Freed now.
    Deleted,
    /// Referenced or unsealed; freed when the last reference goes.
    Deferred,
    /// No such object.
    NotFound,
}

/// One row of [`Client::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The id.
    pub id: ObjectId,
    /// Data bytes.
    pub data_size: u64,
    /// Metadata bytes.
    pub metadata_size: u64,
    /// References held, over all clients.
    pub ref_count: u64,
    /// True once sealed.
    pub sealed: bool,
    /// Unix time of the create, µs.
    pub create_time_us: i64,
    /// µs from create to seal; `None` while unsealed.
    pub construct_duration_us: Option<i64>,
    /// A delete waits for the last reference to go.
    pub delete_pending: bool,
    /// Its bytes are in the store's spill directory (a get brings them back).
    pub spilled: bool,
    /// In a cluster-wide list: the member holding this copy (empty otherwise).
    pub node: String,
    /// A cached copy pulled from another member.
    pub cached: bool,
}

/// A store's view of its cluster ([`Client::cluster_status`]).
pub type ClusterStatus = pb::ClusterStatusReply;

/// Shared by a client and every buffer it handed out.
#[derive(Debug)]
pub(crate) struct Inner {
    /// The socket's read side; held by the one thread reading replies.
    conn: Mutex<Conn>,
    /// Replies read by one thread for another (see `call`).
    replies: Mutex<Replies>,
    replies_ready: Condvar,
    mapping: Mapping,
    pid: u32,
    fork_generation: u64,
    capacity: u64,
    max_inline: u64,
    socket: PathBuf,
    /// The socket's write side: requests and releases. Held only while
    /// writing, so a release never waits behind a blocking get.
    writer: Mutex<UnixStream>,
    /// References this process holds, per object.
    held: Mutex<HashMap<ObjectId, u64, IdHasher>>,
    /// The creator's reference of each object this client created: its
    /// buffer's drop or an explicit `release` ends it, once.
    creators: Mutex<Creators>,
    /// Releases not sent yet: they go out with the next request, or within
    /// [`RELEASE_DELAY`] by the flusher thread, as one message.
    deferred: Mutex<Deferred>,
    flusher_wake: Condvar,
}

/// How long a release may wait for a request to ride along with.
pub const RELEASE_DELAY: Duration = Duration::from_millis(1);

/// Replies in flight between threads sharing one client.
#[derive(Debug, Default)]
struct Replies {
    next_id: u64,
    /// Replies read by another thread, by request id.
    done: HashMap<u64, pb::Reply>,
    /// A thread is reading the socket now.
    reading: bool,
    /// Threads waiting for another to read their reply.
    waiting: usize,
    /// The connection broke: every waiter gets this error.
    broken: Option<(std::io::ErrorKind, String)>,
}

#[derive(Debug, Default)]
struct Deferred {
    ids: Vec<ObjectId>,
    flusher_started: bool,
    flusher_waiting: bool,
}

/// A connection to a store. Cheap to clone; clones share the connection, and
/// every method may be called from any thread.
///
/// ```no_run
/// use ferroplasma_client::{Client, ObjectId};
/// let client = Client::connect(None)?;
/// let id = ObjectId::random();
/// client.put(id, b"hello", b"")?;
/// let got = client.get(&[id], None)?;
/// assert_eq!(got[0].as_ref().unwrap().data(), b"hello");
/// # Ok::<(), ferroplasma_client::ClientError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl Client {
    /// Connects to the store at `socket` (default: `$FERROPLASMA_SOCKET`,
    /// else `/tmp/ferroplasma.sock`) and maps its memory.
    pub fn connect(socket: Option<&Path>) -> Result<Self> {
        let path = ferroplasma_protocol::default_socket_path(socket);
        let name = format!("rust pid {}", std::process::id());
        let hs = Conn::open(&path, &name)?;
        let arena = hs
            .reply
            .arenas
            .first()
            .ok_or_else(|| ClientError::Protocol("the store announced no arena".into()))?;
        let fd =
            hs.fds.into_iter().next().ok_or_else(|| {
                ClientError::Protocol("the store sent no arena descriptor".into())
            })?;
        let file = File::from(fd);
        // The descriptor is a memfd or an unlinked file owned by the store; it
        // is never truncated while the store runs, so the mapped range stays
        // backed (see the Safety notes in `buffer`).
        let map = MmapOptions::new()
            .len(arena.size as usize)
            .map_raw(&file)
            .map_err(|e| ClientError::Protocol(format!("cannot map the store's memory: {e}")))?;
        let writer = hs
            .conn
            .stream
            .try_clone()
            .map_err(ClientError::Disconnected)?;
        Ok(Self {
            inner: Arc::new(Inner {
                writer: Mutex::new(writer),
                conn: Mutex::new(hs.conn),
                replies: Mutex::new(Replies::default()),
                replies_ready: Condvar::new(),
                mapping: Mapping::new(map),
                pid: std::process::id(),
                fork_generation: crate::fork::generation(),
                capacity: hs.reply.capacity,
                max_inline: hs.reply.max_inline_size,
                socket: path,
                held: Mutex::new(HashMap::default()),
                creators: Mutex::new(Creators::default()),
                deferred: Mutex::new(Deferred::default()),
                flusher_wake: Condvar::new(),
            }),
        })
    }

    /// Bytes the store manages.
    pub fn capacity(&self) -> u64 {
        self.inner.capacity
    }

    /// The socket this client is connected to.
    pub fn socket(&self) -> &Path {
        &self.inner.socket
    }

    /// Creates an object of `data_size` bytes with `metadata`, and returns its
    /// data area to fill; [`Client::seal`] then makes it immutable and
    /// visible. The creator holds a reference, as in Plasma, which ends when
    /// the returned buffer is dropped or at [`Client::release`], whichever
    /// comes first (never twice); until then the object is not evicted. An
    /// object the buffer was dropped for before its seal stays unsealed (and
    /// in the store) until the seal or an abort.
    pub fn create(&self, id: ObjectId, data_size: u64, metadata: &[u8]) -> Result<MutableBuffer> {
        self.create_waiting(id, data_size, metadata, Some(Duration::ZERO))
    }

    /// [`Client::create`] that, when the store is full of referenced
    /// objects, waits up to `wait` (`None`: without limit) for other clients
    /// to release or delete enough, instead of failing at once with
    /// [`ClientError::StoreFull`].
    pub fn create_waiting(
        &self,
        id: ObjectId,
        data_size: u64,
        metadata: &[u8],
        wait: Option<Duration>,
    ) -> Result<MutableBuffer> {
        let wait_ms = match wait {
            None => -1,
            Some(d) if d.is_zero() => 0,
            Some(d) => d.as_millis().clamp(1, i64::MAX as u128) as i64,
        };
        // Metadata over the inline limit is written here, into the arena,
        // instead of travelling in the request.
        let inline = metadata.len() as u64 <= self.inner.max_inline;
        let body = self.call(request::Body::Create(pb::Create {
            object_id: id.0.to_vec(),
            data_size,
            metadata: if inline {
                metadata.to_vec()
            } else {
                Vec::new()
            },
            wait_ms,
            metadata_size: if inline { 0 } else { metadata.len() as u64 },
        }))?;
        let reply::Body::Create(c) = body else {
            return Err(unexpected("Create", &body));
        };
        let loc = c
            .location
            .ok_or_else(|| ClientError::Protocol("Create reply without location".into()))?;
        self.inner.add_held(id);
        let token = self.inner.lock_creators().created(id);
        // From here on, dropping the buffer gives the reference back.
        let mut buf = MutableBuffer {
            inner: self.inner.clone(),
            id,
            token,
            data: std::ptr::null_mut(),
            data_len: loc.data_size as usize,
        };
        buf.data = self.inner.checked_ptr(loc.offset, loc.data_size)?;
        if !inline {
            let at = loc.offset + metadata_offset(loc.data_size);
            let meta = self.inner.checked_ptr(at, metadata.len() as u64)?;
            // Safety: `meta` points at `metadata.len()` bytes inside the
            // mapping (checked above), in the allocation the store just gave
            // this client alone; the source is a distinct Rust slice.
            unsafe { std::ptr::copy_nonoverlapping(metadata.as_ptr(), meta, metadata.len()) };
        }
        Ok(buf)
    }

    /// Makes a created object immutable and visible to every client.
    pub fn seal(&self, id: ObjectId) -> Result<()> {
        self.call(request::Body::Seal(pb::Seal {
            object_id: id.0.to_vec(),
        }))
        .map(drop)
    }

    /// Discards an object this client created and has not sealed (the
    /// store takes the creator's reference with it).
    pub fn abort(&self, id: ObjectId) -> Result<()> {
        self.call(request::Body::Abort(pb::Abort {
            object_id: id.0.to_vec(),
        }))?;
        if self.inner.lock_creators().aborted(id) {
            self.inner.take_held(id);
        }
        Ok(())
    }

    /// Creates, fills and seals an object (no reference is kept): in one
    /// message when data and metadata fit the store's inline limit (8 MiB
    /// together), else as create + copy + seal.
    pub fn create_and_seal(&self, id: ObjectId, data: &[u8], metadata: &[u8]) -> Result<()> {
        if (data.len() as u64).saturating_add(metadata.len() as u64) <= self.inner.max_inline {
            return self
                .call(request::Body::CreateAndSeal(pb::CreateAndSeal {
                    object_id: id.0.to_vec(),
                    data: data.to_vec(),
                    metadata: metadata.to_vec(),
                }))
                .map(drop);
        }
        self.create_copy_seal(id, data, metadata)
    }

    /// Stores `data` and `metadata` under `id`: inline for small objects,
    /// create + copy + seal + release for large ones.
    pub fn put(&self, id: ObjectId, data: &[u8], metadata: &[u8]) -> Result<()> {
        if (data.len() as u64) <= self.inner.max_inline.min(64 * 1024) {
            return self.create_and_seal(id, data, metadata);
        }
        self.create_copy_seal(id, data, metadata)
    }

    fn create_copy_seal(&self, id: ObjectId, data: &[u8], metadata: &[u8]) -> Result<()> {
        let mut buf = self.create(id, data.len() as u64, metadata)?;
        buf.as_mut_slice().copy_from_slice(data);
        if let Err(e) = self.seal(id) {
            let _ = self.abort(id);
            return Err(e);
        }
        self.release(id)
    }

    /// Gets sealed objects, waiting up to `timeout` (`None`: forever,
    /// zero: don't wait) for those not sealed yet. Each entry is `None` if
    /// its object did not appear in time. Each buffer holds a reference,
    /// released when it is dropped.
    pub fn get(
        &self,
        ids: &[ObjectId],
        timeout: Option<Duration>,
    ) -> Result<Vec<Option<ObjectBuffer>>> {
        let timeout_ms = match timeout {
            None => -1,
            Some(d) => d.as_millis().min(i64::MAX as u128) as i64,
        };
        let body = self.call(request::Body::Get(pb::Get {
            object_ids: ferroplasma_protocol::pack_ids(ids),
            timeout_ms,
        }))?;
        let reply::Body::Get(g) = body else {
            return Err(unexpected("Get", &body));
        };
        if g.results.len() != ids.len() {
            return Err(ClientError::Protocol(format!(
                "asked for {} objects, got {} results",
                ids.len(),
                g.results.len()
            )));
        }
        let mut out = Vec::with_capacity(ids.len());
        // Take ownership of every reference first, so that an error below
        // still releases them (through the buffers' Drop).
        {
            let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
            for (id, r) in ids.iter().zip(&g.results) {
                if r.location.is_some() {
                    *held.entry(*id).or_insert(0) += 1;
                }
            }
        }
        let mut error = None;
        for (id, r) in ids.iter().zip(g.results) {
            let Some(loc) = r.location else {
                out.push(None);
                continue;
            };
            let data = self.inner.checked_ptr(loc.offset, loc.data_size);
            let meta = self.inner.checked_ptr(
                loc.offset + metadata_offset(loc.data_size),
                loc.metadata_size,
            );
            match (data, meta) {
                (Ok(d), Ok(m)) => out.push(Some(ObjectBuffer {
                    inner: self.inner.clone(),
                    id: *id,
                    data: d,
                    data_len: loc.data_size as usize,
                    meta: m,
                    meta_len: loc.metadata_size as usize,
                    armed: true,
                })),
                (Err(e), _) | (_, Err(e)) => {
                    self.inner.release_quietly(*id);
                    error.get_or_insert(e);
                    out.push(None);
                }
            }
        }
        match error {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Drops the creator's reference to `id` if this client still holds it
    /// (its [`MutableBuffer`]'s drop then gives nothing back); does nothing
    /// if that buffer already gave it back; else drops one other reference
    /// this client holds to it. Buffers from [`Client::get`] release
    /// themselves when dropped. Never waits: the release reaches the store
    /// with this client's next request, or within [`RELEASE_DELAY`] (1 ms).
    pub fn release(&self, id: ObjectId) -> Result<()> {
        self.inner.check_pid()?;
        if self.inner.lock_creators().release(id) == CreatorRelease::AlreadyEnded {
            return Ok(());
        }
        if !self.inner.take_held(id) {
            return Err(ClientError::NotHeld(id));
        }
        self.inner.defer_releases(vec![id]);
        Ok(())
    }

    /// Releases many buffers at once, sent to the store now as one message.
    pub fn release_buffers(&self, buffers: impl IntoIterator<Item = ObjectBuffer>) -> Result<()> {
        self.inner.check_pid()?;
        let mut ids = Vec::new();
        {
            let mut held = self.inner.held.lock().unwrap_or_else(|p| p.into_inner());
            for mut b in buffers {
                // The reference is given back below, in one message, not by Drop.
                b.armed = false;
                if take_one(&mut held, b.id) {
                    ids.push(b.id);
                }
            }
        }
        self.inner.defer_releases(ids);
        self.inner.write_frames(&[])
    }

    /// Whether each object is sealed in the store.
    pub fn contains(&self, ids: &[ObjectId]) -> Result<Vec<bool>> {
        self.contains_in(ids, false)
    }

    /// Whether each object is sealed in this store or, with `cluster`, on
    /// any live member of its cluster.
    pub fn contains_in(&self, ids: &[ObjectId], cluster: bool) -> Result<Vec<bool>> {
        let body = self.call(request::Body::Contains(pb::Contains {
            object_ids: ferroplasma_protocol::pack_ids(ids),
            cluster,
        }))?;
        match body {
            reply::Body::Contains(c) if c.present.len() == ids.len() => Ok(c.present),
            other => Err(unexpected("Contains", &other)),
        }
    }

    /// Deletes objects: at once when unreferenced, else when the last
    /// reference goes.
    pub fn delete(&self, ids: &[ObjectId]) -> Result<Vec<DeleteStatus>> {
        let body = self.call(request::Body::Delete(pb::Delete {
            object_ids: ferroplasma_protocol::pack_ids(ids),
        }))?;
        match body {
            reply::Body::Delete(d) if d.status.len() == ids.len() => Ok(d
                .status
                .into_iter()
                .map(|s| match pb::DeleteStatus::try_from(s) {
                    Ok(pb::DeleteStatus::Deleted) => DeleteStatus::Deleted,
                    Ok(pb::DeleteStatus::Deferred) => DeleteStatus::Deferred,
                    _ => DeleteStatus::NotFound,
                })
                .collect()),
            other => Err(unexpected("Delete", &other)),
        }
    }

    /// Every object in the store.
    pub fn list(&self) -> Result<Vec<ObjectInfo>> {
        self.list_in(false)
    }

    /// Every object in this store or, with `cluster`, on every live member
    /// of its cluster (each naming its member in [`ObjectInfo::node`]).
    pub fn list_in(&self, cluster: bool) -> Result<Vec<ObjectInfo>> {
        let body = self.call(request::Body::List(pb::List { cluster }))?;
        let reply::Body::List(l) = body else {
            return Err(unexpected("List", &body));
        };
        l.objects
            .into_iter()
            .map(|o| {
                Ok(ObjectInfo {
                    id: ObjectId::from_slice(&o.object_id)
                        .map_err(|e| ClientError::Protocol(e.to_string()))?,
                    data_size: o.data_size,
                    metadata_size: o.metadata_size,
                    ref_count: o.ref_count,
                    sealed: o.state == pb::ObjectState::Sealed as i32,
                    create_time_us: o.create_time_us,
                    construct_duration_us: (o.construct_duration_us >= 0)
                        .then_some(o.construct_duration_us),
                    delete_pending: o.delete_pending,
                    spilled: o.spilled,
                    node: o.node,
                    cached: o.cached,
                })
            })
            .collect()
    }

    /// Evicts least recently used, unreferenced objects until objects of at
    /// least `num_bytes` (data + metadata) are gone. Returns `(their data +
    /// metadata bytes, objects evicted)`.
    pub fn evict(&self, num_bytes: u64) -> Result<(u64, u64)> {
        match self.call(request::Body::Evict(pb::Evict { num_bytes }))? {
            reply::Body::Evict(e) => Ok((e.freed_bytes, e.objects_evicted)),
            other => Err(unexpected("Evict", &other)),
        }
    }

    /// The store's counters and memory figures.
    pub fn stats(&self) -> Result<Stats> {
        match self.call(request::Body::Stats(pb::Stats {}))? {
            reply::Body::Stats(s) => Ok(s),
            other => Err(unexpected("Stats", &other)),
        }
    }

    /// The store's cluster as it sees it: members, their health and use,
    /// and its transfer counters (`enabled` is false for a lone store).
    pub fn cluster_status(&self) -> Result<ClusterStatus> {
        match self.call(request::Body::ClusterStatus(pb::ClusterStatus {}))? {
            reply::Body::ClusterStatus(s) => Ok(s),
            other => Err(unexpected("ClusterStatus", &other)),
        }
    }

    /// Opens a stream of seal and delete events (on a connection of its own).
    pub fn subscribe(&self) -> Result<Subscription> {
        self.subscribe_framed(crate::EventFraming::ReplyFrames)
    }

    /// [`Client::subscribe`] with the events framed as `framing` says on the
    /// socket (`PlasmaFrames`: as Plasma's notification socket, for callers
    /// that read the socket themselves).
    pub fn subscribe_framed(&self, framing: crate::EventFraming) -> Result<Subscription> {
        self.inner.check_pid()?;
        Subscription::open(&self.inner.socket, framing)
    }

    /// Sends a request (after any deferred releases, in the same write) and
    /// waits for its reply.
    ///
    /// Threads sharing the client may have requests in flight at once (the
    /// store answers a later request while an earlier get waits): whichever
    /// waiting thread finds nobody reading reads the next reply and hands it
    /// to its owner, so a thread blocked in a long get holds up no other.
    fn call(&self, body: request::Body) -> Result<reply::Body> {
        self.inner.check_pid()?;
        let inner = &*self.inner;
        let id = {
            let mut r = inner.lock_replies();
            r.next_id += 1;
            r.next_id
        };
        let frame = ferroplasma_protocol::frame::encode_frame(&pb::Request {
            request_id: id,
            body: Some(body),
        });
        inner.write_frames(&frame)?;
        let mut r = inner.lock_replies();
        loop {
            if let Some(reply) = r.done.remove(&id) {
                return unwrap_reply(reply);
            }
            if let Some((kind, msg)) = &r.broken {
                return Err(ClientError::Disconnected(std::io::Error::new(
                    *kind,
                    msg.clone(),
                )));
            }
            if r.reading {
                r.waiting += 1;
                r = inner
                    .replies_ready
                    .wait(r)
                    .unwrap_or_else(|p| p.into_inner());
                r.waiting -= 1;
                continue;
            }
            r.reading = true;
            drop(r);
            let read = inner.lock_conn().read_reply();
            r = inner.lock_replies();
            r.reading = false;
            if r.waiting > 0 {
                inner.replies_ready.notify_all();
            }
            match read {
                Ok(reply) if reply.request_id == id => return unwrap_reply(reply),
                Ok(reply) if reply.request_id == 0 => {
                    // Not an answer to anyone: an error about the stream
                    // itself, sent before the store closes the connection.
                    let msg = match reply.body {
                        Some(reply::Body::Error(e)) => e.message,
                        _ => "unexpected frame from the store".into(),
                    };
                    r.broken = Some((std::io::ErrorKind::InvalidData, msg.clone()));
                    return Err(ClientError::Protocol(msg));
                }
                Ok(reply) => {
                    r.done.insert(reply.request_id, reply);
                }
                Err(e) => {
                    r.broken = Some((std::io::ErrorKind::BrokenPipe, e.to_string()));
                    return Err(e);
                }
            }
        }
    }
}

fn unwrap_reply(reply: pb::Reply) -> Result<reply::Body> {
    match reply.body {
        Some(reply::Body::Error(e)) => Err(e.into()),
        Some(b) => Ok(b),
        None => Err(ClientError::Protocol("empty reply".into())),
    }
}

impl Inner {
    fn lock_replies(&self) -> MutexGuard<'_, Replies> {
        self.replies.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_creators(&self) -> MutexGuard<'_, Creators> {
        self.creators.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// From a [`MutableBuffer`]'s drop: gives the creator's reference back
    /// unless it already went (explicit release, abort) or belongs to a
    /// later object with the same id.
    pub(crate) fn release_creator(self: &Arc<Self>, id: ObjectId, token: u64) {
        if self.check_pid().is_ok() && self.lock_creators().buffer_dropped(id, token) {
            self.release_quietly(id);
        }
    }

    fn lock_conn(&self) -> MutexGuard<'_, Conn> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check_pid(&self) -> Result<()> {
        if crate::fork::generation() != self.fork_generation {
            return Err(ClientError::Forked { parent: self.pid });
        }
        Ok(())
    }

    fn checked_ptr(&self, offset: u64, len: u64) -> Result<*mut u8> {
        self.mapping.ptr(offset, len).ok_or_else(|| {
            ClientError::Protocol(format!(
                "the store pointed at bytes {offset}..{} outside its {}-byte arena",
                offset.saturating_add(len),
                self.mapping.len()
            ))
        })
    }

    fn add_held(&self, id: ObjectId) {
        *self
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id)
            .or_insert(0) += 1;
    }

    /// Decrements the local count; false if the client held none.
    fn take_held(&self, id: ObjectId) -> bool {
        take_one(&mut self.held.lock().unwrap_or_else(|p| p.into_inner()), id)
    }

    /// Writes any deferred releases, then `frames`, in one write.
    fn write_frames(&self, frames: &[u8]) -> Result<()> {
        let ids = std::mem::take(&mut self.lock_deferred().ids);
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let r = if ids.is_empty() {
            if frames.is_empty() {
                return Ok(());
            }
            w.write_all(frames)
        } else {
            let mut out = ferroplasma_protocol::frame::encode_frame(&pb::Request {
                request_id: 0,
                body: Some(request::Body::Release(pb::Release {
                    object_ids: ferroplasma_protocol::pack_ids(&ids),
                })),
            });
            out.extend_from_slice(frames);
            w.write_all(&out)
        };
        r.map_err(ClientError::Disconnected)
    }

    fn lock_deferred(&self) -> MutexGuard<'_, Deferred> {
        self.deferred.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues releases for the next write; makes sure the flusher will send
    /// them within [`RELEASE_DELAY`] if no request comes first.
    fn defer_releases(self: &Arc<Self>, ids: Vec<ObjectId>) {
        if ids.is_empty() {
            return;
        }
        let mut d = self.lock_deferred();
        let was_empty = d.ids.is_empty();
        d.ids.extend(ids);
        if !d.flusher_started {
            d.flusher_started = true;
            let weak = Arc::downgrade(self);
            let spawned = std::thread::Builder::new()
                .name("ferroplasma-release".into())
                .spawn(move || flusher(weak));
            if spawned.is_err() {
                // No thread: send now instead.
                d.flusher_started = false;
                drop(d);
                let _ = self.write_frames(&[]);
            }
        } else if was_empty && d.flusher_waiting {
            self.flusher_wake.notify_one();
        }
    }

    /// Release from a buffer's Drop: errors are dropped (after a fork, or
    /// when the store is gone, there is nobody to tell).
    pub(crate) fn release_quietly(self: &Arc<Self>, id: ObjectId) {
        if self.check_pid().is_ok() && self.take_held(id) {
            self.defer_releases(vec![id]);
        }
    }
}

/// Sends deferred releases that no request took along, at most
/// [`RELEASE_DELAY`] after they were deferred. Sleeps while there are none;
/// ends when the client is gone.
fn flusher(weak: Weak<Inner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        {
            let mut d = inner.lock_deferred();
            while d.ids.is_empty() {
                d.flusher_waiting = true;
                let (g, _) = inner
                    .flusher_wake
                    .wait_timeout(d, Duration::from_millis(200))
                    .unwrap_or_else(|p| p.into_inner());
                d = g;
                d.flusher_waiting = false;
                if d.ids.is_empty() && Arc::strong_count(&inner) == 1 {
                    return; // only this thread still knows the client
                }
            }
        }
        drop(inner);
        std::thread::sleep(RELEASE_DELAY);
        let Some(inner) = weak.upgrade() else { return };
        if inner.check_pid().is_err() || inner.write_frames(&[]).is_err() {
            return;
        }
    }
}

fn take_one(held: &mut HashMap<ObjectId, u64, IdHasher>, id: ObjectId) -> bool {
    match held.get_mut(&id) {
        Some(n) if *n > 1 => {
            *n -= 1;
            true
        }
        Some(_) => {
            held.remove(&id);
            true
        }
        None => false,
    }
}

fn unexpected(what: &str, got: &reply::Body) -> ClientError {
    ClientError::Protocol(format!("unexpected reply to {what}: {got:?}"))
}
