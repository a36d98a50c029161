//! libferroplasma: the ferroplasma client as a C library.
//!
//! Every function returns an [`fp_status`] (`FP_OK` or an error code); the
//! message of the last failed call on the calling thread is
//! `fp_last_error()`. No panic crosses the boundary (it becomes
//! `FP_PANIC`). Handles are opaque pointers, each freed by exactly one call
//! named in its documentation; a handle used after it was freed gets
//! `FP_INVALID_ARGUMENT` while the freeing thread has made fewer than
//! 4,096 frees since and is alive (`handle`).
//! `include/ferroplasma.h` is generated from this crate by cbindgen;
//! docs/languages.md explains ownership and threads and shows complete C,
//! C++ and Go programs.
//!
//! Module map:
//! - [`status`] — status codes, the per-thread error message, the guard
//!   that turns errors and panics into codes.
//! - [`id`] — object ids: random, from and to hex.
//! - [`client`] — connect and disconnect; create, seal, abort, get,
//!   release, contains, delete, evict, list and stats.
//! - [`buffer`] — what a buffer exposes: its bytes, metadata and id.
//! - [`held`] — a batched get held in one handle and released object by
//!   object (what C++'s Plasma `Get` is built on).
//! - `handle` — the handles C code holds (clients, buffers, subscriptions):
//!   each knows whether it was freed, so misuse gets a status.
//! - [`layout`] — how an object Python stored is laid out (its kind and
//!   parts), so C reads numpy and Arrow data in place.
//! - [`subscription`] — notifications of sealed and deleted objects.

#![allow(non_camel_case_types)]

pub mod buffer;
pub mod client;
mod handle;
pub mod held;
pub mod id;
pub mod layout;
pub mod status;
pub mod subscription;

pub use buffer::{fp_buffer, fp_buffer_view, fp_mut_buffer};
pub use client::{fp_client, fp_delete_status, fp_object_info, fp_stats};
pub use held::fp_held;
pub use id::fp_object_id;
pub use layout::{fp_kind, fp_layout, fp_ndarray};
pub use status::{fp_status, CapiError};
pub use subscription::{fp_event, fp_event_kind, fp_subscription};
