//! Views of objects in the mapped arena.
//!
//! [`ObjectBuffer`] is a sealed object: read-only, and it holds one reference
//! that it gives back to the store when dropped. [`MutableBuffer`] is an
//! object being created: writable, and consumed by `Client::seal` (which
//! turns it into an `ObjectBuffer` holding the creator's reference) or by
//! `Client::abort`, so that no writable slice outlives the seal.

use crate::session::Session;
use ferroplasma_protocol::ObjectId;
use std::sync::Arc;

/// A sealed object: a read-only, zero-copy view of shared memory. Dropping it
/// releases the reference it holds.
#[derive(Debug)]
pub struct ObjectBuffer {
    pub(crate) session: Arc<Session>,
    pub(crate) id: ObjectId,
    pub(crate) data: *const u8,
    pub(crate) data_len: usize,
    pub(crate) meta: *const u8,
    pub(crate) meta_len: usize,
    /// Whether Drop gives the reference back (false once released in a batch).
    pub(crate) armed: bool,
    /// For the buffer `Client::seal` returned: the token of the create whose
    /// reference it holds (the creator's, ended once; see `creators`).
    pub(crate) creator: Option<u64>,
    /// For a buffer read through the shared table: the slot it holds
    /// (given back on drop instead of a release to the store).
    pub(crate) hold: Option<(std::sync::Arc<crate::shared_table::TableView>, usize)>,
}

// Safety: the pointers refer to the shared mapping, which `session` keeps
// alive for as long as the buffer exists; a sealed object's bytes never
// change, so concurrent reads from any thread are sound.
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
        // buffer was made, the mapping lives as long as `self.session`, and
        // the store never writes to a sealed object while a reference is held.
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
            match (&self.hold, self.creator) {
                (Some((table, slot)), _) => self.session.give_back_hold(self.id, table, *slot),
                (None, Some(token)) => self.session.release_creator(self.id, token),
                (None, None) => self.session.release_quietly(self.id),
            }
        }
    }
}

/// An object being created: write its data, then give it to `Client::seal`
/// (or `Client::abort`), which consumes it. Holds the creator's reference:
/// dropping the buffer unsealed gives it back (the object stays unsealed in
/// the store until this client seals it through another path, aborts it, or
/// disconnects).
///
/// A writable slice cannot outlive the seal:
///
/// ```compile_fail,E0382
/// # let client = ferroplasma_client::Client::connect(None).unwrap();
/// # let id = ferroplasma_client::ObjectId::random();
/// let mut buf = client.create(id, 8, b"").unwrap();
/// let sealed = client.seal(buf).unwrap();
/// buf.as_mut_slice()[0] = 1; // error: `buf` was moved into `seal`
/// ```
#[derive(Debug)]
pub struct MutableBuffer {
    pub(crate) session: Arc<Session>,
    pub(crate) id: ObjectId,
    /// Which create this buffer came from (ids can be reused).
    pub(crate) token: u64,
    pub(crate) data: *mut u8,
    pub(crate) data_len: usize,
    pub(crate) meta: *const u8,
    pub(crate) meta_len: usize,
    /// Whether Drop gives the creator's reference back (false once the
    /// buffer was turned into a sealed one, or aborted).
    pub(crate) armed: bool,
    /// Created without a round trip: in which lease (see `fast_writes`).
    pub(crate) fast: Option<crate::fast_writes::FastCreate>,
}

// Safety: the pointer refers to the shared mapping kept alive by `session`;
// the allocation belongs to this object alone until it is sealed, and
// writing needs `&mut self`.
unsafe impl Send for MutableBuffer {}
// Safety: through `&MutableBuffer` only the id, the length and the raw
// pointer can be read; writing through that pointer is the caller's
// (unsafe) responsibility.
unsafe impl Sync for MutableBuffer {}

impl Drop for MutableBuffer {
    fn drop(&mut self) {
        if let Some(f) = self.fast.take() {
            // Not in a child after fork(): the lock may be the parent's.
            if let (Some(w), Ok(())) =
                (self.session.fast_writer_if_open(), self.session.check_pid())
            {
                w.finished(f.lease);
            }
        }
        if self.armed {
            self.session.release_creator(self.id, self.token);
        }
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
        // `session` keeps alive; the store gave this allocation to this
        // client alone, and `&mut self` keeps the slice unique within the
        // process until `seal` or `abort` consumes the buffer.
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

    /// The sealed view of this object, holding the creator's reference
    /// (after the store confirmed the seal).
    pub(crate) fn into_sealed(mut self) -> ObjectBuffer {
        self.armed = false;
        ObjectBuffer {
            session: self.session.clone(),
            id: self.id,
            data: self.data,
            data_len: self.data_len,
            meta: self.meta,
            meta_len: self.meta_len,
            armed: true,
            creator: Some(self.token),
            hold: None,
        }
    }
}
