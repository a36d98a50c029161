//! The bulk transport's TCP server: serves other members' pulls from a
//! [`Source`], each frame sent with one gathering write.

use crate::local::Pinned;
use crate::net::guard::Guard;
use crate::peers::token;
use crate::transfer::codec::{
    FRAME_BYTES, FRAME_HEADER, FRAME_OBJECTS, IOV_MAX, LOOKUP, MAGIC, MAX_PULL_IDS, PULL,
};
use crate::transfer::transport::Source;
use ferroplasma_protocol::frame::MAX_INLINE_SIZE;
use ferroplasma_protocol::ObjectId;
use std::io::IoSlice;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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
    if !token::same(&presented, token.as_bytes()) {
        token::refused_bulk(Some(peer));
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
