//! Bulk transport: object bytes between members, straight from one arena to
//! another with no staging copy on either side, many objects per request.
//!
//! The interface is [`Transport`] (pull a batch of objects from a member
//! into a [`Landing`]) and [`Source`] (pin local objects while they are
//! sent). The TCP implementation, [`TcpTransport`] and [`serve_tcp`], is
//! the one in use; an RDMA one (UCX or libfabric, registering the arena
//! once) would implement the same two traits.
//!
//! TCP wire format (all integers little-endian):
//! - on connect, the puller sends `FPB2`, a u16 token length and the token;
//!   a wrong token closes the connection;
//! - then, any number of times, a request: u8 kind ([`PULL`], or
//!   [`LOOKUP`] to the ids' directory owner), u32 `n` (1 to
//!   [`MAX_PULL_IDS`]) and `n` 20-byte ids. The member answers the ids in
//!   order, in frames: u32 `k` (objects in this frame), u32 header length,
//!   then the header block, per object u8 status (`0`: not here, `1`: here,
//!   `2`: not here, and its directory entry follows, `3`: here but not
//!   sendable: its metadata is over [`MAX_INLINE_SIZE`]), u64 data size, u32
//!   length of what follows and that: the metadata (`1`) or the entry, a
//!   protobuf `ferroplasma.cluster.v1.Entry` (`2`); then the data block,
//!   the data of the frame's objects that are here, one after another.
//!
//! A [`LOOKUP`] is a directory lookup and a pull in one round trip: the
//! owner of an id sends the object when it holds it and says where it is
//! otherwise, so a get of an object its owner holds costs one round trip.
//!
//! A frame holds at most [`FRAME_OBJECTS`] objects and, past its first
//! object, at most [`FRAME_BYTES`] of data, so the holder pins a bounded
//! amount at a time while the stream never pauses between frames. The
//! holder sends a frame with one gathering `writev` from its arena; the
//! puller allocates the frame's objects once their sizes are known and
//! receives the data block with scattering `readv`s straight into those
//! allocations: a thousand 1 kB objects are one request, one frame and a
//! few system calls on each side.
//!
//! Idle connections are pooled per member and reused by later pulls. The
//! serving side caps its connections and closes those that send no hello
//! in time or stay idle (crate::guard; docs/cluster.md, "Network ports").

use crate::arena::Arena;
use crate::guard::Guard;
use ferroplasma_protocol::frame::MAX_INLINE_SIZE;
use ferroplasma_protocol::ObjectId;
use std::collections::HashMap;
use std::future::Future;
use std::io::{IoSlice, IoSliceMut};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MAGIC: &[u8; 4] = b"FPB2";
/// Request kind: send what is here.
pub const PULL: u8 = 1;
/// Request kind: send what is here, and the directory entry of the rest.
pub const LOOKUP: u8 = 2;
/// Most ids in one pull request.
pub const MAX_PULL_IDS: usize = 1 << 16;
/// Most objects in one frame of an answer.
pub const FRAME_OBJECTS: usize = 256;
/// Most data bytes in one frame, past its first object.
pub const FRAME_BYTES: u64 = 16 << 20;
/// Header bytes after which a frame takes no further object.
const FRAME_HEADER: usize = 256 << 10;
/// The longest header block a puller accepts: a full frame plus one
/// object with the largest metadata.
const MAX_HEADER: usize = FRAME_HEADER + OBJECT_HEAD + MAX_INLINE_SIZE as usize;
/// Status, data size and metadata size of one object in a header block.
const OBJECT_HEAD: usize = 13;
/// Most buffers handed to one `writev`/`readv` (Linux's IOV_MAX).
const IOV_MAX: usize = 1024;
/// Pulls from one member at a time (and so connections to it, at most).
pub const POOL_PER_PEER: usize = 8;

/// Why a pull failed.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// The member could not be reached or the connection broke.
    #[error("transfer from {peer} failed: {source}")]
    Io {
        /// The member's bulk address.
        peer: String,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// The member stopped sending for longer than the timeout.
    #[error("transfer from {0} stalled")]
    Stalled(String),
    /// The member sent something that is not the protocol.
    #[error("transfer from {peer}: {what}")]
    Protocol {
        /// The member's bulk address.
        peer: String,
        /// What was wrong.
        what: String,
    },
}

/// One object of a frame, as the holder announced it.
#[derive(Debug, Clone, Copy)]
pub struct Arrival<'m> {
    /// Its position in the pull request.
    pub index: usize,
    /// Data bytes to come.
    pub data_size: u64,
    /// Its metadata (already received).
    pub metadata: &'m [u8],
}

/// Why an object of a request did not come.
#[derive(Debug, Clone, Copy)]
pub enum Absent<'e> {
    /// The member does not have it.
    NotHere,
    /// The member does not have it; its directory entry (protobuf), for a
    /// [`LOOKUP`].
    Entry(&'e [u8]),
    /// The member has it, but it cannot be sent (metadata over
    /// [`MAX_INLINE_SIZE`]).
    Unsendable,
}

/// Where pulled objects land: the local store allocates each frame's
/// objects once their sizes are known. Objects allocated and not yet
/// [`Landing::arrived`] when the pull fails, or when the landing is
/// dropped, are discarded.
pub trait Landing: Send {
    /// Allocates one frame's objects, each with its metadata in place, and
    /// returns for each the bytes to receive its data into, or `None` when
    /// it cannot be taken here (its bytes are then read and dropped; the
    /// landing keeps the reason).
    fn allocate<'s>(&'s mut self, objects: &[Arrival<'_>]) -> Vec<Option<&'s mut [u8]>>;
    /// Every object of the last [`Landing::allocate`] was received whole.
    fn arrived(&mut self);
    /// The request's object at `index` does not come, for that reason.
    fn not_there(&mut self, index: usize, why: Absent<'_>);
}

/// One pinned object: where its bytes lie in the arena.
#[derive(Debug, Clone, Copy)]
pub struct PinnedObject {
    /// Whether its bytes were copied into [`Pinned::copies`] (the offsets
    /// are then into that buffer) instead of being held in the arena.
    pub copied: bool,
    /// Data offset.
    pub offset: u64,
    /// Data size.
    pub data_size: u64,
    /// Metadata offset.
    pub metadata_offset: u64,
    /// Metadata size.
    pub metadata_size: u64,
}

/// Local sealed objects held (referenced) while they are sent, or copied
/// out (small ones: a copy costs less than a reference taken and given
/// back); dropping it gives the references back, all at once.
pub struct Pinned {
    /// The arena the held ones lie in.
    pub arena: Arc<Arena>,
    /// One per id asked for, in order, up to where pinning stopped; `None`
    /// for an object that is not here.
    pub objects: Vec<Option<PinnedObject>>,
    /// The bytes (metadata, then data) of the copied ones.
    pub copies: Vec<u8>,
    /// Gives the references back.
    pub unpin: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl Pinned {
    /// The data of `o`, one of `self.objects`.
    pub fn data(&self, o: &PinnedObject) -> &[u8] {
        self.bytes(o.copied, o.offset, o.data_size)
    }

    /// The metadata of `o`, one of `self.objects`.
    pub fn metadata(&self, o: &PinnedObject) -> &[u8] {
        self.bytes(o.copied, o.metadata_offset, o.metadata_size)
    }

    fn bytes(&self, copied: bool, offset: u64, len: u64) -> &[u8] {
        if copied {
            &self.copies[offset as usize..(offset + len) as usize]
        } else {
            self.arena.bytes(offset, len)
        }
    }
}

impl std::fmt::Debug for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pinned")
            .field("objects", &self.objects)
            .finish_non_exhaustive()
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Some(f) = self.unpin.take() {
            f();
        }
    }
}

/// The local objects a member serves to others.
pub trait Source: Send + Sync {
    /// Pins sealed objects for sending, in the order of `ids`, and stops
    /// after the first object that brings the data pinned to `max_bytes`
    /// or more (at least one entry when `ids` is not empty). May block (to
    /// bring spilled objects back) when [`Source::is_spilled`] says so: the
    /// caller then runs it on a blocking thread.
    fn pin(&self, ids: &[ObjectId], max_bytes: u64) -> Pinned;
    /// Whether pinning any of `ids` has to read it back from disk first.
    fn is_spilled(&self, _ids: &[ObjectId]) -> bool {
        false
    }
    /// The directory entries of `ids` (protobuf), for a [`LOOKUP`] of
    /// objects that are not here; empty: no entry.
    fn entries(&self, ids: &[ObjectId]) -> Vec<Vec<u8>> {
        vec![Vec::new(); ids.len()]
    }
    /// Counts objects sent.
    fn served(&self, objects: u64, bytes: u64);
}

/// The boxed future a [`Transport`] pull returns.
pub type PullFuture<'a> = Pin<Box<dyn Future<Output = Result<(), TransferError>> + Send + 'a>>;

/// Pulls objects from other members.
pub trait Transport: Send + Sync + std::fmt::Debug {
    /// Pulls `ids` (at most [`MAX_PULL_IDS`]) from the member whose bulk
    /// address is `peer` into `landing`, in one request of `kind`
    /// ([`PULL`] or [`LOOKUP`]).
    fn pull<'a>(
        &'a self,
        peer: &'a str,
        kind: u8,
        ids: &'a [ObjectId],
        landing: &'a mut dyn Landing,
    ) -> PullFuture<'a>;
    /// Forgets pooled connections to `peer` (it died or restarted).
    fn forget(&self, peer: &str);
}

/// Bulk transfers over TCP.
#[derive(Debug)]
pub struct TcpTransport {
    token: Arc<str>,
    stall: Duration,
    pool: Mutex<HashMap<String, Vec<TcpStream>>>,
    /// Bounds concurrent pulls per member.
    slots: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

/// How far a pull got: whether anything of the answer was taken in (a
/// broken pooled connection is retried on a fresh one only before that).
#[derive(Debug, Default)]
struct Progress {
    answered: usize,
}

impl TcpTransport {
    /// A transport presenting `token`, giving up on a member silent for `stall`.
    pub fn new(token: Arc<str>, stall: Duration) -> Self {
        Self {
            token,
            stall,
            pool: Mutex::new(HashMap::new()),
            slots: Mutex::new(HashMap::new()),
        }
    }

    fn slots(&self, peer: &str) -> Arc<tokio::sync::Semaphore> {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(peer.to_string())
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(POOL_PER_PEER)))
            .clone()
    }

    fn pooled(&self, peer: &str) -> Option<TcpStream> {
        self.pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(peer)
            .and_then(Vec::pop)
    }

    fn give_back(&self, peer: &str, s: TcpStream) {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        let v = pool.entry(peer.to_string()).or_default();
        if v.len() < POOL_PER_PEER {
            v.push(s);
        }
    }

    async fn connect(&self, peer: &str) -> Result<TcpStream, TransferError> {
        let io = |source| TransferError::Io {
            peer: peer.into(),
            source,
        };
        let s = tokio::time::timeout(self.stall, TcpStream::connect(peer))
            .await
            .map_err(|_| TransferError::Stalled(peer.into()))?
            .map_err(io)?;
        s.set_nodelay(true).map_err(io)?;
        Ok(s)
    }

    /// A request of `kind` for `ids`, after the hello when `fresh` (a new
    /// connection).
    fn request(&self, fresh: bool, kind: u8, ids: &[ObjectId]) -> Vec<u8> {
        let mut request = Vec::with_capacity(6 + self.token.len() + 5 + ids.len() * ObjectId::LEN);
        if fresh {
            request.extend_from_slice(MAGIC);
            request.extend_from_slice(&(self.token.len() as u16).to_le_bytes());
            request.extend_from_slice(self.token.as_bytes());
        }
        request.push(kind);
        request.extend_from_slice(&(ids.len() as u32).to_le_bytes());
        for id in ids {
            request.extend_from_slice(id.as_bytes());
        }
        request
    }

    /// Sends `request` (for `n` objects) and takes in the answer, frame by
    /// frame.
    async fn pull_on(
        &self,
        s: &mut TcpStream,
        peer: &str,
        request: &[u8],
        n: usize,
        landing: &mut dyn Landing,
        progress: &mut Progress,
    ) -> Result<(), TransferError> {
        let io = |source| TransferError::Io {
            peer: peer.into(),
            source,
        };
        let protocol = |what: String| TransferError::Protocol {
            peer: peer.into(),
            what,
        };
        s.write_all(request).await.map_err(io)?;
        let mut header = Vec::new();
        let mut sink = Vec::new();
        while progress.answered < n {
            let mut head = [0u8; 8];
            read_exact(s, peer, self.stall, &mut head).await?;
            let k = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
            let len = u32::from_le_bytes(head[4..].try_into().expect("4 bytes")) as usize;
            if k == 0 || k > n - progress.answered || k > FRAME_OBJECTS {
                return Err(protocol(format!(
                    "a frame of {k} objects with {} unanswered",
                    n - progress.answered
                )));
            }
            if len > MAX_HEADER {
                return Err(protocol(format!("a header block of {len} bytes")));
            }
            header.resize(len, 0);
            read_exact(s, peer, self.stall, &mut header).await?;
            let first = progress.answered;
            let (arrivals, missing) = parse_header(&header, first, k).map_err(protocol)?;
            progress.answered += k;
            for (index, entry) in missing {
                landing.not_there(index, entry);
            }
            if arrivals.is_empty() {
                continue;
            }
            let sizes: Vec<u64> = arrivals.iter().map(|a| a.data_size).collect();
            let regions = landing.allocate(&arrivals);
            receive_data(s, peer, self.stall, regions, &sizes, &mut sink).await?;
            landing.arrived();
        }
        Ok(())
    }
}

/// What a header block says of the objects that do not come: their
/// indices, and why.
type Missing<'b> = Vec<(usize, Absent<'b>)>;

/// Splits a header block into the objects here and those that are not.
fn parse_header(
    block: &[u8],
    first: usize,
    k: usize,
) -> Result<(Vec<Arrival<'_>>, Missing<'_>), String> {
    let mut arrivals = Vec::with_capacity(k);
    let mut missing = Vec::new();
    let mut at = 0usize;
    for index in first..first + k {
        let head = block
            .get(at..at + OBJECT_HEAD)
            .ok_or("a header block too short for its objects")?;
        let data_size = u64::from_le_bytes(head[1..9].try_into().expect("8 bytes"));
        let meta = u32::from_le_bytes(head[9..13].try_into().expect("4 bytes")) as usize;
        at += OBJECT_HEAD;
        if meta as u64 > MAX_INLINE_SIZE {
            return Err(format!("metadata or entry of {meta} bytes"));
        }
        let extra = block
            .get(at..at + meta)
            .ok_or("a header block too short for its metadata")?;
        at += meta;
        match head[0] {
            0 => missing.push((index, Absent::NotHere)),
            1 => arrivals.push(Arrival {
                index,
                data_size,
                metadata: extra,
            }),
            2 => missing.push((index, Absent::Entry(extra))),
            3 => missing.push((index, Absent::Unsendable)),
            other => return Err(format!("status byte {other}")),
        }
    }
    if at != block.len() {
        return Err("a header block longer than its objects".into());
    }
    Ok((arrivals, missing))
}

/// Receives a frame's data block: into each object's region, or into
/// `sink` (dropped) for an object that found no room. Consecutive regions
/// are filled by one scattering read where the socket has their bytes.
async fn receive_data(
    s: &mut TcpStream,
    peer: &str,
    stall: Duration,
    mut regions: Vec<Option<&mut [u8]>>,
    sizes: &[u64],
    sink: &mut Vec<u8>,
) -> Result<(), TransferError> {
    let mut i = 0;
    while i < regions.len() {
        if regions[i].is_none() {
            // Read and drop what this store could not take.
            let mut left = sizes[i];
            sink.resize(sink.len().max(1 << 20), 0);
            while left > 0 {
                let n = left.min(sink.len() as u64) as usize;
                read_exact(s, peer, stall, &mut sink[..n]).await?;
                left -= n as u64;
            }
            i += 1;
            continue;
        }
        let run = regions[i..]
            .iter()
            .take_while(|r| r.is_some())
            .take(IOV_MAX)
            .count();
        let mut slices: Vec<IoSliceMut<'_>> = regions[i..i + run]
            .iter_mut()
            .filter_map(|r| r.as_deref_mut())
            .filter(|r| !r.is_empty())
            .map(IoSliceMut::new)
            .collect();
        read_vectored_exact(s, peer, stall, &mut slices).await?;
        i += run;
    }
    Ok(())
}

/// Fills every slice from the socket, with as few `readv`s as the data's
/// arrival allows.
async fn read_vectored_exact(
    s: &mut TcpStream,
    peer: &str,
    stall: Duration,
    slices: &mut [IoSliceMut<'_>],
) -> Result<(), TransferError> {
    let io = |source| TransferError::Io {
        peer: peer.into(),
        source,
    };
    let mut bufs = slices;
    while !bufs.is_empty() {
        tokio::time::timeout(stall, s.readable())
            .await
            .map_err(|_| TransferError::Stalled(peer.into()))?
            .map_err(io)?;
        match s.try_read_vectored(bufs) {
            Ok(0) => return Err(io(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => IoSliceMut::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(io(e)),
        }
    }
    Ok(())
}

async fn read_exact(
    s: &mut TcpStream,
    peer: &str,
    stall: Duration,
    buf: &mut [u8],
) -> Result<(), TransferError> {
    match tokio::time::timeout(stall, s.read_exact(buf)).await {
        Err(_) => Err(TransferError::Stalled(peer.into())),
        Ok(Err(source)) => Err(TransferError::Io {
            peer: peer.into(),
            source,
        }),
        Ok(Ok(_)) => Ok(()),
    }
}

impl Transport for TcpTransport {
    fn pull<'a>(
        &'a self,
        peer: &'a str,
        kind: u8,
        ids: &'a [ObjectId],
        landing: &'a mut dyn Landing,
    ) -> PullFuture<'a> {
        Box::pin(async move {
            if ids.is_empty() || ids.len() > MAX_PULL_IDS {
                return Err(TransferError::Protocol {
                    peer: peer.into(),
                    what: format!("a pull of {} ids", ids.len()),
                });
            }
            let slots = self.slots(peer);
            let _slot = slots.acquire().await.expect("never closed");
            let mut progress = Progress::default();
            // A pooled connection may have been closed by the other side
            // while idle: then retry once on a fresh one (nothing landed yet).
            if let Some(mut s) = self.pooled(peer) {
                let request = self.request(false, kind, ids);
                match self
                    .pull_on(
                        &mut s,
                        peer,
                        &request,
                        ids.len(),
                        &mut *landing,
                        &mut progress,
                    )
                    .await
                {
                    Ok(()) => {
                        self.give_back(peer, s);
                        return Ok(());
                    }
                    Err(TransferError::Io { .. }) if progress.answered == 0 => {}
                    Err(e) => return Err(e),
                }
            }
            let mut s = self.connect(peer).await?;
            let request = self.request(true, kind, ids);
            self.pull_on(&mut s, peer, &request, ids.len(), landing, &mut progress)
                .await?;
            self.give_back(peer, s);
            Ok(())
        })
    }

    fn forget(&self, peer: &str) {
        self.pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(peer);
    }
}

/// How long a bulk connection may wait for its next request: pullers
/// pool idle connections and take a fresh one when a pooled one was closed.
pub const IDLE: Duration = Duration::from_secs(300);

/// Serves pulls on `listener` until the task is dropped, at most `cap`
/// connections at once (those over it are closed at once). A puller that
/// sends no hello and token within `stall` of connecting, or reads nothing
/// of an answer for `stall`, is dropped, and the objects being sent to it
/// unpinned; a connection with no request for [`IDLE`] (or 4 `stall`s,
/// the longer) is closed.
pub async fn serve_tcp(
    listener: TcpListener,
    cap: usize,
    token: Arc<str>,
    source: Arc<dyn Source>,
    stall: Duration,
) {
    let guard = Guard::new("bulk", cap, stall, IDLE.max(4 * stall));
    let mut incoming = guard.incoming(listener);
    loop {
        let a = incoming.admit().await;
        let (token, source, guard) = (token.clone(), source.clone(), guard.clone());
        tokio::spawn(async move {
            let from = a.peer;
            if let Err(e) = serve_one(a.stream, from, &token, source, stall, &guard).await {
                tracing::debug!(%from, error = %e, "bulk connection ended");
            }
            drop(a.permit);
        });
    }
}

async fn serve_one(
    mut s: TcpStream,
    peer: std::net::SocketAddr,
    token: &str,
    source: Arc<dyn Source>,
    stall: Duration,
    guard: &Guard,
) -> std::io::Result<()> {
    let presented = tokio::time::timeout(guard.hello(), async {
        let mut hello = [0u8; 6];
        s.read_exact(&mut hello).await?;
        if &hello[..4] != MAGIC {
            return Err(std::io::Error::other(
                "not a ferroplasma bulk connection (or another version's)",
            ));
        }
        let len = u16::from_le_bytes([hello[4], hello[5]]) as usize;
        let mut presented = vec![0u8; len];
        s.read_exact(&mut presented).await?;
        Ok(presented)
    })
    .await
    .map_err(|_| {
        guard.no_hello(Some(peer));
        std::io::Error::other(format!("no hello and token within {:?}", guard.hello()))
    })??;
    if !super::token::same(&presented, token.as_bytes()) {
        super::token::refused_bulk(Some(peer));
        return Err(std::io::Error::other("wrong cluster token"));
    }
    let peer = Some(peer);
    loop {
        let mut head = [0u8; 5];
        match tokio::time::timeout(guard.idle(), s.read_exact(&mut head)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                tracing::debug!(?peer, "bulk connection closed: idle for {:?}", guard.idle());
                return Ok(());
            }
        }
        let kind = head[0];
        if kind != PULL && kind != LOOKUP {
            return Err(std::io::Error::other(format!("request kind {kind}")));
        }
        let n = u32::from_le_bytes(head[1..].try_into().expect("4 bytes")) as usize;
        if n == 0 || n > MAX_PULL_IDS {
            return Err(std::io::Error::other(format!(
                "a pull of {n} ids (1 to {MAX_PULL_IDS})"
            )));
        }
        let mut packed = vec![0u8; n * ObjectId::LEN];
        tokio::time::timeout(stall, s.read_exact(&mut packed))
            .await
            .map_err(|_| std::io::Error::other("the pull request stalled"))??;
        let ids: Vec<ObjectId> = packed
            .chunks_exact(ObjectId::LEN)
            .map(|c| ObjectId::from_slice(c).expect("20 bytes"))
            .collect();
        tracing::debug!(ids = ?ids, ?peer, lookup = kind == LOOKUP, "pull: serving");
        let mut next = 0;
        while next < ids.len() {
            let want = &ids[next..(next + FRAME_OBJECTS).min(ids.len())];
            let pinned = if source.is_spilled(want) {
                // Reading them back from disk must not hold up the store.
                let (source, want) = (source.clone(), want.to_vec());
                tokio::task::spawn_blocking(move || source.pin(&want, FRAME_BYTES))
                    .await
                    .map_err(|e| std::io::Error::other(format!("pinning failed: {e}")))?
            } else {
                source.pin(want, FRAME_BYTES)
            };
            let entries = if kind == LOOKUP {
                let absent: Vec<ObjectId> = want
                    .iter()
                    .zip(&pinned.objects)
                    .filter(|(_, o)| o.is_none())
                    .map(|(id, _)| *id)
                    .collect();
                Some(source.entries(&absent))
            } else {
                None
            };
            let sent = send_frame(&mut s, &pinned, entries.as_deref(), stall).await?;
            next += sent.objects;
            source.served(sent.present, sent.bytes);
        }
    }
}

/// What one frame carried.
struct Sent {
    objects: usize,
    present: u64,
    bytes: u64,
}

/// Sends the pinned objects as one frame (cut where the header block grows
/// past [`FRAME_HEADER`]); the data goes straight from the arena. With
/// `entries` (a [`LOOKUP`]), each object not here is sent with the next of
/// them.
async fn send_frame(
    s: &mut TcpStream,
    p: &Pinned,
    entries: Option<&[Vec<u8>]>,
    stall: Duration,
) -> std::io::Result<Sent> {
    let mut head = vec![0u8; 8];
    let (mut objects, mut present, mut bytes) = (0usize, 0u64, 0u64);
    let mut data: Vec<&[u8]> = Vec::new();
    let mut entries = entries.map(|e| e.iter());
    for o in &p.objects {
        if objects > 0 && head.len() >= FRAME_HEADER {
            break;
        }
        objects += 1;
        match o {
            None => match entries.as_mut().and_then(Iterator::next) {
                Some(entry) => {
                    head.push(2);
                    head.extend_from_slice(&0u64.to_le_bytes());
                    head.extend_from_slice(&(entry.len() as u32).to_le_bytes());
                    head.extend_from_slice(entry);
                }
                None => {
                    head.push(0);
                    head.extend_from_slice(&[0u8; 12]);
                }
            },
            Some(o) if o.metadata_size > MAX_INLINE_SIZE => {
                head.push(3);
                head.extend_from_slice(&[0u8; 12]);
            }
            Some(o) => {
                head.push(1);
                head.extend_from_slice(&o.data_size.to_le_bytes());
                head.extend_from_slice(&(o.metadata_size as u32).to_le_bytes());
                head.extend_from_slice(p.metadata(o));
                present += 1;
                bytes += o.data_size;
                if o.data_size > 0 {
                    data.push(p.data(o));
                }
            }
        }
    }
    let block = (head.len() - 8) as u32;
    head[..4].copy_from_slice(&(objects as u32).to_le_bytes());
    head[4..8].copy_from_slice(&block.to_le_bytes());
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(1 + data.len());
    slices.push(IoSlice::new(&head));
    slices.extend(data.iter().map(|d| IoSlice::new(d)));
    write_all_vectored(s, &mut slices, stall).await?;
    Ok(Sent {
        objects,
        present,
        bytes,
    })
}

/// Writes every slice with as few `writev` calls as the socket takes
/// (at most [`IOV_MAX`] slices each); fails when the other side takes
/// nothing for `stall`.
async fn write_all_vectored(
    s: &mut TcpStream,
    slices: &mut [IoSlice<'_>],
    stall: Duration,
) -> std::io::Result<()> {
    let mut bufs = slices;
    while !bufs.is_empty() {
        let upto = bufs.len().min(IOV_MAX);
        let n = tokio::time::timeout(stall, s.write_vectored(&bufs[..upto]))
            .await
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the puller read nothing for {stall:?}"),
                )
            })??;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

#[cfg(test)]
#[path = "transport_tests.rs"]
mod tests;
