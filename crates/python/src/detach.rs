//! Running blocking Rust with the GIL released, safely at interpreter exit.
//!
//! [`detach`] is `Python::detach` with one difference. When a daemon thread
//! comes back from a blocking call (a `get` that waited, a subscription's
//! next event) after the interpreter began to shut down, CPython before 3.14
//! ends the thread with `pthread_exit` inside `PyEval_RestoreThread`. That is
//! a forced unwind, and PyO3 declares that function as one that cannot
//! unwind, so the process aborted (`FATAL: exception not rethrown`, exit
//! status 134). Here the call is declared `C-unwind` and a guard on the stack
//! parks the thread for good instead, which is what CPython 3.14 itself does
//! (and what PyO3 does around `PyGILState_Ensure`). The process then exits
//! normally: the parked thread holds no lock of ours, since the work done
//! while detached has returned by then.
//!
//! It is `unsafe`, where `Python::detach` is safe: PyO3's own bookkeeping
//! still counts this thread as attached while the work runs, so the work
//! must not touch a Python object at all. A `Py<T>` is `Send` (the
//! [`Ungil`] bound lets it in), and dropping one here would decrement its
//! count without the GIL, where PyO3's `detach` would have deferred it;
//! `Python::attach` here would not take the GIL. The work reaches Python
//! only through `PyGILState_Ensure`, as [`crate::signal_raised`] does.

use pyo3::ffi;
use pyo3::marker::Ungil;
use pyo3::Python;

mod raw {
    use pyo3::ffi::PyThreadState;

    extern "C-unwind" {
        /// `PyEval_RestoreThread`, declared as what it is before Python
        /// 3.14 during shutdown: a function that may unwind (pthread_exit).
        #[link_name = "PyEval_RestoreThread"]
        pub fn restore_thread(tstate: *mut PyThreadState);
    }
}

/// Parks the thread forever when dropped: run only if a forced unwind
/// (CPython ending the thread at shutdown) passes through [`Reattach`].
struct HangThread;

impl Drop for HangThread {
    fn drop(&mut self) {
        loop {
            std::thread::park();
        }
    }
}

/// Takes the GIL back when dropped: on return and on a panic alike.
struct Reattach(*mut ffi::PyThreadState);

impl Drop for Reattach {
    fn drop(&mut self) {
        let hang = HangThread;
        // Safety: `self.0` is the state `PyEval_SaveThread` returned on this
        // thread, restored exactly once. If the interpreter is finalizing,
        // CPython < 3.14 unwinds out of this call; `hang` then parks the
        // thread before the unwind reaches a frame that cannot take it.
        unsafe { raw::restore_thread(self.0) };
        std::mem::forget(hang);
    }
}

/// Runs `f` with the GIL released and takes it back afterwards; a thread
/// that comes back while the interpreter is exiting parks instead of
/// aborting the process. Use it for every call that may block.
///
/// # Safety
/// `f` must not touch a Python object: no `Py<T>` captured, dropped or
/// returned, no `Python::attach`; it may reach the interpreter only through
/// `PyGILState_Ensure`/`PyGILState_Release`.
pub(crate) unsafe fn detach<T, F>(_py: Python<'_>, f: F) -> T
where
    F: Ungil + FnOnce() -> T,
    T: Ungil,
{
    // Safety: the `Python` token proves this thread holds the GIL, which
    // `PyEval_SaveThread` requires; `Reattach` restores it exactly once.
    let _reattach = Reattach(unsafe { ffi::PyEval_SaveThread() });
    f()
}
