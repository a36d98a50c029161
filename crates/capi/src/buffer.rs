//! Buffers: a sealed object's bytes (`fp_buffer`, read-only, holding a
//! reference to the object) and an object being created (`fp_mut_buffer`).
//! Both are handles (`handle.rs`): a freed one is reported, not read.

use crate::handle::{self, impl_kind, Handle};
use crate::id::fp_object_id;
use crate::status::{fp_status, guard, invalid, noted};
use ferroplasma_client::{MutableBuffer, ObjectBuffer};

/// A sealed object's bytes in the store's shared memory, read-only. While
/// it exists the object is neither freed nor evicted, even if deleted.
/// Made by `fp_get` (or `fp_seal`); freed by `fp_buffer_release`, once.
#[derive(Debug)]
pub struct fp_buffer {
    h: Handle<ObjectBuffer>,
}

impl_kind!(fp_buffer, ObjectBuffer, "the buffer");

/// An object being created: its bytes are writable until it is sealed or
/// aborted. Made by `fp_create`; given back by exactly one `fp_seal` or
/// `fp_abort`, which free it whatever they return.
#[derive(Debug)]
pub struct fp_mut_buffer {
    h: Handle<MutableBuffer>,
}

impl_kind!(fp_mut_buffer, MutableBuffer, "the buffer being created");

/// Where a sealed object's parts lie (`fp_get_views`): pointers into the
/// store's memory, valid while its buffer lives; all zero for an object
/// not sealed in time.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fp_buffer_view {
    /// The data (`fp_buffer_data`).
    pub data: *const u8,
    /// Bytes of data.
    pub size: u64,
    /// The metadata (`fp_buffer_metadata`).
    pub metadata: *const u8,
    /// Bytes of metadata.
    pub metadata_size: u64,
}

impl fp_buffer_view {
    /// Nothing: the view of an object not sealed in time.
    pub(crate) const NONE: Self = Self {
        data: std::ptr::null(),
        size: 0,
        metadata: std::ptr::null(),
        metadata_size: 0,
    };

    /// The view of `b`.
    pub(crate) fn of(b: &ObjectBuffer) -> Self {
        Self {
            data: b.data().as_ptr(),
            size: b.data().len() as u64,
            metadata: b.metadata().as_ptr(),
            metadata_size: b.metadata().len() as u64,
        }
    }
}

/// The object's data (`fp_buffer_size` bytes), valid while the buffer
/// lives; NULL for a NULL or released buffer (`fp_last_error` says which).
///
/// # Safety
/// `buf` is NULL or a buffer from this library.
#[no_mangle]
pub unsafe extern "C" fn fp_buffer_data(buf: *const fp_buffer) -> *const u8 {
    noted(
        handle::value(buf, "fp_buffer_data").map(|b| b.data().as_ptr()),
        std::ptr::null(),
    )
}

/// Bytes of data (0 for a NULL or released buffer).
///
/// # Safety
/// `buf` is NULL or a buffer from this library.
#[no_mangle]
pub unsafe extern "C" fn fp_buffer_size(buf: *const fp_buffer) -> u64 {
    noted(
        handle::value(buf, "fp_buffer_size").map(|b| b.data().len() as u64),
        0,
    )
}

/// The object's metadata (`fp_buffer_metadata_size` bytes), valid while
/// the buffer lives; NULL for a NULL or released buffer.
///
/// # Safety
/// `buf` is NULL or a buffer from this library.
#[no_mangle]
pub unsafe extern "C" fn fp_buffer_metadata(buf: *const fp_buffer) -> *const u8 {
    noted(
        handle::value(buf, "fp_buffer_metadata").map(|b| b.metadata().as_ptr()),
        std::ptr::null(),
    )
}

/// Bytes of metadata (0 for a NULL or released buffer).
///
/// # Safety
/// `buf` is NULL or a buffer from this library.
#[no_mangle]
pub unsafe extern "C" fn fp_buffer_metadata_size(buf: *const fp_buffer) -> u64 {
    noted(
        handle::value(buf, "fp_buffer_metadata_size").map(|b| b.metadata().len() as u64),
        0,
    )
}

/// The object's id (all zeros for a NULL or released buffer).
///
/// # Safety
/// `buf` is NULL or a buffer from this library.
#[no_mangle]
pub unsafe extern "C" fn fp_buffer_id(buf: *const fp_buffer) -> fp_object_id {
    noted(
        handle::value(buf, "fp_buffer_id").map(|b| b.id().into()),
        fp_object_id { bytes: [0; 20] },
    )
}

/// Writes an 8-byte digest of the object (BLAKE2b with an 8-byte output,
/// over its data then its metadata) into `out`: equal objects hash equal on
/// any store, and Python's `PlasmaClient.hash` gives the same bytes.
///
/// # Safety
/// `buf` is NULL or a buffer from this library; `out` is NULL or has room
/// for 8 bytes.
#[no_mangle]
pub unsafe extern "C" fn fp_buffer_hash(buf: *const fp_buffer, out: *mut u8) -> fp_status {
    guard(|| {
        let b = handle::value(buf, "fp_buffer_hash")?;
        if out.is_null() {
            return Err(invalid("fp_buffer_hash: out is NULL"));
        }
        let digest = digest(b.data(), b.metadata());
        // Safety: `out` has room for 8 bytes (the caller's promise).
        unsafe { std::ptr::copy_nonoverlapping(digest.as_ptr(), out, digest.len()) };
        Ok(())
    })
}

/// BLAKE2b of `data` then `metadata`, 8 bytes out (Python's
/// `hashlib.blake2b(digest_size=8)`).
fn digest(data: &[u8], metadata: &[u8]) -> [u8; 8] {
    use blake2::digest::{Update, VariableOutput};
    let mut h = blake2::Blake2bVar::new(8).expect("8 is a valid BLAKE2b output size");
    h.update(data);
    h.update(metadata);
    let mut out = [0u8; 8];
    h.finalize_variable(&mut out)
        .expect("the output is 8 bytes");
    out
}

/// Gives the buffer's reference back to the store and frees the buffer.
/// After this the buffer's pointers are invalid. NULL is ignored
/// (`FP_OK`); a buffer released already is `FP_INVALID_ARGUMENT`.
///
/// # Safety
/// `buf` is NULL or a buffer from this library.
#[no_mangle]
pub unsafe extern "C" fn fp_buffer_release(buf: *mut fp_buffer) -> fp_status {
    guard(|| {
        if !buf.is_null() {
            handle::drop_value(buf, "fp_buffer_release")?;
        }
        Ok(())
    })
}

/// The writable data of an object being created (`fp_mut_buffer_size`
/// bytes), valid until it is sealed or aborted; NULL for a NULL buffer or
/// one sealed or aborted already.
///
/// # Safety
/// `buf` is NULL or a buffer from `fp_create`, used from one thread.
#[no_mangle]
pub unsafe extern "C" fn fp_mut_buffer_data(buf: *mut fp_mut_buffer) -> *mut u8 {
    noted(
        handle::value_mut(buf, "fp_mut_buffer_data").map(|b| b.as_mut_ptr()),
        std::ptr::null_mut(),
    )
}

/// Bytes of data of an object being created (0 for a NULL buffer or one
/// sealed or aborted already).
///
/// # Safety
/// `buf` is NULL or a buffer from `fp_create`.
#[no_mangle]
pub unsafe extern "C" fn fp_mut_buffer_size(buf: *const fp_mut_buffer) -> u64 {
    noted(
        handle::value(buf, "fp_mut_buffer_size").map(|b| b.len() as u64),
        0,
    )
}

/// The id of an object being created (zeros for a NULL buffer or one
/// sealed or aborted already).
///
/// # Safety
/// `buf` is NULL or a buffer from `fp_create`.
#[no_mangle]
pub unsafe extern "C" fn fp_mut_buffer_id(buf: *const fp_mut_buffer) -> fp_object_id {
    noted(
        handle::value(buf, "fp_mut_buffer_id").map(|b| b.id().into()),
        fp_object_id { bytes: [0; 20] },
    )
}

#[cfg(test)]
mod tests {
    /// The digest is Python's `hashlib.blake2b(b"hello" + b"m", digest_size=8)`.
    #[test]
    fn the_digest_is_blake2b_of_8_bytes_over_data_then_metadata() {
        let d = super::digest(b"hello", b"m");
        let python = [244, 170, 216, 120, 107, 17, 181, 227];
        assert_eq!(d, python, "{d:02x?}");
    }
}
