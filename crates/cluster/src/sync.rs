//! Locking the crate's mutexes (the order they nest in: lib.rs).

use std::sync::{Mutex, MutexGuard};

/// Locks `m`. A panic while it was held (a bug) does not take the rest of
/// the cluster down with it.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Microseconds since the Unix epoch.
pub fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}
