//! The TCP transport on its own: a real listener and connection, a source
//! over plain memory, a landing into plain buffers.

use crate::local::{Memory, Pinned, PinnedObject};
use crate::testkit::{runtime, TestMemory};
use crate::transfer::client::TcpTransport;
use crate::transfer::codec::{Absent, Arrival, LOOKUP, MAX_PULL_IDS, PULL};
use crate::transfer::server::serve_tcp;
use crate::transfer::transport::{Landing, Source, TransferError, Transport};
use ferroplasma_protocol::frame::MAX_INLINE_SIZE;
use ferroplasma_protocol::ObjectId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Objects laid out in an arena, served as a member would.
#[derive(Debug)]
struct ArenaSource {
    arena: Arc<TestMemory>,
    objects: HashMap<ObjectId, PinnedObject>,
    pins: Arc<AtomicU64>,
    served: AtomicU64,
}

impl Source for ArenaSource {
    fn pin(&self, ids: &[ObjectId], max_bytes: u64) -> Pinned {
        let mut objects = Vec::new();
        let mut copies = Vec::new();
        let mut bytes = 0;
        for id in ids {
            let mut o = self.objects.get(id).copied();
            bytes += o.map_or(0, |o| o.data_size);
            // Small objects of odd ids are copied out, as the store's source
            // does with small objects: frames mix both kinds.
            if let Some(o) = o
                .as_mut()
                .filter(|o| o.data_size <= 4096 && id.0[0] % 2 == 1)
            {
                let at = copies.len() as u64;
                copies.extend_from_slice(self.arena.bytes(o.metadata_offset, o.metadata_size));
                copies.extend_from_slice(self.arena.bytes(o.offset, o.data_size));
                *o = PinnedObject {
                    copied: true,
                    offset: at + o.metadata_size,
                    metadata_offset: at,
                    ..*o
                };
            }
            objects.push(o);
            self.pins.fetch_add(1, Ordering::Relaxed);
            if bytes >= max_bytes {
                break;
            }
        }
        let (pins, n) = (self.pins.clone(), objects.len() as u64);
        Pinned {
            memory: self.arena.clone(),
            objects,
            copies,
            unpin: Some(Box::new(move || {
                pins.fetch_sub(n, Ordering::Relaxed);
            })),
        }
    }

    fn entries(&self, ids: &[ObjectId]) -> Vec<Vec<u8>> {
        // Stands for the directory entry: the id itself, reversed.
        ids.iter()
            .map(|id| id.as_bytes().iter().rev().copied().collect())
            .collect()
    }

    fn served(&self, objects: u64, _bytes: u64) {
        self.served.fetch_add(objects, Ordering::Relaxed);
    }
}

fn content(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| (k * 7 + i * 13) as u8).collect()
}

/// `sizes` objects (`None`: an id the source does not have).
fn source(sizes: &[Option<usize>]) -> (Arc<ArenaSource>, Vec<ObjectId>) {
    let total: usize = sizes.iter().flatten().map(|s| s + 64 + 16).sum();
    let arena = Arc::new(TestMemory::new(total.max(4096)));
    let mut objects = HashMap::new();
    let mut ids = Vec::new();
    let mut at = 0u64;
    for (i, s) in sizes.iter().enumerate() {
        let id = ObjectId::random();
        ids.push(id);
        let Some(len) = *s else { continue };
        let meta = content(i, i % 9);
        arena.write(at, &content(i, len));
        arena.write(at + len as u64, &meta);
        objects.insert(
            id,
            PinnedObject {
                copied: false,
                offset: at,
                data_size: len as u64,
                metadata_offset: at + len as u64,
                metadata_size: meta.len() as u64,
            },
        );
        at += (len + meta.len()) as u64;
    }
    let src = ArenaSource {
        arena,
        objects,
        pins: Arc::new(AtomicU64::new(0)),
        served: AtomicU64::new(0),
    };
    (Arc::new(src), ids)
}

/// Receives into vectors; refuses the indices in `refuse`.
#[derive(Default)]
struct VecLanding {
    got: HashMap<usize, (Vec<u8>, Vec<u8>)>,
    frame: Vec<usize>,
    missing: Vec<usize>,
    entries: HashMap<usize, Vec<u8>>,
    unsendable: Vec<usize>,
    refuse: Vec<usize>,
    frames: usize,
}

impl Landing for VecLanding {
    fn allocate<'s>(&'s mut self, objects: &[Arrival<'_>]) -> Vec<Option<&'s mut [u8]>> {
        self.frames += 1;
        self.frame.clear();
        for a in objects {
            if !self.refuse.contains(&a.index) {
                self.frame.push(a.index);
                self.got.insert(
                    a.index,
                    (vec![0xEE; a.data_size as usize], a.metadata.to_vec()),
                );
            }
        }
        let refuse = self.refuse.clone();
        let mut by_index: HashMap<usize, &'s mut [u8]> = self
            .got
            .iter_mut()
            .filter(|(i, _)| !refuse.contains(i))
            .map(|(i, (d, _))| (*i, d.as_mut_slice()))
            .collect();
        objects.iter().map(|a| by_index.remove(&a.index)).collect()
    }

    fn arrived(&mut self) {
        self.frame.clear();
    }

    fn not_there(&mut self, index: usize, why: Absent<'_>) {
        match why {
            Absent::NotHere => self.missing.push(index),
            Absent::Entry(e) => {
                self.missing.push(index);
                self.entries.insert(index, e.to_vec());
            }
            Absent::Unsendable => self.unsendable.push(index),
        }
    }
}

async fn serve(src: Arc<ArenaSource>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(serve_tcp(l, 64, "tok".into(), src, Duration::from_secs(5)));
    addr
}

#[test]
fn one_request_brings_thousands_of_objects_of_every_size_intact() {
    let mut sizes: Vec<Option<usize>> = (0..3000)
        .map(|i| match i % 10 {
            0 => None,
            1 => Some(0),
            2 => Some(100_000),
            _ => Some(1000 + i),
        })
        .collect();
    sizes.push(Some(40 << 20)); // several frames' worth in one object
    let (src, ids) = source(&sizes);
    runtime().block_on(async {
        let addr = serve(src.clone()).await;
        let t = TcpTransport::new("tok".into(), Duration::from_secs(5));
        let mut landing = VecLanding::default();
        t.pull(&addr, PULL, &ids, &mut landing).await.unwrap();
        for (i, s) in sizes.iter().enumerate() {
            match s {
                None => assert!(landing.missing.contains(&i), "{i} reported missing"),
                Some(len) => {
                    let (data, meta) = &landing.got[&i];
                    assert!(*data == content(i, *len), "object {i} differs");
                    assert_eq!(*meta, content(i, i % 9));
                }
            }
        }
        // Frames bounded by object count and bytes: more than one, far
        // fewer than one per object.
        assert!(
            landing.frames >= 3 && landing.frames < 60,
            "{}",
            landing.frames
        );
        // A second request on the pooled connection.
        let mut again = VecLanding::default();
        t.pull(&addr, PULL, &ids[1..3], &mut again).await.unwrap();
        assert!(again.got[&0].0 == content(1, 0) && again.got[&1].0 == content(2, 100_000));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(src.pins.load(Ordering::Relaxed), 0, "everything unpinned");
        assert_eq!(
            src.served.load(Ordering::Relaxed),
            sizes.iter().flatten().count() as u64 + 2
        );
    });
}

#[test]
fn objects_the_landing_refuses_are_skipped_and_the_rest_stay_in_step() {
    let sizes: Vec<Option<usize>> = (0..50).map(|i| Some(10_000 + 17 * i)).collect();
    let (src, ids) = source(&sizes);
    runtime().block_on(async {
        let addr = serve(src).await;
        let t = TcpTransport::new("tok".into(), Duration::from_secs(5));
        let mut landing = VecLanding {
            refuse: vec![0, 7, 8, 49],
            ..Default::default()
        };
        t.pull(&addr, PULL, &ids, &mut landing).await.unwrap();
        for (i, s) in sizes.iter().enumerate() {
            if landing.refuse.contains(&i) {
                assert!(!landing.got.contains_key(&i));
            } else {
                assert!(landing.got[&i].0 == content(i, s.unwrap()), "{i}");
            }
        }
    });
}

#[test]
fn a_wrong_token_or_an_oversized_request_gets_nothing() {
    let (src, ids) = source(&[Some(100)]);
    runtime().block_on(async {
        let addr = serve(src).await;
        let t = TcpTransport::new("other".into(), Duration::from_secs(5));
        let mut landing = VecLanding::default();
        assert!(t.pull(&addr, PULL, &ids, &mut landing).await.is_err());
        assert!(landing.got.is_empty());
        let t = TcpTransport::new("tok".into(), Duration::from_secs(5));
        let many = vec![ids[0]; MAX_PULL_IDS + 1];
        assert!(matches!(
            t.pull(&addr, PULL, &many, &mut landing).await,
            Err(TransferError::Protocol { .. })
        ));
        // A hand-made request over the limit closes the connection.
        let mut s = TcpStream::connect(&addr).await.unwrap();
        let mut hello = b"FPB2\x03\x00tok".to_vec();
        hello.push(PULL);
        hello.extend_from_slice(&u32::MAX.to_le_bytes());
        s.write_all(&hello).await.unwrap();
        let mut buf = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
            .await
            .unwrap()
            .unwrap_or(0);
        assert_eq!(n, 0);
    });
}

#[test]
fn a_lookup_brings_what_is_here_and_the_entries_of_the_rest() {
    let sizes: Vec<Option<usize>> = (0..2500)
        .map(|i| if i % 3 == 0 { None } else { Some(i) })
        .collect();
    let (src, ids) = source(&sizes);
    runtime().block_on(async {
        let addr = serve(src).await;
        let t = TcpTransport::new("tok".into(), Duration::from_secs(5));
        let mut landing = VecLanding::default();
        t.pull(&addr, LOOKUP, &ids, &mut landing).await.unwrap();
        for (i, s) in sizes.iter().enumerate() {
            match s {
                None => {
                    let want: Vec<u8> = ids[i].as_bytes().iter().rev().copied().collect();
                    assert_eq!(landing.entries[&i], want, "entry of {i}");
                }
                Some(len) => assert!(landing.got[&i].0 == content(i, *len), "{i}"),
            }
        }
        // A plain pull of the same ids says only "not here".
        let mut plain = VecLanding::default();
        t.pull(&addr, PULL, &ids[..3], &mut plain).await.unwrap();
        assert_eq!(plain.missing, vec![0]);
        assert!(plain.entries.is_empty());
    });
}

#[test]
fn an_object_whose_metadata_cannot_be_sent_is_refused_alone() {
    // The middle object's metadata is over the limit of a header block.
    let big = MAX_INLINE_SIZE as usize + 1;
    let arena = Arc::new(TestMemory::new(big + 16384));
    let ids: Vec<ObjectId> = (0..3).map(|_| ObjectId::random()).collect();
    let mut objects = HashMap::new();
    let mut at = 0u64;
    for (i, (len, meta)) in [(1000usize, 3usize), (5, big), (3000, 4)]
        .into_iter()
        .enumerate()
    {
        arena.write(at, &content(i, len));
        objects.insert(
            ids[i],
            PinnedObject {
                copied: false,
                offset: at,
                data_size: len as u64,
                metadata_offset: at + len as u64,
                metadata_size: meta as u64,
            },
        );
        at += (len + meta) as u64;
    }
    let src = Arc::new(ArenaSource {
        arena,
        objects,
        pins: Arc::new(AtomicU64::new(0)),
        served: AtomicU64::new(0),
    });
    runtime().block_on(async {
        let addr = serve(src).await;
        let t = TcpTransport::new("tok".into(), Duration::from_secs(5));
        let mut landing = VecLanding::default();
        t.pull(&addr, PULL, &ids, &mut landing).await.unwrap();
        assert_eq!(landing.unsendable, vec![1]);
        assert!(landing.got[&0].0 == content(0, 1000));
        assert!(landing.got[&2].0 == content(2, 3000));
    });
}
