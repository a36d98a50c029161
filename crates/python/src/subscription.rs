//! `NativeSubscription`: seal and delete events as a Python iterator.

use crate::detach::detach;
use crate::errors::IntoPy;
use ferroplasma_client::{EventKind, Subscription};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::Mutex;
use std::time::Duration;

/// One event: `(kind, object_id, data_size, metadata_size)` with kind
/// "sealed" or "deleted".
type EventTuple<'py> = (&'static str, Bound<'py, PyBytes>, u64, u64);

/// A stream of events on a connection of its own.
#[pyclass(module = "ferroplasma._native", frozen)]
#[derive(Debug)]
pub struct NativeSubscription {
    inner: Mutex<Subscription>,
}

impl NativeSubscription {
    pub(crate) fn new(s: Subscription) -> Self {
        Self {
            inner: Mutex::new(s),
        }
    }
}

fn tuple<'py>(py: Python<'py>, e: ferroplasma_client::Event) -> EventTuple<'py> {
    let kind = match e.kind {
        EventKind::Sealed => "sealed",
        EventKind::Deleted => "deleted",
    };
    (
        kind,
        PyBytes::new(py, e.id.as_bytes()),
        e.data_size,
        e.metadata_size,
    )
}

#[pymethods]
impl NativeSubscription {
    /// The next event, waiting up to `timeout` seconds (None: forever);
    /// None if none came in time.
    #[pyo3(signature = (timeout=None))]
    fn next_event<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Option<EventTuple<'py>>> {
        // Safety: the work done detached touches no Python object (Rust data
        // only: no Py<T> captured, dropped or returned).
        let ev = unsafe {
            detach(py, || {
                let mut s = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                match timeout {
                    None => s.next_event().map(Some),
                    Some(t) => s.next_timeout(Duration::from_secs_f64(t.max(0.0))),
                }
            })
        };
        Ok(ev.py_err()?.map(|e| tuple(py, e)))
    }

    /// The socket's file descriptor, for selectors.
    fn fileno(&self) -> i32 {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_raw_fd()
    }
}

/// Decodes event frames (as read from a subscription's socket: each a
/// 4-byte length and a `Reply` holding an `Event`) into tuples. Bytes after
/// the last complete frame are ignored.
#[pyfunction]
pub fn decode_events<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Vec<EventTuple<'py>>> {
    let events = ferroplasma_client::decode_event_frames(data).map_err(crate::errors::to_py)?;
    Ok(events.into_iter().map(|e| tuple(py, e)).collect())
}

/// Decodes the body of one message read from a Plasma-framed subscription
/// socket (the bytes after its 8-byte length) into a tuple.
#[pyfunction]
pub fn decode_plasma_event<'py>(py: Python<'py>, body: &[u8]) -> PyResult<EventTuple<'py>> {
    let e = ferroplasma_client::decode_plasma_event(body).map_err(crate::errors::to_py)?;
    Ok(tuple(py, e))
}
