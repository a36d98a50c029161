//! Notifications: each object sealed or deleted in the store, in order.

use crate::client::{client, fp_client};
use crate::handle::{self, impl_kind, Handle};
use crate::id::fp_object_id;
use crate::status::{fp_status, guard, invalid, noted, CapiError};
use ferroplasma_client::{EventKind, Subscription};
use std::time::Duration;

/// A stream of events on its own connection. Made by `fp_subscribe`; freed
/// by `fp_subscription_close`. Use it from one thread at a time.
#[derive(Debug)]
pub struct fp_subscription {
    h: Handle<Subscription>,
}

impl_kind!(fp_subscription, Subscription, "the subscription");

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
        let cl = client(c, "fp_subscribe")?;
        if out.is_null() {
            return Err(invalid("fp_subscribe: out is NULL"));
        }
        let inner = cl.subscribe_with(ferroplasma_client::EventFraming::default(), existing)?;
        // Safety: not NULL, writable (the caller's promise).
        unsafe { out.write(handle::make::<fp_subscription>(inner)) };
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
        let s = handle::value_mut(sub, "fp_subscription_next")?;
        if out.is_null() {
            return Err(invalid("fp_subscription_next: out is NULL"));
        }
        let event = if timeout_ms < 0 {
            s.next_event()?
        } else {
            s.next_timeout(Duration::from_millis(timeout_ms as u64))?
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
    noted(
        handle::value(sub, "fp_subscription_fd").map(|s| s.as_raw_fd()),
        -1,
    )
}

/// Closes the subscription and frees it. NULL is ignored (`FP_OK`); one
/// closed already is `FP_INVALID_ARGUMENT`.
///
/// # Safety
/// `sub` is NULL or a subscription from `fp_subscribe`.
#[no_mangle]
pub unsafe extern "C" fn fp_subscription_close(sub: *mut fp_subscription) -> fp_status {
    guard(|| {
        if !sub.is_null() {
            drop(handle::free(sub, "fp_subscription_close")?);
        }
        Ok(())
    })
}
