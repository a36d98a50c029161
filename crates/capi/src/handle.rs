//! Handles: what the library gives C code (clients, buffers, buffers being
//! created, subscriptions) lives in a [`Handle`] that knows whether it was
//! freed, so that a handle used after `fp_disconnect`, released twice,
//! sealed twice or closed twice gets a status (`FP_INVALID_ARGUMENT`, "…
//! was freed already") instead of freed memory.
//!
//! A freed handle's memory is not given back at once: it waits in the
//! freeing thread's ring of the last [`QUARANTINE`] handles it freed, and
//! is given back only when pushed out of it. A handle misused within that
//! many frees (a double release right after the first, a client used after
//! its disconnect) is always caught; one used long after is, as in any C
//! library, undefined. The ring is the freeing thread's and holds handles
//! of every kind: 4,096 frees on that thread (four batched gets of 1,000
//! released), or that thread's exit, end a freed handle's protection.

use crate::status::{invalid, CapiError};
use std::cell::{RefCell, UnsafeCell};
use std::sync::atomic::{AtomicU8, Ordering};

/// Freed handles a thread keeps before giving their memory back.
pub(crate) const QUARANTINE: usize = 4096;

const LIVE: u8 = 1;
const FREED: u8 = 2;

/// A value handed to C code, and whether it was freed.
#[derive(Debug)]
pub struct Handle<T> {
    state: AtomicU8,
    value: UnsafeCell<Option<T>>,
}

// Safety: the value is read through shared references only while the
// handle is live and moved out once (the `LIVE` → `FREED` swap decides who);
// `T` itself is Send + Sync, as the library's documented threading needs.
unsafe impl<T: Send + Sync> Sync for Handle<T> {}

impl<T> Handle<T> {
    /// A live handle of `value`.
    pub fn new(value: T) -> Self {
        Self {
            state: AtomicU8::new(LIVE),
            value: UnsafeCell::new(Some(value)),
        }
    }

    /// The value, or an error naming `call` and `what` if the handle was
    /// freed.
    pub fn get(&self, call: &str, what: &str) -> Result<&T, CapiError> {
        if self.state.load(Ordering::Acquire) != LIVE {
            return Err(freed(call, what));
        }
        // Safety: live, so the value is there and only `take` (which first
        // marks the handle freed) moves it out; a take racing this read is
        // the caller using a handle while freeing it, which the library's
        // documentation rules out.
        unsafe { (*self.value.get()).as_ref() }.ok_or_else(|| freed(call, what))
    }

    /// The value, mutably (for handles used from one thread at a time:
    /// buffers being created, subscriptions).
    #[allow(clippy::mut_from_ref)]
    pub fn get_mut(&self, call: &str, what: &str) -> Result<&mut T, CapiError> {
        if self.state.load(Ordering::Acquire) != LIVE {
            return Err(freed(call, what));
        }
        // Safety: as in `get`; one thread at a time uses such a handle (the
        // documented contract), so no other reference to the value exists.
        unsafe { (*self.value.get()).as_mut() }.ok_or_else(|| freed(call, what))
    }

    /// Moves the value out and marks the handle freed: once. A second call
    /// is an error naming `call` and `what`.
    fn take(&self, call: &str, what: &str) -> Result<T, CapiError> {
        self.mark_freed(call, what)?;
        // Safety: this call won the swap to FREED, so it alone moves the
        // value out; readers see FREED and stop.
        unsafe { (*self.value.get()).take() }.ok_or_else(|| freed(call, what))
    }
}

impl<T> Handle<T> {
    /// LIVE → FREED, once: of two threads freeing one handle at once, one
    /// wins and the other gets the error.
    fn mark_freed(&self, call: &str, what: &str) -> Result<(), CapiError> {
        self.state
            .compare_exchange(LIVE, FREED, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
            .map_err(|_| freed(call, what))
    }

    /// Drops the value where it lies and marks the handle freed: once.
    fn clear(&self, call: &str, what: &str) -> Result<(), CapiError> {
        self.mark_freed(call, what)?;
        // Safety: as in `take`.
        unsafe { *self.value.get() = None };
        Ok(())
    }
}

fn freed(call: &str, what: &str) -> CapiError {
    invalid(format!(
        "{call}: {what} was freed already (released, sealed, aborted, closed or disconnected)"
    ))
}

/// A freed handle kept allocated, and how to give its memory back.
type Kept = (*mut u8, unsafe fn(*mut u8));

/// This thread's last [`QUARANTINE`] freed handles.
#[derive(Default)]
struct Ring {
    kept: Vec<Kept>,
    next: usize,
}

impl Drop for Ring {
    fn drop(&mut self) {
        for (p, give_back) in self.kept.drain(..) {
            // Safety: each pointer is kept once, from `Box::into_raw` of the
            // type `give_back` was made for.
            unsafe { give_back(p) };
        }
    }
}

thread_local! {
    static RING: RefCell<Ring> = RefCell::new(Ring::default());
}

/// Gives back the memory of a handle made by `make::<K>`.
///
/// # Safety
/// `p` came from `Box::into_raw` of a `K`, and is given back once.
unsafe fn give_back<K>(p: *mut u8) {
    // Safety: the function's contract.
    drop(unsafe { Box::from_raw(p.cast::<K>()) });
}

/// Keeps `p` (a freed handle) allocated, and gives back the memory of the
/// one it pushes out of this thread's ring.
fn keep<K: Kind>(p: *mut K) {
    let entry: Kept = (p.cast::<u8>(), give_back::<K>);
    let out = RING
        .try_with(|r| {
            let mut r = r.borrow_mut();
            if r.kept.len() < QUARANTINE {
                r.kept.push(entry);
                return None;
            }
            let at = r.next;
            r.next = (at + 1) % QUARANTINE;
            Some(std::mem::replace(&mut r.kept[at], entry))
        })
        // A thread being torn down: nothing is kept.
        .unwrap_or(Some(entry));
    if let Some((old, give)) = out {
        // Safety: kept once, made by `make` for the type `give` is for.
        unsafe { give(old) };
    }
}

/// What a C handle type is made of: its [`Handle`].
pub trait Kind: Sized + 'static {
    /// The value behind the handle.
    type Value;
    /// How the handle is named in errors ("the buffer", ...).
    const WHAT: &'static str;
    fn handle(&self) -> &Handle<Self::Value>;
    fn wrap(h: Handle<Self::Value>) -> Self;
}

/// The [`Kind`] of the C handle type `$name` (a struct with a field
/// `h: Handle<$value>`; the struct itself is written out, for cbindgen),
/// named `$what` in errors.
macro_rules! impl_kind {
    ($name:ident, $value:ty, $what:literal) => {
        impl $crate::handle::Kind for $name {
            type Value = $value;
            const WHAT: &'static str = $what;
            fn handle(&self) -> &$crate::handle::Handle<$value> {
                &self.h
            }
            fn wrap(h: $crate::handle::Handle<$value>) -> Self {
                Self { h }
            }
        }
    };
}
pub(crate) use impl_kind;

/// A new handle of `value`, for C code.
pub(crate) fn make<K: Kind>(value: K::Value) -> *mut K {
    Box::into_raw(Box::new(K::wrap(Handle::new(value))))
}

/// The value of the live handle `p`, or an error (NULL, or freed).
pub(crate) fn value<'a, K: Kind>(p: *const K, call: &str) -> Result<&'a K::Value, CapiError> {
    if p.is_null() {
        return Err(invalid(format!("{call}: {} is NULL", K::WHAT)));
    }
    // Safety: made by `make` (the caller's promise) and, freed or not, still
    // allocated while kept; `get` checks it is live.
    unsafe { &*p }.handle().get(call, K::WHAT)
}

/// The value of the live handle `p`, mutably (a handle used from one
/// thread at a time), or an error (NULL, or freed).
pub(crate) fn value_mut<'a, K: Kind>(p: *mut K, call: &str) -> Result<&'a mut K::Value, CapiError> {
    if p.is_null() {
        return Err(invalid(format!("{call}: {} is NULL", K::WHAT)));
    }
    // Safety: as in `value`.
    unsafe { &*p }.handle().get_mut(call, K::WHAT)
}

/// Frees the handle `p` once and drops its value where it lies (no move):
/// for releases. NULL, or a second free, is an error.
pub(crate) fn drop_value<K: Kind>(p: *mut K, call: &str) -> Result<(), CapiError> {
    if p.is_null() {
        return Err(invalid(format!("{call}: {} is NULL", K::WHAT)));
    }
    // Safety: as in `value`.
    unsafe { &*p }.handle().clear(call, K::WHAT)?;
    keep(p);
    Ok(())
}

/// Frees the handle `p` once: its value is returned (to be dropped or
/// consumed) and the handle is kept allocated a while. NULL, or a second
/// free, is an error.
pub(crate) fn free<K: Kind>(p: *mut K, call: &str) -> Result<K::Value, CapiError> {
    if p.is_null() {
        return Err(invalid(format!("{call}: {} is NULL", K::WHAT)));
    }
    // Safety: as in `value`.
    let value = unsafe { &*p }.handle().take(call, K::WHAT)?;
    keep(p);
    Ok(value)
}
