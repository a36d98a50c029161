//! The client side of a scan: a thread that owns the connection once the
//! scan is open, keeps ITERATE requests in flight, lands each BATCH's
//! buffers in one 64-byte-aligned allocation straight from the socket,
//! builds the record batch around them and queues it for the consumer.
//! The consumer reads batch i while batch i+1 arrives.
//!
//! Flow control: at most [`Options::in_flight`] ITERATE requests are
//! outstanding and the queue holds [`Options::queue`] batches; a consumer
//! that stops reading stops the thread reading the socket, and TCP stops the
//! server.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver as Queue, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use arrow_array::{RecordBatch, RecordBatchReader};
use arrow_schema::{ArrowError, SchemaRef};

use crate::error::{Error, Result};
use crate::store_object::{self, Hold, StoreSink};
use crate::{frame, io, layout, region};

/// How a receiver asks for batches.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// The scan's id on the server.
    pub scan: u64,
    /// ITERATE requests kept outstanding.
    pub in_flight: usize,
    /// Batches asked for per ITERATE.
    pub per_iterate: u64,
    /// Bytes asked for per ITERATE (the server stops after the batch that
    /// reaches them).
    pub iterate_bytes: u64,
    /// Received batches queued for the consumer.
    pub queue: usize,
}

/// A running receiver: the consumer's end of the queue.
#[derive(Debug)]
pub struct BatchReceiver {
    schema: SchemaRef,
    queue: Queue<Result<Item>>,
    conn: Arc<OwnedFd>,
    cancelled: Arc<AtomicBool>,
    thread: Option<JoinHandle<bool>>,
    ended: bool,
    untaken: Vec<[u8; 20]>,
}

impl BatchReceiver {
    /// Takes over `conn`, on which scan `opts.scan` was just opened (its
    /// SCAN frame read), and starts receiving its batches: into memory of
    /// its own, or (`store`) into store objects.
    pub fn start(
        conn: OwnedFd,
        schema: SchemaRef,
        opts: Options,
        store: Option<StoreTarget>,
    ) -> Result<BatchReceiver> {
        let conn = Arc::new(conn);
        let (tx, rx) = sync_channel(opts.queue.max(1));
        let cancelled = Arc::new(AtomicBool::new(false));
        let (c, s, stop) = (conn.clone(), schema.clone(), cancelled.clone());
        let thread = std::thread::Builder::new()
            .name("scan receiver".into())
            .spawn(move || receive(&c, &s, opts, store, &tx, &stop))
            .map_err(Error::Io)?;
        Ok(BatchReceiver {
            schema,
            queue: rx,
            conn,
            cancelled,
            thread: Some(thread),
            ended: false,
            untaken: Vec::new(),
        })
    }

    /// The result's schema.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The next batch, waiting up to `wait` for it (see [`Waited`]). The
    /// batch is built and validated here, on the caller's thread.
    pub fn next_within(&mut self, wait: Duration) -> Waited {
        if self.ended {
            return Waited::End;
        }
        let item = self.queue.recv_timeout(wait).map(|r| {
            r.and_then(|item| match item {
                Item::Arrays(received) => received.build().map(Waited::Batch),
                // The hold goes here: the id is the consumer's from now on.
                Item::Stored(id, _hold) => Ok(Waited::Stored(id)),
            })
        });
        match item {
            Ok(Ok(waited)) => waited,
            Ok(Err(e)) => {
                self.ended = true;
                Waited::Failed(e)
            }
            Err(RecvTimeoutError::Timeout) => Waited::Nothing,
            Err(RecvTimeoutError::Disconnected) => {
                self.ended = true;
                Waited::End
            }
        }
    }

    /// A handle that stops this receiver from any thread, without the
    /// receiver itself (which a reader may be blocked in).
    pub fn canceller(&self) -> Canceller {
        Canceller {
            cancelled: self.cancelled.clone(),
            conn: Arc::downgrade(&self.conn),
        }
    }

    /// Ends the scan: a receiver still running drops the connection (the
    /// server then frees the scan). True if the connection ended cleanly
    /// (every batch read and the scan finalized).
    pub fn close(&mut self) -> bool {
        let Some(thread) = self.thread.take() else {
            return false;
        };
        self.ended = true;
        if !thread.is_finished() {
            self.cancelled.store(true, Ordering::Relaxed);
            abort_connection(&self.conn);
        }
        loop {
            // Empties the queue (which wakes a thread waiting on a full one;
            // it may fill again until the thread sees the flag).
            while let Ok(item) = self.queue.try_recv() {
                if let Ok(Item::Stored(id, _)) = item {
                    self.untaken.push(id);
                }
            }
            if thread.is_finished() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let clean = thread.join().unwrap_or(false);
        while let Ok(item) = self.queue.try_recv() {
            if let Ok(Item::Stored(id, _)) = item {
                self.untaken.push(id);
            }
        }
        clean
    }

    /// Ids of batches landed in the store that [`BatchReceiver::close`]
    /// found still queued, never handed out: the caller deletes them.
    pub fn take_untaken(&mut self) -> Vec<[u8; 20]> {
        std::mem::take(&mut self.untaken)
    }
}

impl Drop for BatchReceiver {
    fn drop(&mut self) {
        self.close();
    }
}

/// Stops a [`BatchReceiver`]'s thread: it drops the connection, and a
/// consumer waiting for a batch sees the end.
#[derive(Debug, Clone)]
pub struct Canceller {
    cancelled: Arc<AtomicBool>,
    /// Weak: the handle must not keep the socket open once the receiver is
    /// gone (the server would go on sending into a full window, never told).
    conn: Weak<OwnedFd>,
}

impl Canceller {
    /// Stops the receiving thread (idempotent).
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
        if let Some(conn) = self.conn.upgrade() {
            abort_connection(&conn);
        }
    }
}

/// Ends a scan's connection abortively: the close sends a reset, not a FIN.
/// The server may be blocked sending into this socket's full window; after a
/// FIN alone it would wait there for a window that never reopens (seen as a
/// scan never freed), while a reset fails its send at once. The shutdown
/// wakes this side's receiving thread.
fn abort_connection(conn: &OwnedFd) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // Safety: `conn` is an open socket; the option value is a valid
    // `linger` of the size given.
    unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
        libc::shutdown(conn.as_raw_fd(), libc::SHUT_RDWR);
    }
}

/// What [`BatchReceiver::next_within`] saw.
#[derive(Debug)]
pub enum Waited {
    Batch(RecordBatch),
    /// The id of a batch landed in the store.
    Stored([u8; 20]),
    End,
    Failed(Error),
    /// Nothing yet: ask again.
    Nothing,
}

impl Iterator for BatchReceiver {
    type Item = std::result::Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match self.next_within(Duration::from_secs(3600)) {
                Waited::Batch(b) => return Some(Ok(b)),
                Waited::Stored(_) => {
                    return Some(Err(ArrowError::InvalidArgumentError(
                        "ScanError: this scan lands its batches in a store: take their ids".into(),
                    )))
                }
                Waited::End => return None,
                Waited::Failed(e) => return Some(Err(to_arrow(e))),
                Waited::Nothing => continue,
            }
        }
    }
}

impl RecordBatchReader for BatchReceiver {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

/// An error as the Arrow C stream carries it: a connection's failure as an
/// I/O error, anything else as invalid data, each message naming the kind
/// of error `ferroplasma.errors` would raise.
pub fn to_arrow(e: Error) -> ArrowError {
    let text = match &e {
        Error::Remote { code, .. } => format!("{}: {e}", remote_class(code)),
        Error::Io(_) => format!("ScanServerUnavailable: the scan server hung up: {e}"),
        Error::Protocol(_) => format!("ProtocolError: {e}"),
        Error::Query(_) => format!("QueryError: {e}"),
        Error::Layout(_) => format!("SerializationError: {e}"),
        Error::Store(_) | Error::Closed => format!("ScanError: {e}"),
    };
    match e {
        Error::Io(io) => ArrowError::IoError(text, io),
        _ => ArrowError::InvalidArgumentError(text),
    }
}

/// The `ferroplasma.errors` class for an ERROR frame's code.
pub fn remote_class(code: &str) -> &'static str {
    match code {
        "auth" | "access" => "AccessDenied",
        "dataset" => "DatasetNotFound",
        "query" => "QueryError",
        "protocol" => "ProtocolError",
        "busy" => "ScanServerUnavailable",
        _ => "ScanError",
    }
}

/// The receiving thread: true if the scan ended cleanly (FINALIZED read).
fn receive(
    conn: &OwnedFd,
    schema: &SchemaRef,
    opts: Options,
    mut store: Option<StoreTarget>,
    tx: &SyncSender<Result<Item>>,
    cancelled: &AtomicBool,
) -> bool {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run(conn, schema, opts, store.as_mut(), tx, cancelled)
    }))
    .unwrap_or_else(|_| {
        Err(Error::Protocol(
            "the scan's receiver failed on what the server sent".into(),
        ))
    });
    if !matches!(outcome, Ok(true)) {
        // Nothing half received, nor (sealing late) any batch of a scan
        // that did not end, stays in the store.
        if let Some(target) = store.as_mut() {
            target.sink.abort_unsealed();
        }
    }
    match outcome {
        Ok(clean) => clean,
        Err(e) => {
            if !cancelled.load(Ordering::Relaxed) {
                let _ = tx.send(Err(e));
            }
            false
        }
    }
}

/// Where a receiver lands batches in a store, and how.
pub struct StoreTarget {
    /// Creates, seals and aborts the objects.
    pub sink: Box<dyn StoreSink>,
    /// The result's schema, Arrow IPC (it goes into every object).
    pub schema_ipc: Vec<u8>,
    /// Seal the objects only once the whole result is in (a scan that
    /// fails or a client that dies leaves none); otherwise each batch is
    /// sealed before its id is handed on.
    pub seal_late: bool,
}

impl std::fmt::Debug for StoreTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreTarget")
            .field("seal_late", &self.seal_late)
            .finish_non_exhaustive()
    }
}

/// What the receiving thread queues for the consumer.
#[derive(Debug)]
pub enum Item {
    /// A batch in memory of its own, to build and validate.
    Arrays(Received),
    /// A batch landed in the store: its object's id, and (sealed as it
    /// landed) a reference that keeps it from eviction while it waits.
    Stored([u8; 20], Option<Hold>),
}

fn run(
    conn: &OwnedFd,
    schema: &SchemaRef,
    opts: Options,
    mut store: Option<&mut StoreTarget>,
    tx: &SyncSender<Result<Item>>,
    cancelled: &AtomicBool,
) -> Result<bool> {
    let fd = conn.as_fd();
    let ask = frame::iterate(opts.scan, opts.per_iterate, opts.iterate_bytes);
    let mut in_flight = 0;
    for _ in 0..opts.in_flight.max(1) {
        io::send_all(fd, &[&ask])?;
        in_flight += 1;
    }
    let mut more = true;
    let mut fields = Vec::new();
    let pool = region::RegionPool::shared();
    let mut unsealed: Vec<[u8; 20]> = Vec::new();
    while in_flight > 0 {
        let (head, f) = read_frame(fd, &mut fields)?;
        match head.kind {
            frame::BATCH => {
                let rows = frame::uint(&f, "rows")? as usize;
                let desc = frame::desc(&f)?;
                let mut landed = None;
                let item = match store.as_deref_mut() {
                    None => {
                        Item::Arrays(receive_batch(fd, schema, rows, desc, head.body_len, &pool)?)
                    }
                    Some(target) => {
                        let id =
                            receive_into_store(fd, target, schema, rows, &desc, head.body_len)?;
                        let hold = if target.seal_late {
                            unsealed.push(id);
                            None
                        } else {
                            Some(target.sink.seal(id)?)
                        };
                        landed = Some(id);
                        Item::Stored(id, hold)
                    }
                };
                let handed = !cancelled.load(Ordering::Relaxed) && tx.send(Ok(item)).is_ok();
                if !handed {
                    // The consumer is gone; batches are in flight. An object
                    // just landed would have no owner.
                    if let (Some(target), Some(id)) = (store.as_deref_mut(), landed) {
                        target.sink.discard(id);
                    }
                    return Ok(false);
                }
            }
            frame::DONE | frame::ERROR if head.body_len != 0 => {
                return Err(Error::Protocol("a DONE or ERROR frame with a body".into()))
            }
            frame::DONE => {
                in_flight -= 1;
                more = more && f.get("more").and_then(|v| v.as_bool()).unwrap_or(false);
                if more {
                    io::send_all(fd, &[&ask])?;
                    in_flight += 1;
                }
            }
            frame::ERROR => return Err(frame::remote_error(&f)),
            other => {
                return Err(Error::Protocol(format!(
                    "unexpected frame kind {other} during a scan"
                )))
            }
        }
    }
    io::send_all(fd, &[&frame::finalize(opts.scan)])?;
    loop {
        let (head, f) = read_frame(fd, &mut fields)?;
        match head.kind {
            frame::FINALIZED => break,
            frame::ERROR => return Err(frame::remote_error(&f)),
            _ => io::skip(fd, head.body_len)?,
        }
    }
    if let Some(target) = store {
        for id in unsealed {
            drop(target.sink.seal(id)?); // their ids are the consumer's already
        }
    }
    Ok(true)
}

/// Receives one BATCH frame's body straight into a new store object (its
/// header and the batch's layout written first); the object's id.
fn receive_into_store(
    fd: std::os::fd::BorrowedFd<'_>,
    target: &mut StoreTarget,
    schema: &SchemaRef,
    rows: usize,
    desc: &[i64],
    body_len: u64,
) -> Result<[u8; 20]> {
    let sizes = layout::sizes(desc)?;
    if sizes.iter().try_fold(0u64, |a, &s| a.checked_add(s as u64)) != Some(body_len) {
        return Err(Error::Protocol(
            "a batch's body does not match its descriptor".into(),
        ));
    }
    let lay = store_object::layout(&target.schema_ipc, rows as u64, desc, &sizes)
        .ok_or_else(|| Error::Layout("a batch's object would overflow".into()))?;
    let (id, data) = target.sink.create(lay.total)?;
    // Safety: `data` is the new object's `lay.total` writable bytes; the
    // header and the metadata end before the first buffer's offset, and
    // every buffer's place lies within the object (`layout` placed them).
    unsafe {
        data.copy_from_nonoverlapping(lay.header.as_ptr(), lay.header.len());
        data.add(lay.meta_at)
            .copy_from_nonoverlapping(lay.meta.as_ptr(), lay.meta.len());
    }
    let places: Vec<io::Place> = lay
        .offsets
        .iter()
        .zip(&sizes)
        .map(|(&o, &len)| io::Place {
            // Safety: as above.
            ptr: unsafe { data.add(o) },
            len,
        })
        .collect();
    // Safety: the places are distinct ranges of the object, which only this
    // thread writes until it is sealed.
    unsafe { io::recv_places(fd, &places)? };
    // Validated as the in-memory path is, before anyone can read it: every
    // process on the host reads these objects.
    let owner: Arc<dyn arrow_buffer::alloc::Allocation> = Arc::new(());
    let views = places
        .iter()
        .map(|p| {
            // Safety: `p` is a filled range of the object, alive until the
            // sink seals or aborts it, after these views are gone; `owner`
            // owns nothing, so dropping the views frees nothing.
            unsafe {
                arrow_buffer::Buffer::from_custom_allocation(
                    std::ptr::NonNull::new(p.ptr).unwrap_or(std::ptr::NonNull::dangling()),
                    p.len,
                    owner.clone(),
                )
            }
        })
        .collect();
    if let Err(e) = layout::rebuild(schema, rows, desc, views) {
        target.sink.discard(id);
        return Err(e);
    }
    Ok(id)
}

fn read_frame(
    fd: std::os::fd::BorrowedFd<'_>,
    scratch: &mut Vec<u8>,
) -> Result<(frame::Head, serde_json::Map<String, serde_json::Value>)> {
    let mut raw = [0u8; frame::HEAD_LEN];
    io::recv_exact(fd, &mut raw)?;
    let head = frame::Head::parse(&raw)?;
    scratch.resize(head.fields_len as usize, 0);
    io::recv_exact(fd, scratch)?;
    Ok((head, frame::parse_fields(scratch)?))
}

/// A batch's bytes as received, not yet checked: [`Received::build`] makes
/// the batch (and validates every buffer), on the consumer's thread, so
/// that the next batch arrives meanwhile.
#[derive(Debug)]
pub struct Received {
    schema: SchemaRef,
    rows: usize,
    desc: Vec<i64>,
    bufs: Vec<arrow_buffer::Buffer>,
}

impl Received {
    /// The record batch around the received buffers.
    pub fn build(self) -> Result<RecordBatch> {
        layout::rebuild(&self.schema, self.rows, &self.desc, self.bufs)
    }
}

/// Receives one BATCH frame's body straight into aligned memory.
pub fn receive_batch(
    fd: std::os::fd::BorrowedFd<'_>,
    schema: &SchemaRef,
    rows: usize,
    desc: Vec<i64>,
    body_len: u64,
    pool: &Arc<region::RegionPool>,
) -> Result<Received> {
    let sizes = layout::sizes(&desc)?;
    if sizes.iter().try_fold(0u64, |a, &s| a.checked_add(s as u64)) != Some(body_len) {
        return Err(Error::Protocol(
            "a batch's body does not match its descriptor".into(),
        ));
    }
    let landing = region::Landing::new(sizes, pool)?;
    // Safety: the places are `landing`'s, writable and not otherwise used.
    unsafe { io::recv_places(fd, &landing.places())? };
    Ok(Received {
        schema: schema.clone(),
        rows,
        // Safety: `recv_places` filled every place or failed above.
        bufs: unsafe { landing.buffers() },
        desc,
    })
}
