//! [`Client::create`] and [`Client::create_and_seal`] without a round trip
//! (docs/protocol.md, "Writes without a round trip"): the object is
//! allocated in this client's lease and told to the store through its ring
//! (`fast_writes`).

use crate::buffer::MutableBuffer;
use crate::client::Client;
use crate::error::Result;
use ferroplasma_protocol::fast_writes;
use ferroplasma_protocol::layout::{allocation_size, metadata_offset};
use ferroplasma_protocol::ObjectId;

impl Client {
    /// Whether `id` may be created through the ring: any id on a lone
    /// store; on a cluster member, one it handed out ([`Client::new_id`]),
    /// its claim made already (any other costs a claim, which only the
    /// socket's create makes).
    fn fast_id(&self, id: &ObjectId) -> bool {
        !self.inner.cluster_member || self.inner.take_issued(id)
    }

    /// [`Client::create`] without a round trip (docs/protocol.md, "Writes
    /// without a round trip"), when the store offers it and the object is
    /// small: `None` to go the slow way.
    pub(crate) fn create_fast(
        &self,
        id: ObjectId,
        data_size: u64,
        metadata: &[u8],
    ) -> Result<Option<MutableBuffer>> {
        self.inner.check_pid()?;
        // First: a handed id created any way is no longer this client's to
        // create through its ring.
        if !self.fast_id(&id) {
            return Ok(None);
        }
        let need = allocation_size(data_size, metadata.len() as u64);
        if need > fast_writes::MAX_FAST_OBJECT {
            return Ok(None);
        }
        let Some(w) = self.inner.fast_writer() else {
            return Ok(None);
        };
        let tables = self.inner.table.as_ref();
        let in_table = || tables.and_then(|t| t.current().lookup(&id));
        let meta_len = metadata.len() as u64;
        let Some(f) = w.create(&*self.inner, id, data_size, meta_len, in_table)? else {
            return Ok(None);
        };
        let buf = self.writable(id, f.offset, data_size, meta_len, Some(f))?;
        let meta = buf.meta as *mut u8;
        // Safety: `meta` points at `metadata.len()` bytes inside the mapping
        // (checked above), in this client's lease, given to this object
        // alone; the source is a distinct Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(metadata.as_ptr(), meta, metadata.len()) };
        Ok(Some(buf))
    }

    /// [`Client::create_and_seal`] without a round trip, when the store
    /// offers it and the object is small: no reference is kept (the seal's
    /// record gives the creator's back). False to go the slow way.
    pub(crate) fn create_and_seal_fast(
        &self,
        id: ObjectId,
        data: &[u8],
        metadata: &[u8],
    ) -> Result<bool> {
        self.inner.check_pid()?;
        if !self.fast_id(&id) {
            return Ok(false);
        }
        let (size, meta_len) = (data.len() as u64, metadata.len() as u64);
        if allocation_size(size, meta_len) > fast_writes::MAX_FAST_OBJECT {
            return Ok(false);
        }
        let Some(w) = self.inner.fast_writer() else {
            return Ok(false);
        };
        let tables = self.inner.table.as_ref();
        let in_table = || tables.and_then(|t| t.current().lookup(&id));
        let Some(f) = w.create(&*self.inner, id, size, meta_len, in_table)? else {
            return Ok(false);
        };
        let at = |offset, len| self.inner.checked_ptr(offset, len);
        match (
            at(f.offset, size),
            at(f.offset + metadata_offset(size), meta_len),
        ) {
            (Ok(d), Ok(m)) => {
                // Safety: both ranges lie inside the mapping (checked), in
                // this client's lease, given to this object alone; the
                // sources are distinct Rust slices.
                unsafe {
                    std::ptr::copy_nonoverlapping(data.as_ptr(), d, data.len());
                    std::ptr::copy_nonoverlapping(metadata.as_ptr(), m, metadata.len());
                }
                w.end(&*self.inner, id, fast_writes::SEAL_RELEASE, f.lease)?;
                Ok(true)
            }
            (Err(e), _) | (_, Err(e)) => {
                w.end(&*self.inner, id, fast_writes::ABORT, f.lease)?;
                Err(e)
            }
        }
    }
}
