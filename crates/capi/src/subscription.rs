//! Notifications: each object sealed or deleted in the store, in order.

use crate::client::fp_client;
use crate::id::fp_object_id;
use crate::status::{fp_status, guard, invalid, CapiError};
use ferroplasma_client::{EventKind, Subscription};
use std::time::Duration;

/// A stream of events on its own connection. Made by `fp_subscribe`; freed
/// by `fp_subscription_close`. Use it from one thread at a time.
#[derive(Debug)]
pub struct fp_subscription {
    inner: Subscription,
}

/// What happened to an object.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum fp_event_kind {
    /// It was sealed.
    FP_EVENT_SEALED = 0,
    /// It was deleted or evicted.
    FP_EVENT_DELETED = 1,
}

/// One event.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fp_event {
    /// Sealed or deleted.
    pub kind: fp_event_kind,
    /// The object.
    pub id: fp_object_id,
    /// Bytes of data (0 for deletions).
    pub data_size: u64,
    /// Bytes of metadata (0 for deletions).
    pub metadata_size: u64,
}

/// Subscribes to the store's events: `*out` receives every object sealed
/// or deleted from now on (with `existing`, first every object sealed
/// already, as Plasma's store did).
///
/// # Safety
/// `c` is a live client; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn fp_subscribe(
    c: *const fp_client,
    existing: bool,
    out: *mut *mut fp_subscription,
) -> fp_status {
    guard(|| {
        // Safety: NULL or a live client (the caller's promise).
        let cl =
            unsafe { c.as_ref() }.ok_or_else(|| invalid("fp_subscribe: the client is NULL"))?;
        if out.is_null() {
            return Err(invalid("fp_subscribe: out is NULL"));
        }
        let inner = cl
            .inner
            .subscribe_with(ferroplasma_client::EventFraming::default(), existing)?;
        // Safety: not NULL, writable (the caller's promise).
        unsafe { out.write(Box::into_raw(Box::new(fp_subscription { inner }))) };
        Ok(())
    })
}

/// Waits up to `timeout_ms` (negative: forever) for the next event and
/// writes it to `*out`; FP_TIMEOUT if none came in time.
///
/// # Safety
/// `sub` is a live subscription; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn fp_subscription_next(
    sub: *mut fp_subscription,
    timeout_ms: i64,
    out: *mut fp_event,
) -> fp_status {
    guard(|| {
        // Safety: NULL or live, used from one thread (the caller's promise).
        let s = unsafe { sub.as_mut() }
            .ok_or_else(|| invalid("fp_subscription_next: the subscription is NULL"))?;
        if out.is_null() {
            return Err(invalid("fp_subscription_next: out is NULL"));
        }
        let event = if timeout_ms < 0 {
            s.inner.next_event()?
        } else {
            s.inner
                .next_timeout(Duration::from_millis(timeout_ms as u64))?
                .ok_or_else(|| CapiError::Timeout(format!("no event within {timeout_ms} ms")))?
        };
        let e = fp_event {
            kind: match event.kind {
                EventKind::Sealed => fp_event_kind::FP_EVENT_SEALED,
                EventKind::Deleted => fp_event_kind::FP_EVENT_DELETED,
            },
            id: event.id.into(),
            data_size: event.data_size,
            metadata_size: event.metadata_size,
        };
        // Safety: not NULL, writable (the caller's promise).
        unsafe { out.write(e) };
        Ok(())
    })
}

/// The subscription's file descriptor, readable when an event is waiting
/// (for poll/epoll); -1 for NULL. Owned by the subscription.
///
/// # Safety
/// `sub` is NULL or a live subscription.
#[no_mangle]
pub unsafe extern "C" fn fp_subscription_fd(sub: *const fp_subscription) -> i32 {
    // Safety: NULL or live (the caller's promise).
    unsafe { sub.as_ref() }.map_or(-1, |s| s.inner.as_raw_fd())
}

/// Closes the subscription and frees it (NULL is ignored).
///
/// # Safety
/// `sub` is NULL or a live subscription, not used again.
#[no_mangle]
pub unsafe extern "C" fn fp_subscription_close(sub: *mut fp_subscription) {
    if !sub.is_null() {
        // Safety: made by Box::into_raw in fp_subscribe, freed once.
        drop(unsafe { Box::from_raw(sub) });
    }
}
