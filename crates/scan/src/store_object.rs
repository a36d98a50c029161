//! A received batch as a store object (`ferroplasma.serialization`'s kind
//! 3, "Arrow buffers"), written as it comes off the socket: the object's
//! header, the batch's schema, row count and descriptor, then every buffer
//! at its own 64-byte-aligned offset. Any process on the host then reads the
//! batch from shared memory without a copy (`client.get(id)` in Python).

use crate::error::Result;
use crate::layout::{place, ALIGN};

const MAGIC: &[u8; 4] = b"FPSO";
const VERSION: u8 = 1;
const KIND_ARROW_BUFFERS: u8 = 3;
const HEAD_LEN: usize = 40;
const ENTRY_LEN: usize = 16;

/// Where a receiver lands batches when asked to put them in a store.
pub trait StoreSink: Send {
    /// Creates an object of `size` bytes: its id, and its data (`size`
    /// writable bytes, valid until it is sealed or aborted).
    fn create(&mut self, size: usize) -> Result<([u8; 20], *mut u8)>;
    /// Seals an object this sink created; the hold keeps it in the store
    /// (not evicted) until dropped.
    fn seal(&mut self, id: [u8; 20]) -> Result<Hold>;
    /// Aborts every object this sink created and has not sealed.
    fn abort_unsealed(&mut self);
    /// Gets rid of an object this sink created, sealed or not (its id will
    /// never reach anyone).
    fn discard(&mut self, id: [u8; 20]);
}

/// A reference to a sealed object (whatever the sink keeps: the store
/// client's buffer), held while its id waits in the receiver's queue.
pub struct Hold(pub Box<dyn Send>);

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hold")
    }
}

/// The layout of one batch's object.
#[derive(Debug)]
pub struct ObjectLayout {
    /// Bytes to write at offset 0 (the header and its buffer table).
    pub header: Vec<u8>,
    /// Where [`ObjectLayout::meta`] goes.
    pub meta_at: usize,
    /// Schema, row count and descriptor (`arrow_layout.pack_meta`).
    pub meta: Vec<u8>,
    /// Where each buffer goes.
    pub offsets: Vec<usize>,
    /// The object's size.
    pub total: usize,
}

fn align(n: usize) -> usize {
    (n + ALIGN - 1) & !(ALIGN - 1)
}

/// Lays out a batch of `rows` rows (its IPC `schema`, its descriptor and
/// its buffers' `sizes`) as a kind-3 object.
pub fn layout(schema: &[u8], rows: u64, desc: &[i64], sizes: &[usize]) -> Option<ObjectLayout> {
    let mut meta = Vec::with_capacity(8 + schema.len() + 8 * (desc.len() + 1));
    meta.extend_from_slice(&u32::try_from(schema.len()).ok()?.to_le_bytes());
    meta.extend_from_slice(&u32::try_from(desc.len()).ok()?.to_le_bytes());
    meta.extend_from_slice(schema);
    meta.extend_from_slice(&(rows as i64).to_le_bytes());
    for d in desc {
        meta.extend_from_slice(&d.to_le_bytes());
    }
    let meta_at = align(HEAD_LEN.checked_add(ENTRY_LEN.checked_mul(sizes.len())?)?);
    let start = align(meta_at.checked_add(meta.len())?);
    let (rel, end) = place(sizes)?;
    let offsets: Vec<usize> = rel.iter().map(|o| o + start).collect();
    let total = (start.checked_add(end)?).max(meta_at + meta.len());
    let mut header = Vec::with_capacity(HEAD_LEN + ENTRY_LEN * sizes.len());
    header.extend_from_slice(MAGIC);
    header.push(VERSION);
    header.push(KIND_ARROW_BUFFERS);
    header.extend_from_slice(&0u16.to_le_bytes());
    header.extend_from_slice(&(sizes.len() as u32).to_le_bytes());
    header.extend_from_slice(&0u32.to_le_bytes());
    header.extend_from_slice(&(meta_at as u64).to_le_bytes());
    header.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    for (&o, &s) in offsets.iter().zip(sizes) {
        header.extend_from_slice(&(o as u64).to_le_bytes());
        header.extend_from_slice(&(s as u64).to_le_bytes());
    }
    Some(ObjectLayout {
        header,
        meta_at,
        meta,
        offsets,
        total,
    })
}
