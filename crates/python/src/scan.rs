//! The scan data path for Python (`ferroplasma.scan`): `NativeScanSource`
//! sends a DuckDB result's batches on the server, `NativeScanReceiver`
//! receives them on the client. Both run their loops in Rust with the GIL
//! released (see the `ferroplasma-scan` crate); Python handles only the
//! control frames and one call per ITERATE (server) or per batch taken
//! (client; none at all through `__arrow_c_stream__`).

use std::collections::HashMap;
use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arrow_array::ffi::{FFI_ArrowArray, FFI_ArrowSchema};
use arrow_array::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
use arrow_array::{Array, StructArray};
use arrow_schema::Schema;
use ferroplasma_client::{MutableBuffer, ObjectId};
use ferroplasma_scan::receiver::{BatchReceiver, Canceller, Options, StoreTarget, Waited};
use ferroplasma_scan::source::BatchSource;
use ferroplasma_scan::store_object::{Hold, StoreSink};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCapsule, PyCapsuleMethods};

use crate::client::NativeClient;
use crate::detach::detach;
use crate::errors::{scan_to_py, ScanError, ScanSide};

const STREAM: &CStr = c"arrow_array_stream";
const SCHEMA: &CStr = c"arrow_schema";
const ARRAY: &CStr = c"arrow_array";

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A query's result on the server: read one batch ahead in a thread of its
/// own, sent as gathered buffers.
#[pyclass(module = "ferroplasma._native", frozen)]
#[derive(Debug)]
pub struct NativeScanSource {
    inner: Mutex<Option<BatchSource>>,
}

#[pymethods]
impl NativeScanSource {
    /// Takes over `stream` (an object with `__arrow_c_stream__`, e.g. a
    /// `pyarrow.RecordBatchReader` over DuckDB's result); `materialize`
    /// reads it to the end first.
    #[new]
    fn new(py: Python<'_>, stream: &Bound<'_, PyAny>, materialize: bool) -> PyResult<Self> {
        let capsule = stream.call_method0("__arrow_c_stream__")?;
        let capsule = capsule.cast::<PyCapsule>()?;
        let ptr = capsule.pointer_checked(Some(STREAM))?;
        // Safety: a capsule named "arrow_array_stream" holds an
        // `ArrowArrayStream` (the Arrow PyCapsule interface); `from_raw`
        // moves it out and leaves a released one for the capsule to drop.
        let reader = unsafe { ArrowArrayStreamReader::from_raw(ptr.as_ptr().cast()) }
            .map_err(|e| PyValueError::new_err(format!("not an Arrow stream: {e}")))?;
        // Safety: the work touches Rust data only (the stream's producer
        // never holds a Python object).
        let source = unsafe { detach(py, move || BatchSource::new(reader, materialize)) }
            .map_err(|e| scan_to_py(e, ScanSide::Server))?;
        Ok(NativeScanSource {
            inner: Mutex::new(Some(source)),
        })
    }

    /// Sends up to `max_batches` BATCH frames of scan `scan` on the socket
    /// `fd` (stopping once `budget` bytes went out, if given): (batches,
    /// bytes, more). A failed query raises `QueryError`, a broken
    /// connection an `OSError`.
    #[pyo3(signature = (fd, scan, max_batches, budget=None))]
    fn send(
        &self,
        py: Python<'_>,
        fd: i32,
        scan: u64,
        max_batches: u64,
        budget: Option<u64>,
    ) -> PyResult<(u64, u64, bool)> {
        if fd < 0 {
            return Err(PyOSError::new_err("the connection is closed"));
        }
        // A descriptor of its own for the send: the caller's socket may be
        // closed by another thread (a server stopping) while this waits for
        // DuckDB, and its number reused; a shutdown still reaches this one.
        // Safety: `fd` is the caller's open socket while it holds the GIL,
        // which it does until this line.
        let conn = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()?;
        let inner = &self.inner;
        // Safety: the work touches Rust data only.
        let sent = unsafe {
            detach(py, move || {
                let mut guard = locked(inner);
                let source = guard.as_mut().ok_or(ferroplasma_scan::Error::Closed)?;
                source.send(conn.as_fd(), scan, max_batches, budget)
            })
        }
        .map_err(|e| scan_to_py(e, ScanSide::Server))?;
        Ok((sent.batches, sent.bytes, sent.more))
    }

    /// Stops reading the result (the producer thread ends) and releases
    /// the stream. Idempotent.
    fn close(&self, py: Python<'_>) {
        let inner = &self.inner;
        // Safety: Rust data only; the stream comes back to be released here,
        // with the GIL held, in case its producer needs it.
        let reader =
            unsafe { detach(py, move || locked(inner).take().and_then(|mut s| s.close())) };
        drop(reader);
    }
}

/// A scan's batches arriving on the client, received by a thread that owns
/// the connection.
#[pyclass(module = "ferroplasma._native", frozen)]
#[derive(Debug)]
pub struct NativeScanReceiver {
    inner: Arc<Mutex<Option<BatchReceiver>>>,
    /// Stops the receiver even while a reader waits inside it.
    canceller: Canceller,
    /// True once handed out as an Arrow C stream (which then owns the scan:
    /// dropping this object must not end it).
    exported: AtomicBool,
    /// The store batches land in, if any (to delete those never handed out).
    store: Option<Py<NativeClient>>,
}

#[pymethods]
impl NativeScanReceiver {
    /// Takes over the socket `fd` (closed by this object from now on, even
    /// if this raises), on which scan `scan` of `schema` (an object with
    /// `__arrow_c_schema__`) was just opened, and starts receiving.
    ///
    /// `store` (a `NativeClient`): land each batch in a new object of that
    /// store instead (`schema_ipc`, the result's schema as Arrow IPC, goes
    /// into each), and hand out ids (`next_id`); `seal_late` seals them only
    /// once the whole result is in.
    #[new]
    #[pyo3(signature = (fd, scan, schema, in_flight=2, per_iterate=64, iterate_bytes=8388608, queue=2, store=None, schema_ipc=None, seal_late=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        fd: i32,
        scan: u64,
        schema: &Bound<'_, PyAny>,
        in_flight: usize,
        per_iterate: u64,
        iterate_bytes: u64,
        queue: usize,
        store: Option<Py<NativeClient>>,
        schema_ipc: Option<Vec<u8>>,
        seal_late: bool,
    ) -> PyResult<Self> {
        if fd < 0 {
            return Err(PyValueError::new_err(format!(
                "{fd} is not a file descriptor"
            )));
        }
        // Safety: the caller hands over an open descriptor it no longer uses
        // (`socket.detach()`); from here it is closed exactly once.
        let conn = unsafe { OwnedFd::from_raw_fd(fd) };
        let capsule = schema.call_method0("__arrow_c_schema__")?;
        let capsule = capsule.cast::<PyCapsule>()?;
        let ptr = capsule.pointer_checked(Some(SCHEMA))?;
        // Safety: a capsule named "arrow_schema" holds an `ArrowSchema`,
        // only read here (the capsule keeps owning it).
        let ffi = unsafe { &*ptr.as_ptr().cast::<FFI_ArrowSchema>() };
        let schema = Schema::try_from(ffi)
            .map_err(|e| PyValueError::new_err(format!("not an Arrow schema: {e}")))?;
        let opts = Options {
            scan,
            in_flight,
            per_iterate: per_iterate.max(1),
            iterate_bytes: iterate_bytes.max(1),
            queue,
        };
        let kept = store.as_ref().map(|s| s.clone_ref(py));
        let store = store.map(|owner| StoreTarget {
            sink: Box::new(ClientSink {
                owner,
                created: HashMap::new(),
            }),
            schema_ipc: schema_ipc.unwrap_or_default(),
            seal_late,
        });
        let receiver = BatchReceiver::start(conn, Arc::new(schema), opts, store)
            .map_err(|e| scan_to_py(e, ScanSide::Client))?;
        Ok(NativeScanReceiver {
            canceller: receiver.canceller(),
            inner: Arc::new(Mutex::new(Some(receiver))),
            exported: AtomicBool::new(false),
            store: kept,
        })
    }

    /// The next batch as `(schema capsule, array capsule)` (for
    /// `pyarrow.RecordBatch._import_from_c_capsule`), or None at the end.
    /// Waits with the GIL released; Ctrl-C interrupts the wait. Errors are
    /// typed (`QueryError`, `ScanServerUnavailable`, ...).
    fn next_batch<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<(Bound<'py, PyCapsule>, Bound<'py, PyCapsule>)>> {
        match self.wait(py)? {
            Some(Waited::Batch(batch)) => {
                let array = StructArray::from(batch);
                let schema = FFI_ArrowSchema::try_from(array.data_type())
                    .map_err(|e| ScanError::new_err(e.to_string()))?;
                let array = FFI_ArrowArray::new(&array.to_data());
                Ok(Some((
                    PyCapsule::new(py, schema, Some(SCHEMA.to_owned()))?,
                    PyCapsule::new(py, array, Some(ARRAY.to_owned()))?,
                )))
            }
            Some(_) => Err(ScanError::new_err(
                "this scan lands its batches in a store: take their ids (next_id)",
            )),
            None => Ok(None),
        }
    }

    /// The id (20 bytes) of the next batch landed in the store, or None at
    /// the end; as `next_batch` otherwise.
    fn next_id<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        match self.wait(py)? {
            Some(Waited::Stored(id)) => Ok(Some(PyBytes::new(py, &id))),
            Some(_) => Err(ScanError::new_err(
                "this scan does not land its batches in a store",
            )),
            None => Ok(None),
        }
    }

    /// The batches as an Arrow C stream (`pyarrow.RecordBatchReader.from_stream`):
    /// C++ then pulls them with no Python in between. Once only; errors
    /// reach pyarrow as `ArrowInvalid`/`OSError` whose message starts with
    /// the `ferroplasma.errors` class name.
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        if requested_schema.is_some_and(|s| !s.is_none()) {
            return Err(PyValueError::new_err(
                "a scan's batches come in the server's schema; cast them after reading",
            ));
        }
        let schema = match locked(&self.inner).as_ref() {
            Some(r) if !self.exported.swap(true, Ordering::Relaxed) => r.schema(),
            _ => {
                return Err(ScanError::new_err(
                    "the scan was closed or is already a stream",
                ))
            }
        };
        let reader = SharedReader {
            inner: self.inner.clone(),
            schema,
        };
        let stream = FFI_ArrowArrayStream::new(Box::new(reader));
        PyCapsule::new(py, stream, Some(STREAM.to_owned()))
    }

    /// Ends the scan (a receiver still running drops the connection, and
    /// the server frees the scan), also once handed out as a C stream;
    /// batches landed in the store but never handed out are deleted.
    /// Idempotent; true if the scan had ended cleanly.
    fn close(&self, py: Python<'_>) -> bool {
        self.shut(py)
    }
}

impl NativeScanReceiver {
    /// Waits for what the receiver hands out next, with the GIL released
    /// and Ctrl-C checked every 200 ms: a batch or an id (`Some`), the end
    /// (`None`), or its typed error.
    fn wait(&self, py: Python<'_>) -> PyResult<Option<Waited>> {
        loop {
            let inner = &self.inner;
            // Safety: Rust data only.
            let waited = unsafe {
                detach(py, move || match locked(inner).as_mut() {
                    Some(r) => r.next_within(Duration::from_millis(200)),
                    None => Waited::Failed(ferroplasma_scan::Error::Closed),
                })
            };
            match waited {
                Waited::End => return Ok(None),
                Waited::Failed(e) => return Err(scan_to_py(e, ScanSide::Client)),
                Waited::Nothing => py.check_signals()?,
                item => return Ok(Some(item)),
            }
        }
    }

    fn shut(&self, py: Python<'_>) -> bool {
        self.canceller.cancel();
        let inner = &self.inner;
        let store = self.store.as_ref().map(|s| s.get());
        // Safety: Rust data only (`NativeClient` is used without the GIL, as
        // its own methods do). The cancel above ends a reader holding the
        // lock.
        unsafe {
            detach(py, move || {
                let Some(mut r) = locked(inner).take() else {
                    return false;
                };
                let clean = r.close();
                let untaken: Vec<ObjectId> = r.take_untaken().into_iter().map(ObjectId).collect();
                if let (Some(store), false) = (store, untaken.is_empty()) {
                    let _ = store.client().delete(&untaken);
                }
                clean
            })
        }
    }
}

impl Drop for NativeScanReceiver {
    fn drop(&mut self) {
        // Never read to the end nor closed (a generator never resumed): end
        // it here, unless a C stream owns it now.
        if !self.exported.load(Ordering::Relaxed) {
            Python::attach(|py| self.shut(py));
        }
    }
}

/// The receiver as the Arrow C stream reads it, shared with the
/// `NativeScanReceiver` so that `close()` still ends it.
struct SharedReader {
    inner: Arc<Mutex<Option<BatchReceiver>>>,
    schema: arrow_schema::SchemaRef,
}

impl Iterator for SharedReader {
    type Item = Result<arrow_array::RecordBatch, arrow_schema::ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        locked(&self.inner).as_mut().and_then(Iterator::next)
    }
}

impl arrow_array::RecordBatchReader for SharedReader {
    fn schema(&self) -> arrow_schema::SchemaRef {
        self.schema.clone()
    }
}

/// Creates a scan's objects in the store of a `NativeClient`, from the
/// receiver's thread (the client is used without the GIL, as every binding
/// does with it).
struct ClientSink {
    owner: Py<NativeClient>,
    created: HashMap<[u8; 20], MutableBuffer>,
}

fn store_error(e: ferroplasma_client::ClientError) -> ferroplasma_scan::Error {
    ferroplasma_scan::Error::Store(Box::new(e))
}

impl StoreSink for ClientSink {
    fn create(&mut self, size: usize) -> ferroplasma_scan::Result<([u8; 20], *mut u8)> {
        let client = self.owner.get().client();
        let id = client.new_id().map_err(store_error)?;
        let wait = Some(Duration::from_secs(30)); // as Python's put_batch_object
        let mut buf = client
            .create_waiting(id, size as u64, &[], wait)
            .map_err(store_error)?;
        if buf.len() < size {
            let _ = client.abort(buf);
            return Err(ferroplasma_scan::Error::Layout(format!(
                "the store made {size} bytes smaller than asked"
            )));
        }
        let data = buf.as_mut_ptr();
        self.created.insert(id.0, buf);
        Ok((id.0, data))
    }

    fn seal(&mut self, id: [u8; 20]) -> ferroplasma_scan::Result<Hold> {
        let buf = self
            .created
            .remove(&id)
            .ok_or(ferroplasma_scan::Error::Closed)?;
        // The sealed buffer holds the creator's reference: the receiver keeps
        // it while the id waits in its queue, then lets go, as Python's
        // put_batch_object releases after sealing.
        let sealed = self.owner.get().client().seal(buf).map_err(store_error)?;
        Ok(Hold(Box::new(sealed)))
    }

    fn abort_unsealed(&mut self) {
        let client = self.owner.get().client();
        for (_, buf) in self.created.drain() {
            let _ = client.abort(buf);
        }
    }

    fn discard(&mut self, id: [u8; 20]) {
        let client = self.owner.get().client();
        match self.created.remove(&id) {
            Some(buf) => drop(client.abort(buf)),
            None => drop(client.delete(&[ObjectId(id)])),
        }
    }
}
