//! Views of objects in the mapped arena.
//!
//! [`ObjectBuffer`] is a sealed object: read-only, and it holds one reference
//! that it gives back to the store when dropped. [`MutableBuffer`] is an
//! object being created: writable until sealed.

use crate::client::Inner;
use ferroplasma_protocol::ObjectId;
use memmap2::MmapRaw;
use std::sync::Arc;

/// The arena as mapped into this process. Kept alive by every buffer.
#[derive(Debug)]
pub struct Mapping {
    map: MmapRaw,
}

impl Mapping {
    pub(crate) fn new(map: MmapRaw) -> Self {
        Self { map }
    }

    /// Bytes mapped.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// True for an empty mapping.
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// A pointer to `offset`, after checking `[offset, offset+len)` is mapped.
    pub(crate) fn ptr(&self, offset: u64, len: u64) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        if end > self.len() {
            return None;
        }
        // Safety: offset <= end <= mapping length, so the result stays within
        // (or one past the end of) the mapped region.
        Some(unsafe { self.map.as_mut_ptr().add(offset as usize) })
    }
}

/// A sealed object: a read-only, zero-copy view of shared memory. Dropping it
/// releases the reference it holds.
#[derive(Debug)]
pub struct ObjectBuffer {
    pub(crate) inner: Arc<Inner>,
    pub(crate) id: ObjectId,
    pub(crate) data: *const u8,
    pub(crate) data_len: usize,
    pub(crate) meta: *const u8,
    pub(crate) meta_len: usize,
    /// Whether Drop gives the reference back (false once released in a batch).
    pub(crate) armed: bool,
}

// Safety: the pointers refer to the shared mapping, which `inner` keeps alive
// for as long as the buffer exists; a sealed object's bytes never change, so
// concurrent reads from any thread are sound.
unsafe impl Send for ObjectBuffer {}
// Safety: as above; the buffer gives out shared references only.
unsafe impl Sync for ObjectBuffer {}

impl ObjectBuffer {
    /// The object's id.
    pub fn id(&self) -> ObjectId {
        self.id
    }

    /// The object's data.
    pub fn data(&self) -> &[u8] {
        // Safety: the range was bounds-checked against the mapping when the
        // buffer was made, the mapping lives as long as `self.inner`, and the
        // store never writes to a sealed object while a reference is held.
        unsafe { std::slice::from_raw_parts(self.data, self.data_len) }
    }

    /// The object's metadata.
    pub fn metadata(&self) -> &[u8] {
        // Safety: as for `data`.
        unsafe { std::slice::from_raw_parts(self.meta, self.meta_len) }
    }

    /// Address of the first data byte (for bindings that export buffers).
    pub fn as_ptr(&self) -> *const u8 {
        self.data
    }
}

impl AsRef<[u8]> for ObjectBuffer {
    fn as_ref(&self) -> &[u8] {
        self.data()
    }
}

impl Drop for ObjectBuffer {
    fn drop(&mut self) {
        if self.armed {
            self.inner.release_quietly(self.id);
        }
    }
}

/// An object being created: write its data, then `Client::seal` it.
/// Holds the creator's reference: dropping the buffer gives it back (unless
/// `Client::release` already did), so a sealed object whose buffer is gone
/// becomes evictable, as in Plasma.
#[derive(Debug)]
pub struct MutableBuffer {
    pub(crate) inner: Arc<Inner>,
    pub(crate) id: ObjectId,
    /// Which create this buffer came from (ids can be reused).
    pub(crate) token: u64,
    pub(crate) data: *mut u8,
    pub(crate) data_len: usize,
}

// Safety: the pointer refers to the shared mapping kept alive by `inner`;
// the allocation belongs to this object alone until it is sealed.
unsafe impl Send for MutableBuffer {}
// Safety: through `&MutableBuffer` only the id, the length and the raw
// pointer can be read; writing through that pointer is the caller's
// (unsafe) responsibility.
unsafe impl Sync for MutableBuffer {}

impl Drop for MutableBuffer {
    fn drop(&mut self) {
        self.inner.release_creator(self.id, self.token);
    }
}

impl MutableBuffer {
    /// The object's id.
    pub fn id(&self) -> ObjectId {
        self.id
    }

    /// The data area to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // Safety: the range was bounds-checked against the mapping, which
        // `inner` keeps alive; the store gave this allocation to this client
        // alone, and `&mut self` keeps the slice unique within the process.
        unsafe { std::slice::from_raw_parts_mut(self.data, self.data_len) }
    }

    /// Address of the first data byte (for bindings that export buffers).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.data
    }

    /// Address of the first data byte, from a shared reference (for
    /// bindings that export the buffer; writing through it is unsafe).
    pub fn data_ptr(&self) -> *mut u8 {
        self.data
    }

    /// Bytes of data.
    pub fn len(&self) -> usize {
        self.data_len
    }

    /// True for a zero-byte object.
    pub fn is_empty(&self) -> bool {
        self.data_len == 0
    }
}
