//! Bulk transport: object bytes between members, straight from one arena to
//! another with no staging copy on either side.
//!
//! The interface is [`Transport`] (pull an object from a member into a
//! [`Landing`]) and [`Source`] (pin a local object while it is sent). The
//! TCP implementation, [`TcpTransport`] and [`serve_tcp`], is the one in
//! use; an RDMA one (UCX or libfabric, registering the arena once) would
//! implement the same two traits.
//!
//! TCP wire format (all integers little-endian):
//! - on connect, the puller sends `FPB1`, a u16 token length and the token;
//!   a wrong token closes the connection;
//! - then, any number of times: the puller sends a 20-byte id; the server
//!   answers `0u8` (not here) or `1u8`, u64 data size, u64 metadata size,
//!   the metadata and the data. The data is sent from the arena with
//!   `writev` and received into the new allocation in 4 MiB reads, so a
//!   large object streams through the socket in pipelined chunks.
//!
//! Idle connections are pooled per member and reused by later pulls.

use crate::arena::Arena;
use ferroplasma_protocol::ObjectId;
use std::collections::HashMap;
use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MAGIC: &[u8; 4] = b"FPB1";
/// Largest read into a landing allocation in one call.
const CHUNK: usize = 4 << 20;
/// Pulls from one member at a time (and so connections to it, at most).
const POOL_PER_PEER: usize = 8;

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
    /// The local store could not take the object.
    #[error("{0}")]
    Landing(String),
}

/// Where a pulled object lands: the local store allocates it once the sizes
/// are known. If the pull fails afterwards, dropping the landing discards
/// the allocation.
pub trait Landing: Send {
    /// Allocates the object (with its metadata in place) and returns the
    /// bytes to receive the data into.
    fn allocate(&mut self, data_size: u64, metadata: &[u8]) -> Result<&mut [u8], TransferError>;
    /// True once [`Landing::allocate`] succeeded (a pull that failed after
    /// that must not be retried into the same landing).
    fn is_allocated(&self) -> bool;
}

/// A local sealed object held (referenced) while it is sent; dropping it
/// gives the reference back.
pub struct Pinned {
    /// The arena it lies in.
    pub arena: Arc<Arena>,
    /// Data offset.
    pub offset: u64,
    /// Data size.
    pub data_size: u64,
    /// Metadata offset.
    pub metadata_offset: u64,
    /// Metadata size.
    pub metadata_size: u64,
    /// Gives the reference back.
    pub unpin: Option<Box<dyn FnOnce() + Send>>,
}

impl std::fmt::Debug for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pinned")
            .field("offset", &self.offset)
            .field("data_size", &self.data_size)
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
    /// Pins a sealed object for sending; `None` when it is not here. May
    /// block (to bring a spilled object back) when [`Source::is_spilled`]
    /// says so: the caller then runs it on a blocking thread.
    fn pin(&self, id: ObjectId) -> Option<Pinned>;
    /// Whether pinning `id` has to read it back from disk first.
    fn is_spilled(&self, _id: ObjectId) -> bool {
        false
    }
    /// Counts an object sent.
    fn served(&self, bytes: u64);
}

/// The boxed future a [`Transport`] pull returns.
pub type PullFuture<'a> = Pin<Box<dyn Future<Output = Result<Pulled, TransferError>> + Send + 'a>>;

/// What a pull found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pulled {
    /// The object arrived: this many data bytes.
    Received(u64),
    /// The member does not hold the object (any more).
    NotThere,
}

/// Pulls objects from other members.
pub trait Transport: Send + Sync + std::fmt::Debug {
    /// Pulls `id` from the member whose bulk address is `peer`.
    fn pull<'a>(
        &'a self,
        peer: &'a str,
        id: ObjectId,
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
    /// Bounds concurrent pulls per member: a get of a thousand remote ids
    /// queues on a few connections instead of opening a thousand.
    slots: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
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
        let mut s = tokio::time::timeout(self.stall, TcpStream::connect(peer))
            .await
            .map_err(|_| TransferError::Stalled(peer.into()))?
            .map_err(io)?;
        s.set_nodelay(true).map_err(io)?;
        let mut hello = Vec::with_capacity(6 + self.token.len());
        hello.extend_from_slice(MAGIC);
        hello.extend_from_slice(&(self.token.len() as u16).to_le_bytes());
        hello.extend_from_slice(self.token.as_bytes());
        s.write_all(&hello).await.map_err(io)?;
        Ok(s)
    }

    async fn pull_on(
        &self,
        s: &mut TcpStream,
        peer: &str,
        id: ObjectId,
        landing: &mut dyn Landing,
    ) -> Result<Pulled, TransferError> {
        let io = |source| TransferError::Io {
            peer: peer.into(),
            source,
        };
        s.write_all(id.as_bytes()).await.map_err(io)?;
        let mut status = [0u8; 1];
        self.read(s, peer, &mut status).await?;
        match status[0] {
            0 => return Ok(Pulled::NotThere),
            1 => {}
            other => {
                return Err(TransferError::Protocol {
                    peer: peer.into(),
                    what: format!("status byte {other}"),
                })
            }
        }
        let mut sizes = [0u8; 16];
        self.read(s, peer, &mut sizes).await?;
        let data_size = u64::from_le_bytes(sizes[..8].try_into().expect("8 bytes"));
        let meta_size = u64::from_le_bytes(sizes[8..].try_into().expect("8 bytes"));
        if meta_size > ferroplasma_protocol::frame::MAX_INLINE_SIZE {
            return Err(TransferError::Protocol {
                peer: peer.into(),
                what: format!("metadata of {meta_size} bytes"),
            });
        }
        let mut meta = vec![0u8; meta_size as usize];
        self.read(s, peer, &mut meta).await?;
        let region = landing.allocate(data_size, &meta)?;
        for chunk in region.chunks_mut(CHUNK) {
            self.read(s, peer, chunk).await?;
        }
        Ok(Pulled::Received(data_size))
    }

    async fn read(
        &self,
        s: &mut TcpStream,
        peer: &str,
        buf: &mut [u8],
    ) -> Result<(), TransferError> {
        match tokio::time::timeout(self.stall, s.read_exact(buf)).await {
            Err(_) => Err(TransferError::Stalled(peer.into())),
            Ok(Err(source)) => Err(TransferError::Io {
                peer: peer.into(),
                source,
            }),
            Ok(Ok(_)) => Ok(()),
        }
    }
}

impl Transport for TcpTransport {
    fn pull<'a>(
        &'a self,
        peer: &'a str,
        id: ObjectId,
        landing: &'a mut dyn Landing,
    ) -> PullFuture<'a> {
        Box::pin(async move {
            let slots = self.slots(peer);
            let _slot = slots.acquire().await.expect("never closed");
            // A pooled connection may have been closed by the other side
            // while idle: then retry once on a fresh one (nothing landed yet).
            if let Some(mut s) = self.pooled(peer) {
                match self.pull_on(&mut s, peer, id, &mut *landing).await {
                    Ok(p) => {
                        self.give_back(peer, s);
                        return Ok(p);
                    }
                    Err(TransferError::Io { .. }) if !landing.is_allocated() => {}
                    Err(e) => return Err(e),
                }
            }
            let mut s = self.connect(peer).await?;
            let p = self.pull_on(&mut s, peer, id, landing).await?;
            self.give_back(peer, s);
            Ok(p)
        })
    }

    fn forget(&self, peer: &str) {
        self.pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(peer);
    }
}

/// Serves pulls on `listener` until the task is dropped. A puller that
/// sends nothing (hello, token) or reads nothing for `stall` is dropped,
/// and the object being sent to it unpinned.
pub async fn serve_tcp(
    listener: TcpListener,
    token: Arc<str>,
    source: Arc<dyn Source>,
    stall: Duration,
) {
    loop {
        match listener.accept().await {
            Ok((s, from)) => {
                let (token, source) = (token.clone(), source.clone());
                tokio::spawn(async move {
                    if let Err(e) = serve_one(s, &token, source, stall).await {
                        tracing::debug!(%from, error = %e, "bulk connection ended");
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "bulk accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn serve_one(
    mut s: TcpStream,
    token: &str,
    source: Arc<dyn Source>,
    stall: Duration,
) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let presented = tokio::time::timeout(stall, async {
        let mut hello = [0u8; 6];
        s.read_exact(&mut hello).await?;
        if &hello[..4] != MAGIC {
            return Err(std::io::Error::other("not a ferroplasma bulk connection"));
        }
        let len = u16::from_le_bytes([hello[4], hello[5]]) as usize;
        let mut presented = vec![0u8; len];
        s.read_exact(&mut presented).await?;
        Ok(presented)
    })
    .await
    .map_err(|_| std::io::Error::other(format!("no hello and token within {stall:?}")))??;
    if !super::token::same(&presented, token.as_bytes()) {
        tracing::warn!(peer = ?s.peer_addr().ok(), "bulk connection refused: wrong cluster token");
        return Err(std::io::Error::other("wrong cluster token"));
    }
    let mut id = [0u8; ObjectId::LEN];
    loop {
        match s.read_exact(&mut id).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let id = ObjectId::from_slice(&id).expect("20 bytes");
        let pinned = if source.is_spilled(id) {
            // Reading it back from disk must not hold up the store.
            let source = source.clone();
            tokio::task::spawn_blocking(move || source.pin(id))
                .await
                .ok()
                .flatten()
        } else {
            source.pin(id)
        };
        let Some(p) = pinned else {
            tracing::debug!(%id, peer = ?s.peer_addr().ok(), "pull: not here");
            s.write_all(&[0u8]).await?;
            continue;
        };
        tracing::debug!(%id, peer = ?s.peer_addr().ok(), bytes = p.data_size, "pull: serving");
        let mut head = Vec::with_capacity(17 + p.metadata_size as usize);
        head.push(1u8);
        head.extend_from_slice(&p.data_size.to_le_bytes());
        head.extend_from_slice(&p.metadata_size.to_le_bytes());
        head.extend_from_slice(p.arena.bytes(p.metadata_offset, p.metadata_size));
        let data = p.arena.bytes(p.offset, p.data_size);
        write_all_vectored(&mut s, &head, data, stall).await?;
        source.served(p.data_size);
        drop(p);
    }
}

/// Writes `head` then `data` with as few `writev` calls as the socket
/// takes; fails when the other side takes nothing for `stall`.
async fn write_all_vectored(
    s: &mut TcpStream,
    head: &[u8],
    data: &[u8],
    stall: Duration,
) -> std::io::Result<()> {
    let (mut h, mut d) = (head, data);
    while !h.is_empty() || !d.is_empty() {
        let n = tokio::time::timeout(stall, s.write_vectored(&[IoSlice::new(h), IoSlice::new(d)]))
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
        if n >= h.len() {
            d = &d[n - h.len()..];
            h = &[];
        } else {
            h = &h[n..];
        }
    }
    Ok(())
}
