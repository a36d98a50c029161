//! What a blocking call does when a signal interrupts its wait for the
//! store (`EINTR`).
//!
//! By default it waits on, as the standard library's `read_exact` does: a
//! signal never breaks the connection. An embedding runtime may install a
//! check instead: the Python module installs one that runs Python's signal
//! handlers, so that Ctrl-C in a get that waits without a timeout raises
//! `KeyboardInterrupt` at once. The call is then abandoned; its reply, when
//! it comes, is dropped (and the references a get reply carries are given
//! back), and the connection stays usable.

use std::sync::OnceLock;

static CHECK: OnceLock<fn() -> bool> = OnceLock::new();

/// Installs `check`, called on the waiting thread each time a signal
/// interrupts a wait for a reply: true abandons the call with
/// [`crate::ClientError::Interrupted`]. Only the first installation counts.
pub fn set_interrupt_check(check: fn() -> bool) {
    let _ = CHECK.set(check);
}

/// Whether an interrupted call should be abandoned.
pub(crate) fn abandon() -> bool {
    CHECK.get().is_some_and(|check| check())
}
