//! Buffers: a sealed object's bytes (`fp_buffer`, read-only, holding a
//! reference to the object) and an object being created (`fp_mut_buffer`).

use crate::id::fp_object_id;
use ferroplasma_client::{MutableBuffer, ObjectBuffer};

/// A sealed object's bytes in the store's shared memory, read-only. While
/// it exists the object is neither freed nor evicted, even if deleted.
/// Made by `fp_get` (or `fp_seal`); freed by `fp_buffer_release`, once.
#[derive(Debug)]
pub struct fp_buffer {
    pub(crate) inner: ObjectBuffer,
}

/// An object being created: its bytes are writable until it is sealed or
/// aborted. Made by `fp_create`; given back by exactly one `fp_seal` or
/// `fp_abort`, which free it whatever they return.
#[derive(Debug)]
pub struct fp_mut_buffer {
    pub(crate) inner: MutableBuffer,
}

/// The object's data (`fp_buffer_size` bytes), valid while the buffer
/// lives; NULL for a NULL buffer.
///
/// # Safety
/// `buf` is NULL or a live buffer from this library.
#[no_mangle]
pub unsafe extern "C" fn fp_buffer_data(buf: *const fp_buffer) -> *const u8 {
    // Safety: NULL or live (the caller's promise).
    match unsafe { buf.as_ref() } {
        Some(b) => b.inner.data().as_ptr(),
        None => std::ptr::null(),
    }
}

/// Bytes of data (0 for a NULL buffer).
///
/// # Safety
/// `buf` is NULL or a live buffer from this library.
#[no_mangle]
pub unsafe extern "C" fn fp_buffer_size(buf: *const fp_buffer) -> u64 {
    // Safety: NULL or live (the caller's promise).
    unsafe { buf.as_ref() }.map_or(0, |b| b.inner.data().len() as u64)
}

/// The object's metadata (`fp_buffer_metadata_size` bytes), valid while
/// the buffer lives.
///
/// # Safety
/// `buf` is NULL or a live buffer from this library.
#[no_mangle]
pub unsafe extern "C" fn fp_buffer_metadata(buf: *const fp_buffer) -> *const u8 {
    // Safety: NULL or live (the caller's promise).
    match unsafe { buf.as_ref() } {
        Some(b) => b.inner.metadata().as_ptr(),
        None => std::ptr::null(),
    }
}

/// Bytes of metadata (0 for a NULL buffer).
///
/// # Safety
/// `buf` is NULL or a live buffer from this library.
#[no_mangle]
pub unsafe extern "C" fn fp_buffer_metadata_size(buf: *const fp_buffer) -> u64 {
    // Safety: NULL or live (the caller's promise).
    unsafe { buf.as_ref() }.map_or(0, |b| b.inner.metadata().len() as u64)
}

/// The object's id (all zeros for a NULL buffer).
///
/// # Safety
/// `buf` is NULL or a live buffer from this library.
#[no_mangle]
pub unsafe extern "C" fn fp_buffer_id(buf: *const fp_buffer) -> fp_object_id {
    // Safety: NULL or live (the caller's promise).
    unsafe { buf.as_ref() }.map_or(fp_object_id { bytes: [0; 20] }, |b| b.inner.id().into())
}

/// Gives the buffer's reference back to the store and frees the buffer.
/// NULL is ignored. After this the buffer's pointers are invalid.
///
/// # Safety
/// `buf` is NULL or a live buffer from this library, released only once.
#[no_mangle]
pub unsafe extern "C" fn fp_buffer_release(buf: *mut fp_buffer) {
    if !buf.is_null() {
        // Safety: made by Box::into_raw in this library, released once.
        drop(unsafe { Box::from_raw(buf) });
    }
}

/// The writable data of an object being created (`fp_mut_buffer_size`
/// bytes), valid until it is sealed or aborted.
///
/// # Safety
/// `buf` is NULL or a live buffer from `fp_create`.
#[no_mangle]
pub unsafe extern "C" fn fp_mut_buffer_data(buf: *mut fp_mut_buffer) -> *mut u8 {
    // Safety: NULL or live (the caller's promise).
    match unsafe { buf.as_mut() } {
        Some(b) => b.inner.as_mut_ptr(),
        None => std::ptr::null_mut(),
    }
}

/// Bytes of data of an object being created.
///
/// # Safety
/// `buf` is NULL or a live buffer from `fp_create`.
#[no_mangle]
pub unsafe extern "C" fn fp_mut_buffer_size(buf: *const fp_mut_buffer) -> u64 {
    // Safety: NULL or live (the caller's promise).
    unsafe { buf.as_ref() }.map_or(0, |b| b.inner.len() as u64)
}

/// The id of an object being created.
///
/// # Safety
/// `buf` is NULL or a live buffer from `fp_create`.
#[no_mangle]
pub unsafe extern "C" fn fp_mut_buffer_id(buf: *const fp_mut_buffer) -> fp_object_id {
    // Safety: NULL or live (the caller's promise).
    unsafe { buf.as_ref() }.map_or(fp_object_id { bytes: [0; 20] }, |b| b.inner.id().into())
}
