//! Fork detection without a syscall per call: a `pthread_atfork` child hook
//! bumps a counter; a client made before a fork sees a different value.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

static GENERATION: AtomicU64 = AtomicU64::new(0);
static INSTALL: Once = Once::new();

extern "C" fn in_child() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// The current fork generation (installs the hook on first use).
pub(crate) fn generation() -> u64 {
    INSTALL.call_once(|| {
        // Safety: `in_child` is an `extern "C"` function that only touches an
        // atomic, which is async-signal-safe as required in a forked child;
        // registering handlers has no other precondition.
        unsafe {
            libc::pthread_atfork(None, None, Some(in_child));
        }
    });
    GENERATION.load(Ordering::Relaxed)
}
