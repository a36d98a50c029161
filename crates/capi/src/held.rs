//! Held batches (`fp_held`): the objects of one batched get, held together
//! in one handle and released one by one, by index. What C++'s Plasma
//! `Get` is built on: it makes no handle per object, so a batch costs one
//! allocation in the library instead of one per object, and each object
//! still stops being in use the moment it is released.

use crate::buffer::fp_buffer_view;
use crate::client::{client, ids_at, timeout};
use crate::handle::{self, impl_kind, Handle};
use crate::id::fp_object_id;
use crate::status::{fp_status, guard, invalid, CapiError};
use ferroplasma_client::{ObjectBuffer, ObjectId};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The objects of one `fp_get_held`, each holding its reference until
/// `fp_held_release` of its index. The handle frees itself with the
/// release of its last object.
#[derive(Debug)]
pub struct fp_held {
    h: Handle<Held>,
}

impl_kind!(fp_held, Held, "the held batch");

/// What an `fp_held` holds.
#[derive(Debug)]
pub struct Held {
    /// The buffers, by index; `None` once released (or never got).
    slots: Vec<UnsafeCell<Option<ObjectBuffer>>>,
    /// Whether each index was released (true from the start where the
    /// object was not got): who swaps it to true takes the buffer.
    released: Vec<AtomicBool>,
    /// Objects not released yet.
    left: AtomicUsize,
}

// Safety: a slot's buffer is moved out only by the one caller that swaps
// its `released` flag from false to true, and is never read otherwise;
// `ObjectBuffer` is Send + Sync. (Send needs no impl: every field is Send.)
unsafe impl Sync for Held {}

/// `fp_get_views`, holding the objects in one batch: `*out` becomes a
/// held batch whose index `i` holds object `ids[i]` (its parts in
/// `views[i]`, all zero if it was not sealed in time), or NULL if none was.
/// Release each object got with `fp_held_release(*out, i)`; the batch is
/// freed with the last.
///
/// # Safety
/// `c` is a live client; `ids` has `n` ids; `out` is writable; `views` has
/// room for `n` views.
#[no_mangle]
pub unsafe extern "C" fn fp_get_held(
    c: *const crate::client::fp_client,
    ids: *const fp_object_id,
    n: usize,
    timeout_ms: i64,
    out: *mut *mut fp_held,
    views: *mut fp_buffer_view,
) -> fp_status {
    guard(|| {
        const CALL: &str = "fp_get_held";
        let cl = client(c, CALL)?;
        let ids = ids_at(ids, n, CALL)?;
        if out.is_null() || (n > 0 && views.is_null()) {
            return Err(invalid(format!("{CALL}: out or views is NULL")));
        }
        // Safety: `fp_object_id` (repr C) and `ObjectId` (repr transparent)
        // are both a `[u8; 20]` and nothing else (size and alignment
        // asserted below), so the slice is read as it lies.
        let ids: &[ObjectId] =
            unsafe { std::slice::from_raw_parts(ids.as_ptr().cast(), ids.len()) };
        let got = cl.get(ids, timeout(timeout_ms))?;
        let mut left = 0;
        let released: Vec<AtomicBool> = got
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let v = b.as_ref().map_or(fp_buffer_view::NONE, fp_buffer_view::of);
                // Safety: `views` has room for `n` views, i < n.
                unsafe { views.add(i).write(v) };
                left += usize::from(b.is_some());
                AtomicBool::new(b.is_none())
            })
            .collect();
        let held = if left == 0 {
            std::ptr::null_mut()
        } else {
            handle::make::<fp_held>(Held {
                // In place: the same allocation as `got`.
                slots: got.into_iter().map(UnsafeCell::new).collect(),
                released,
                left: AtomicUsize::new(left),
            })
        };
        // Safety: checked not NULL; writable (the caller's promise).
        unsafe { out.write(held) };
        Ok(())
    })
}

const _: () = assert!(
    std::mem::size_of::<fp_object_id>() == std::mem::size_of::<ObjectId>()
        && std::mem::align_of::<ObjectId>() == 1
);

/// Ends the use of object `i` of the batch: its reference goes back to the
/// store, and its views are invalid. The last release frees the batch.
/// An index out of range, not got, or released already is
/// `FP_INVALID_ARGUMENT`.
///
/// # Safety
/// `h` is a batch from `fp_get_held`.
#[no_mangle]
pub unsafe extern "C" fn fp_held_release(h: *mut fp_held, i: usize) -> fp_status {
    guard(|| {
        const CALL: &str = "fp_held_release";
        let held = handle::value(h, CALL)?;
        let flag = held.released.get(i).ok_or_else(|| out_of_range(i, held))?;
        if flag.swap(true, Ordering::AcqRel) {
            return Err(invalid(format!(
                "{CALL}: object {i} of the batch was released already, or not got"
            )));
        }
        // Safety: this call swapped the flag, so it alone takes the buffer.
        drop(unsafe { (*held.slots[i].get()).take() });
        if held.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            handle::drop_value(h, CALL)?;
        }
        Ok(())
    })
}

fn out_of_range(i: usize, held: &Held) -> CapiError {
    invalid(format!(
        "fp_held_release: index {i} is out of the batch's {} objects",
        held.slots.len()
    ))
}
