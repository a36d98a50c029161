//! The bulk transport's TCP client: pulls over pooled connections, each
//! frame's data received with scattering reads straight into the landing.

use crate::transfer::codec::{
    parse_header, FRAME_OBJECTS, IOV_MAX, MAGIC, MAX_HEADER, MAX_PULL_IDS,
};
use crate::transfer::transport::{Landing, PullFuture, TransferError, Transport};
use ferroplasma_protocol::ObjectId;
use std::collections::HashMap;
use std::io::IoSliceMut;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Pulls from one member at a time (and so connections to it, at most).
pub const POOL_PER_PEER: usize = 8;

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
