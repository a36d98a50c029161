//! Object ids: 20 bytes, as in Plasma.

use crate::status::{fp_status, guard, invalid};
use ferroplasma_client::ObjectId;
use std::ffi::{c_char, CStr};

/// A 20-byte object id.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct fp_object_id {
    /// The id's bytes.
    pub bytes: [u8; 20],
}

impl From<fp_object_id> for ObjectId {
    fn from(id: fp_object_id) -> Self {
        ObjectId(id.bytes)
    }
}

impl From<ObjectId> for fp_object_id {
    fn from(id: ObjectId) -> Self {
        fp_object_id { bytes: id.0 }
    }
}

/// A random id (what Plasma's `ObjectID.from_random` makes).
#[no_mangle]
pub extern "C" fn fp_object_id_random() -> fp_object_id {
    ObjectId::random().into()
}

/// Reads 40 hex digits (NUL-terminated) into `*out`.
///
/// # Safety
/// `hex` is NULL or a NUL-terminated string; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn fp_object_id_from_hex(
    hex: *const c_char,
    out: *mut fp_object_id,
) -> fp_status {
    guard(|| {
        if hex.is_null() || out.is_null() {
            return Err(invalid(
                "fp_object_id_from_hex: hex and out must not be NULL",
            ));
        }
        // Safety: a NUL-terminated string (the caller's promise).
        let text = unsafe { CStr::from_ptr(hex) }
            .to_str()
            .map_err(|_| invalid("the id is not 40 hex digits"))?;
        let id = ObjectId::from_hex(text).map_err(|e| invalid(e.to_string()))?;
        // Safety: `out` is writable (the caller's promise) and not NULL.
        unsafe { out.write(id.into()) };
        Ok(())
    })
}

/// Writes the id as 40 lowercase hex digits and a NUL into `out`, which has
/// room for 41 bytes.
///
/// # Safety
/// `out` is NULL or has room for 41 bytes.
#[no_mangle]
pub unsafe extern "C" fn fp_object_id_to_hex(id: fp_object_id, out: *mut c_char) -> fp_status {
    guard(|| {
        if out.is_null() {
            return Err(invalid("fp_object_id_to_hex: out must not be NULL"));
        }
        let hex = ObjectId::from(id).to_hex();
        // Safety: 40 digits and a NUL fit the 41 bytes the caller provides.
        unsafe {
            std::ptr::copy_nonoverlapping(hex.as_ptr(), out.cast::<u8>(), 40);
            out.add(40).write(0);
        }
        Ok(())
    })
}
