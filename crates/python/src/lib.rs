//! PyO3 bindings: the private module `ferroplasma._native`.
//!
//! Only bindings live here; the Python-facing API (serialization, the
//! `Client` facade, `start_store`) is in `python/ferroplasma/`.
//!
//! Module map:
//! - [`client`] — `NativeClient`: one connection; every blocking call releases the GIL.
//! - [`buffers`] — `Buffer` (sealed, read-only) and `WritableBuffer` (being
//!   created), both exporting the buffer protocol without copying.
//! - [`codec`] — the parallel copy into the store and the list-of-`str`
//!   layout of `ferroplasma.serialization`.
//! - [`subscription`] — `NativeSubscription`, an iterator of events.
//! - [`listing`] — `NativeListing`, a listing's pages as dicts keyed by `ObjectID`.
//! - [`detach`] — runs blocking calls with the GIL released, parking (not
//!   aborting) a thread that comes back while the interpreter exits.
//! - [`scan`] — `NativeScanSource` and `NativeScanReceiver`, the data path of
//!   `ferroplasma.scan` (batches as gathered buffers, no Python per batch).
//! - [`errors`] — the one mapping from `ClientError` (and scan errors) to
//!   `ferroplasma.errors`.

pub mod buffers;
pub mod client;
pub mod codec;
pub mod detach;
pub mod errors;
pub mod listing;
pub mod scan;
pub mod subscription;

use detach::detach;
use pyo3::prelude::*;

/// Runs the `ferroplasma` command line with `argv` (program name first) and
/// returns its exit code. Used by the console script, so that `pip install`
/// alone gives a working store.
#[pyfunction]
fn run_cli(py: Python<'_>, argv: Vec<String>) -> i32 {
    // Safety: the work done detached touches no Python object (Rust data
    // only: no Py<T> captured, dropped or returned).
    unsafe { detach(py, || ferroplasma_daemon::cli::main_with_args(argv)) }
}

/// The default socket path: `$FERROPLASMA_SOCKET`, else `/tmp/ferroplasma.sock`.
#[pyfunction]
fn default_socket() -> String {
    ferroplasma_client::default_socket_path(None)
        .to_string_lossy()
        .into_owned()
}

/// Runs Python's signal handlers from a call waiting for the store that a
/// signal interrupted: true (abandon the call) when one raised, e.g.
/// `KeyboardInterrupt` on Ctrl-C; the exception stays set for the caller.
///
/// Called from work running under [`detach`], so it takes the GIL with
/// `PyGILState_Ensure` (PyO3's guarded version, which parks the thread if
/// the interpreter is exiting), not `Python::attach`.
fn signal_raised() -> bool {
    // Safety: `PyGILState_Ensure` makes this thread hold the GIL whatever
    // its state was, `PyErr_CheckSignals` needs only that, and
    // `PyGILState_Release` undoes exactly this `Ensure`.
    unsafe {
        let gil = pyo3::ffi::PyGILState_Ensure();
        let raised = pyo3::ffi::PyErr_CheckSignals() != 0;
        pyo3::ffi::PyGILState_Release(gil);
        raised
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    ferroplasma_client::set_interrupt_check(signal_raised);
    m.add_class::<client::NativeClient>()?;
    m.add_class::<buffers::Buffer>()?;
    m.add_class::<buffers::WritableBuffer>()?;
    m.add_class::<subscription::NativeSubscription>()?;
    m.add_class::<listing::NativeListing>()?;
    m.add_class::<scan::NativeScanSource>()?;
    m.add_class::<scan::NativeScanReceiver>()?;
    m.add_function(wrap_pyfunction!(codec::copy_into, m)?)?;
    m.add_function(wrap_pyfunction!(codec::str_list_size, m)?)?;
    m.add_function(wrap_pyfunction!(codec::str_list_write, m)?)?;
    m.add_function(wrap_pyfunction!(codec::str_list_read, m)?)?;
    m.add_function(wrap_pyfunction!(run_cli, m)?)?;
    m.add_function(wrap_pyfunction!(default_socket, m)?)?;
    m.add_function(wrap_pyfunction!(subscription::decode_events, m)?)?;
    m.add_function(wrap_pyfunction!(subscription::decode_plasma_event, m)?)?;
    Ok(())
}
