//! [`Client`]: the blocking API over one connection to a store.

use crate::buffer::{MutableBuffer, ObjectBuffer};
use crate::error::{ClientError, Result};
use crate::session::Session;
use crate::shared_table::TableView;
use crate::subscription::Subscription;
use ferroplasma_protocol::fast_writes;
use ferroplasma_protocol::frame::MAX_IDS_PER_REQUEST;
use ferroplasma_protocol::layout::metadata_offset;
use ferroplasma_protocol::pb::{self, reply, request};
use ferroplasma_protocol::shared_table;
use ferroplasma_protocol::ObjectId;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use crate::releases::RELEASE_DELAY;

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

/// A store's view of its cluster ([`Client::cluster_status`]).
pub type ClusterStatus = pb::ClusterStatusReply;

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
    pub(crate) inner: Arc<Session>,
}

impl Client {
    /// Connects to the store at `socket` (default: `$FERROPLASMA_SOCKET`,
    /// else `/tmp/ferroplasma.sock`) and maps its memory.
    ///
    /// The store must be run by this user or root, or by a uid named in
    /// `$FERROPLASMA_TRUST_UID` ([`crate::trust`]); any other is refused
    /// with [`ClientError::PermissionDenied`] before anything is sent.
    pub fn connect(socket: Option<&Path>) -> Result<Self> {
        Self::connect_trusting(socket, &[])
    }

    /// [`Client::connect`] that also accepts a store run by one of
    /// `uids` (a store another user runs for you).
    pub fn connect_trusting(socket: Option<&Path>, uids: &[u32]) -> Result<Self> {
        let path = ferroplasma_protocol::default_socket_path(socket);
        let trust = crate::trust::Trust::from_env()?.with_uids(uids);
        Ok(Self {
            inner: Arc::new(Session::open(path, trust)?),
        })
    }

    /// Whether this client may only read (its user is another one the
    /// store allows, docs/security.md): it can get, contains, list, stats
    /// and subscribe, but not create, delete or evict objects.
    pub fn read_only(&self) -> bool {
        self.inner.read_only
    }

    /// Bytes the store manages.
    pub fn capacity(&self) -> u64 {
        self.inner.capacity
    }

    /// The socket this client is connected to.
    pub fn socket(&self) -> &Path {
        self.inner.socket()
    }

    /// Creates an object of `data_size` bytes with `metadata`, and returns its
    /// data area to fill; [`Client::seal`] then makes it immutable and
    /// visible. The creator holds a reference, as in Plasma: it passes from
    /// the buffer to the sealed buffer `seal` returns, and ends when that is
    /// dropped; until then the object is not evicted.
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
        if let Some(buf) = self.create_fast(id, data_size, metadata)? {
            return Ok(buf);
        }
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
        let buf = self.writable(id, loc.offset, loc.data_size, loc.metadata_size, None)?;
        let meta = buf.meta as *mut u8;
        if !inline {
            if loc.metadata_size != metadata.len() as u64 {
                return Err(ClientError::Protocol(format!(
                    "asked for {} bytes of metadata, the store made room for {}",
                    metadata.len(),
                    loc.metadata_size
                )));
            }
            // Safety: `meta` points at `metadata.len()` bytes inside the
            // mapping (checked above), in the allocation the store just gave
            // this client alone; the source is a distinct Rust slice.
            unsafe { std::ptr::copy_nonoverlapping(metadata.as_ptr(), meta, metadata.len()) };
        }
        Ok(buf)
    }

    /// Makes a created object immutable and visible to every client. The
    /// writable buffer is consumed (no writable slice outlives the seal);
    /// the read-only buffer returned holds the creator's reference. On an
    /// error the reference is given back with the buffer.
    pub fn seal(&self, mut buf: MutableBuffer) -> Result<ObjectBuffer> {
        if let Some(f) = buf.fast.take() {
            self.inner.check_pid()?;
            let w = self.inner.fast_writer_if_open().ok_or_else(|| {
                ClientError::Protocol("a buffer created without a round trip, and no ring".into())
            })?;
            w.end(&*self.inner, buf.id, fast_writes::SEAL, f.lease)?;
            return Ok(buf.into_sealed());
        }
        self.call(request::Body::Seal(pb::Seal {
            object_id: buf.id.0.to_vec(),
        }))?;
        Ok(buf.into_sealed())
    }

    /// Discards an object this client created and has not sealed; the
    /// buffer is consumed (nothing can write into memory the store may give
    /// to another object), and the store takes the creator's reference with
    /// the object.
    pub fn abort(&self, mut buf: MutableBuffer) -> Result<()> {
        let id = buf.id;
        if let Some(f) = buf.fast.take() {
            self.inner.check_pid()?;
            if let Some(w) = self.inner.fast_writer_if_open() {
                w.end(&*self.inner, id, fast_writes::ABORT, f.lease)?;
            }
            buf.armed = false;
            if self.inner.releases.creators().aborted(id) {
                self.inner.releases.take_held(id);
            }
            return Ok(());
        }
        self.call(request::Body::Abort(pb::Abort {
            object_id: id.0.to_vec(),
        }))?;
        buf.armed = false;
        if self.inner.releases.creators().aborted(id) {
            self.inner.releases.take_held(id);
        }
        Ok(())
    }

    /// Creates, fills and seals an object (no reference is kept): in one
    /// message when data and metadata fit the store's inline limit (8 MiB
    /// together), else as create + copy + seal.
    pub fn create_and_seal(&self, id: ObjectId, data: &[u8], metadata: &[u8]) -> Result<()> {
        if self.create_and_seal_fast(id, data, metadata)? {
            return Ok(());
        }
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

    /// The buffer of an object this client just created at `offset`,
    /// holding the creator's reference (given back when it is dropped).
    pub(crate) fn writable(
        &self,
        id: ObjectId,
        offset: u64,
        data_size: u64,
        metadata_size: u64,
        fast: Option<crate::fast_writes::FastCreate>,
    ) -> Result<MutableBuffer> {
        self.inner.releases.add_held(id);
        let token = self.inner.releases.creators().created(id);
        // From here on, dropping the buffer gives the reference back.
        let mut buf = MutableBuffer {
            session: self.inner.clone(),
            id,
            token,
            data: std::ptr::null_mut(),
            data_len: data_size as usize,
            meta: std::ptr::null(),
            meta_len: metadata_size as usize,
            armed: true,
            fast,
        };
        buf.data = self.inner.checked_ptr(offset, data_size)?;
        buf.meta = self
            .inner
            .checked_ptr(offset + metadata_offset(data_size), metadata_size)?;
        Ok(buf)
    }

    fn create_copy_seal(&self, id: ObjectId, data: &[u8], metadata: &[u8]) -> Result<()> {
        let mut buf = self.create(id, data.len() as u64, metadata)?;
        buf.as_mut_slice().copy_from_slice(data);
        // Dropping the sealed buffer gives the creator's reference back.
        self.seal(buf).map(drop)
    }

    /// A buffer over a sealed object's bytes in the arena (bounds checked),
    /// holding a reference (`hold`: a hold on that slot of the shared table).
    pub(crate) fn buffer(
        &self,
        id: ObjectId,
        offset: u64,
        data_size: u64,
        metadata_size: u64,
        hold: Option<(Arc<TableView>, usize)>,
    ) -> Result<ObjectBuffer> {
        let data = self.inner.checked_ptr(offset, data_size)?;
        let meta = self
            .inner
            .checked_ptr(offset + metadata_offset(data_size), metadata_size)?;
        Ok(ObjectBuffer {
            session: self.inner.clone(),
            id,
            data,
            data_len: data_size as usize,
            meta,
            meta_len: metadata_size as usize,
            armed: true,
            creator: None,
            hold,
        })
    }

    /// [`Client::get`], asking the store for every object, in requests of at most
    /// [`MAX_IDS_PER_REQUEST`] ids (the store's limit), one after another
    /// within one deadline: any batch size works.
    pub(crate) fn get_from_store(
        &self,
        ids: &[ObjectId],
        timeout: Option<Duration>,
    ) -> Result<Vec<Option<ObjectBuffer>>> {
        if ids.len() <= MAX_IDS_PER_REQUEST {
            return self.get_one_request(ids, timeout);
        }
        // No deadline: no timeout, or one too long to have one
        // (Duration::MAX), and both wait forever.
        let deadline = timeout.and_then(|t| std::time::Instant::now().checked_add(t));
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(MAX_IDS_PER_REQUEST) {
            let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
            out.extend(self.get_one_request(chunk, left)?);
        }
        Ok(out)
    }

    fn get_one_request(
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
        self.inner.releases.add_held_all(
            ids.iter()
                .zip(&g.results)
                .filter(|(_, r)| r.location.is_some())
                .map(|(id, _)| id),
        );
        let mut error = None;
        for (id, r) in ids.iter().zip(g.results) {
            let Some(loc) = r.location else {
                out.push(None);
                continue;
            };
            match self.buffer(*id, loc.offset, loc.data_size, loc.metadata_size, None) {
                Ok(b) => out.push(Some(b)),
                Err(e) => {
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

    /// Plasma's `Release`, kept for code written against it. References
    /// belong to buffers (a get's buffer, the buffer `create` returns and
    /// the sealed buffer `seal` turns it into), and each gives its
    /// reference back when dropped, so that the store never reuses memory
    /// a live buffer still reads; this only checks that the client holds
    /// `id` (or created it): [`ClientError::NotHeld`] otherwise.
    pub fn release(&self, id: ObjectId) -> Result<()> {
        self.inner.release_explicitly(id)
    }

    /// Releases many buffers at once, sent to the store now as one message.
    pub fn release_buffers(&self, buffers: impl IntoIterator<Item = ObjectBuffer>) -> Result<()> {
        let mut ids = Vec::new();
        for mut b in buffers {
            if b.hold.is_some() {
                drop(b); // a hold on the shared table: given back here
                continue;
            }
            // The reference is given back below, in one message, not by Drop.
            b.armed = false;
            let give_back = match b.creator {
                Some(token) => self.inner.releases.creators().buffer_dropped(b.id, token),
                None => true,
            };
            if give_back {
                ids.push(b.id);
            }
        }
        self.inner.release_now(ids)
    }

    /// Whether each object is sealed in the store.
    pub fn contains(&self, ids: &[ObjectId]) -> Result<Vec<bool>> {
        self.contains_in(ids, false)
    }

    /// Whether each object is sealed in this store or, with `cluster`, on
    /// any live member of its cluster.
    pub fn contains_in(&self, ids: &[ObjectId], cluster: bool) -> Result<Vec<bool>> {
        self.contains_with(ids, cluster, false)
    }

    /// Plasma's contains: [`Client::contains`], and true while a delete
    /// waits for the object's last reference.
    pub fn contains_deleting(&self, ids: &[ObjectId]) -> Result<Vec<bool>> {
        self.contains_with(ids, false, true)
    }

    fn contains_with(&self, ids: &[ObjectId], cluster: bool, deleting: bool) -> Result<Vec<bool>> {
        if let Some(tables) = self.inner.table.as_ref() {
            self.inner.check_pid()?;
            // Sealed local objects are in the shared table; only the others
            // (being created, spilled, or elsewhere) need the store.
            let mut table = tables.current();
            let mut found: Vec<bool> = ids.iter().map(|id| table.contains(id)).collect();
            if !found.iter().all(|&f| f) {
                if let Some(next) = self.inner.table_after(&table) {
                    table = next;
                    found = ids.iter().map(|id| table.contains(id)).collect();
                }
            }
            if found.iter().all(|&f| f) {
                table.count(shared_table::COUNT_CONTAINS);
                return Ok(found);
            }
        }
        let mut present = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(MAX_IDS_PER_REQUEST) {
            let body = self.call(request::Body::Contains(pb::Contains {
                object_ids: ferroplasma_protocol::pack_ids(chunk),
                cluster,
                deleting,
            }))?;
            match body {
                reply::Body::Contains(c) if c.present.len() == chunk.len() => {
                    present.extend(c.present)
                }
                other => return Err(unexpected("Contains", &other)),
            }
        }
        Ok(present)
    }

    /// Deletes objects: at once when unreferenced, else when the last
    /// reference goes. Any number of ids: they go in requests of at most
    /// [`MAX_IDS_PER_REQUEST`], one after another; if one fails, the
    /// objects of the requests before it are deleted already.
    pub fn delete(&self, ids: &[ObjectId]) -> Result<Vec<DeleteStatus>> {
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(MAX_IDS_PER_REQUEST) {
            let body = self.call(request::Body::Delete(pb::Delete {
                object_ids: ferroplasma_protocol::pack_ids(chunk),
            }))?;
            match body {
                reply::Body::Delete(d) if d.status.len() == chunk.len() => out.extend(
                    d.status
                        .into_iter()
                        .map(|s| match pb::DeleteStatus::try_from(s) {
                            Ok(pb::DeleteStatus::Deleted) => DeleteStatus::Deleted,
                            Ok(pb::DeleteStatus::Deferred) => DeleteStatus::Deferred,
                            _ => DeleteStatus::NotFound,
                        }),
                ),
                other => return Err(unexpected("Delete", &other)),
            }
        }
        Ok(out)
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

    /// Opens a stream of seal and delete events (on a connection of its own)
    /// from now on.
    pub fn subscribe(&self) -> Result<Subscription> {
        self.subscribe_with(crate::EventFraming::ReplyFrames, false)
    }

    /// [`Client::subscribe`] with the events framed as `framing` says on the
    /// socket (`PlasmaFrames`: as Plasma's notification socket, for callers
    /// that read the socket themselves); with `existing`, the stream starts
    /// with a seal event for every object already sealed, oldest first (as
    /// Plasma's subscriptions did).
    pub fn subscribe_with(
        &self,
        framing: crate::EventFraming,
        existing: bool,
    ) -> Result<Subscription> {
        self.inner.check_pid()?;
        Subscription::open(self.inner.socket(), &self.inner.trust, framing, existing)
    }

    pub(crate) fn call(&self, body: request::Body) -> Result<reply::Body> {
        self.inner.call(body)
    }
}

pub(crate) fn unexpected(what: &str, got: &reply::Body) -> ClientError {
    ClientError::Protocol(format!("unexpected reply to {what}: {got:?}"))
}
