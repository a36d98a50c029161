//! `NativeClient`: the Rust client as a Python class. Ids cross as 20-byte
//! `bytes`; the Python facade (`ferroplasma.Client`) wraps them in `ObjectID`.

use crate::buffers::{Buffer, Created, WritableBuffer};
use crate::detach::detach;
use crate::errors::{IntoPy, InvalidRequest};
use crate::listing::NativeListing;
use crate::subscription::NativeSubscription;
use ferroplasma_client::{prefetch, Client, DeleteStatus, ObjectId};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyType};
use std::path::PathBuf;
use std::time::Duration;

fn oid(b: &[u8]) -> PyResult<ObjectId> {
    ObjectId::from_slice(b).map_err(|e| InvalidRequest::new_err(e.to_string()))
}

/// The id of an `ObjectID` (its `_b`) or of 20 `bytes`, read in place;
/// anything else (40 hex digits, a bytearray) through `_ids.as_bytes`, which
/// also raises the error for what is no id. A batched get of 1000 objects
/// spent a third of its time converting ids in Python before this.
fn oid_of(item: &Bound<'_, PyAny>) -> PyResult<ObjectId> {
    let py = item.py();
    if let Ok(b) = item.cast_exact::<PyBytes>() {
        return oid(b.as_bytes());
    }
    if let Ok(inner) = item.getattr(pyo3::intern!(py, "_b")) {
        if let Ok(b) = inner.cast_exact::<PyBytes>() {
            return oid(b.as_bytes());
        }
    }
    let as_bytes = py.import("ferroplasma._ids")?.getattr("as_bytes")?;
    let b = as_bytes.call1((item,))?;
    oid(b.cast::<PyBytes>()?.as_bytes())
}

/// The ids of `list`: `ObjectID`s or 20-byte `bytes` (anything else as
/// [`oid_of`] takes it).
///
/// Among millions of ids, each `ObjectID` of a batch and then its bytes lie
/// in memory no cache holds: read one id after the other, that is two
/// cache misses per id, each waited for in turn (a batched get of 1,000
/// random ids among 3,000,000 spent a third of its time there). A list
/// is read in passes instead: the CPU is asked to load every item, then
/// every item's bytes, before they are read, so the misses overlap
/// (`bench/batch_ids.py`: 484 and 591 µs a batch against 594 and 652 µs
/// read one by one, two runs). Any other sequence is read one by one.
fn oids(list: &Bound<'_, PyAny>) -> PyResult<Vec<ObjectId>> {
    let Ok(list) = list.cast_exact::<PyList>() else {
        let items: Vec<Bound<'_, PyAny>> = list.extract()?;
        return items.iter().map(oid_of).collect();
    };
    // The `ObjectID` class, looked up before the passes, which run no
    // Python code (the list stays as it is until its items are copied).
    // Its one slot (`_b`) lies right after the object's header, the word at
    // offset 16, in it and in its subclasses (which add no slots).
    let id_type = list
        .py()
        .import("ferroplasma._ids")
        .and_then(|m| m.getattr("ObjectID"))
        .ok()
        .and_then(|t| t.cast_into::<PyType>().ok());
    let item_at = |i: usize| {
        // Safety: `i` is below the list's length and the GIL is held (the
        // list cannot change meanwhile): a borrowed pointer to a live item.
        unsafe { pyo3::ffi::PyList_GET_ITEM(list.as_ptr(), i as pyo3::ffi::Py_ssize_t) }
    };
    for i in 0..list.len() {
        prefetch(item_at(i));
    }
    if let Some(id_type) = &id_type {
        let id_type = id_type.as_type_ptr();
        for i in 0..list.len() {
            let item = item_at(i);
            // Safety: `item` is a live object (above) and its type a live
            // type object. An `ObjectID` (or a subclass) is at least 24
            // bytes, so the word at offset 16 lies inside it: the pointer to
            // its bytes. It is only a hint to the CPU, never dereferenced.
            unsafe {
                let ty = pyo3::ffi::Py_TYPE(item);
                if (*ty).tp_basicsize >= 24 && pyo3::ffi::PyType_IsSubtype(ty, id_type) != 0 {
                    prefetch(*(item as *const *const u8).add(2));
                }
            }
        }
    }
    let slot = pyo3::intern!(list.py(), "_b");
    // Copied first: a `__getattr__` below cannot change which items are read.
    let items: Vec<Bound<'_, PyAny>> = list.iter().collect();
    let items: Vec<(Bound<'_, PyAny>, Option<Bound<'_, PyBytes>>)> = items
        .into_iter()
        .map(|item| {
            let bytes = match item.cast_exact::<PyBytes>() {
                Ok(b) => Some(b.clone()),
                Err(_) => item
                    .getattr(slot)
                    .ok()
                    .and_then(|b| b.cast_into_exact::<PyBytes>().ok()),
            };
            (item, bytes)
        })
        .collect();
    items
        .iter()
        .map(|(item, bytes)| match bytes {
            Some(b) => oid(b.as_bytes()),
            None => oid_of(item),
        })
        .collect()
}

/// One connection to a store.
#[pyclass(module = "ferroplasma._native", frozen)]
#[derive(Debug)]
pub struct NativeClient {
    inner: Client,
}

impl NativeClient {
    /// The Rust client (for other bindings that work on this connection).
    pub(crate) fn client(&self) -> &Client {
        &self.inner
    }
}

#[pymethods]
impl NativeClient {
    /// Connects to the store at `socket` (None: the default socket), run
    /// by this user, root, or one of `trust_uids`.
    #[new]
    #[pyo3(signature = (socket=None, trust_uids=Vec::new()))]
    fn new(py: Python<'_>, socket: Option<PathBuf>, trust_uids: Vec<u32>) -> PyResult<Self> {
        // Safety: the work done detached touches no Python object (Rust data
        // only: no Py<T> captured, dropped or returned).
        let c = unsafe {
            detach(py, || {
                Client::connect_trusting(socket.as_deref(), &trust_uids)
            })
        }
        .py_err()?;
        Ok(Self { inner: c })
    }

    /// An id for a new object (20 bytes): random on a lone store; on a
    /// cluster member, one claimed cluster-wide ahead (Client::new_id).
    fn new_id<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        // Safety: the work done detached touches no Python object (Rust data
        // only: no Py<T> captured, dropped or returned).
        let id = unsafe { detach(py, || self.inner.new_id()) }.py_err()?;
        Ok(PyBytes::new(py, id.as_bytes()))
    }

    /// Whether this client's user may only read the store.
    #[getter]
    fn read_only(&self) -> bool {
        self.inner.read_only()
    }

    /// Bytes the store manages.
    #[getter]
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }

    /// The socket path.
    #[getter]
    fn socket(&self) -> String {
        self.inner.socket().to_string_lossy().into_owned()
    }

    /// Allocates an object; returns its writable buffer. The caller holds a
    /// reference until `release`. When the store is full of referenced
    /// objects, waits up to `wait_ms` for space (0: not at all, < 0: no limit).
    #[pyo3(signature = (object_id, size, metadata, wait_ms=0))]
    fn create(
        &self,
        py: Python<'_>,
        object_id: &[u8],
        size: u64,
        metadata: &[u8],
        wait_ms: i64,
    ) -> PyResult<WritableBuffer> {
        let id = oid(object_id)?;
        let meta = metadata.to_vec();
        let wait = (wait_ms >= 0).then(|| std::time::Duration::from_millis(wait_ms as u64));
        // Safety: the work done detached touches no Python object (Rust data
        // only: no Py<T> captured, dropped or returned).
        let b =
            unsafe { detach(py, || self.inner.create_waiting(id, size, &meta, wait)) }.py_err()?;
        Ok(WritableBuffer::new(b, self.inner.clone()))
    }

    /// Seals the object `buffer` belongs to; new views of the buffer are
    /// read-only from now on, and it holds the creator's reference until it
    /// is garbage or `release` is called.
    fn seal(&self, py: Python<'_>, buffer: &Bound<'_, WritableBuffer>) -> PyResult<()> {
        let wb = buffer.get();
        let b = wb.take()?;
        // Safety: the work done detached touches no Python object (Rust data
        // only: no Py<T> captured, dropped or returned).
        let sealed = unsafe { detach(py, || self.inner.seal(b)) }.py_err()?;
        wb.set(Created::Sealed(sealed));
        Ok(())
    }

    /// Discards the unsealed object `buffer` belongs to.
    fn abort(&self, py: Python<'_>, buffer: &Bound<'_, WritableBuffer>) -> PyResult<()> {
        let wb = buffer.get();
        let b = wb.take()?;
        // Safety: the work done detached touches no Python object (Rust data
        // only: no Py<T> captured, dropped or returned).
        unsafe { detach(py, || self.inner.abort(b)) }.py_err()?;
        wb.set(Created::Aborted);
        Ok(())
    }

    /// Creates and seals a small object in one message (no reference kept).
    fn create_and_seal(
        &self,
        py: Python<'_>,
        object_id: &[u8],
        data: &Bound<'_, PyAny>,
        metadata: &[u8],
    ) -> PyResult<()> {
        let id = oid(object_id)?;
        let m = metadata.to_vec();
        let buf: PyBuffer<u8> = PyBuffer::get(data)?;
        if !buf.is_c_contiguous() {
            let d = buf.to_vec(py)?;
            // Safety: the work done detached touches no Python object (Rust data
            // only: no Py<T> captured, dropped or returned).
            return unsafe { detach(py, || self.inner.create_and_seal(id, &d, &m)) }.py_err();
        }
        // Read in place, not copied into a Vec first (for 100 MB that copy
        // and its page faults cost more than the copy into the store).
        let (at, len) = (buf.buf_ptr() as usize, buf.len_bytes());
        let work = || {
            // Safety: `buf` keeps the exported, contiguous `len` bytes at
            // `at` alive until it drops after this call returns. As with any
            // copy made with the GIL released (numpy's too), a thread that
            // writes the source meanwhile races only with its own data.
            let d = unsafe { std::slice::from_raw_parts(at as *const u8, len) };
            self.inner.create_and_seal(id, d, &m)
        };
        // Safety: the work done detached touches no Python object (Rust data
        // only: no Py<T> captured, dropped or returned).
        unsafe { detach(py, work) }.py_err()
    }

    /// Gets objects; `timeout_ms` < 0 waits forever, 0 polls. None for
    /// objects not sealed in time.
    fn get_buffers(
        &self,
        py: Python<'_>,
        object_ids: &Bound<'_, PyAny>,
        timeout_ms: i64,
    ) -> PyResult<Vec<Option<Py<Buffer>>>> {
        let ids = oids(object_ids)?;
        let timeout = (timeout_ms >= 0).then(|| Duration::from_millis(timeout_ms as u64));
        let mut out: Vec<Option<Py<Buffer>>> = ids.iter().map(|_| None).collect();
        // Objects sealed in the store's memory, from its shared table, with
        // the GIL held (nothing there waits): each `Buffer` is made as soon
        // as its object is held, while the CPU loads the next objects' slots
        // (`Client::get_local`). Among 10^7 objects that hides most of the
        // time a batch waits for memory.
        let mut failed = None;
        let rest = self
            .inner
            .get_local(&ids, |pos, inner| match Py::new(py, Buffer { inner }) {
                Ok(b) => out[pos] = Some(b),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            })
            .py_err()?;
        if let Some(e) = failed {
            return Err(e);
        }
        if !rest.is_empty() {
            // Safety: the work done detached touches no Python object (Rust
            // data only: no Py<T> captured, dropped or returned).
            let got = unsafe {
                detach(py, || {
                    let mut got = Vec::new();
                    self.inner
                        .get_rest(&ids, rest, timeout, |pos, b| got.push((pos, b)))
                        .map(|()| got)
                })
            }
            .py_err()?;
            for (pos, b) in got {
                if let Some(inner) = b {
                    out[pos] = Some(Py::new(py, Buffer { inner })?);
                }
            }
        }
        Ok(out)
    }

    /// Drops one reference taken by `create` (buffers from `get_buffers`
    /// release themselves when garbage collected).
    fn release(&self, object_id: &[u8]) -> PyResult<()> {
        self.inner.release(oid(object_id)?).py_err()
    }

    /// Whether each object is sealed in the store (with `cluster`: on any
    /// live member of its cluster; with `deleting`, Plasma's answer: also
    /// while a delete waits for the object's last reference).
    #[pyo3(signature = (object_ids, cluster=false, deleting=false))]
    fn contains(
        &self,
        py: Python<'_>,
        object_ids: &Bound<'_, PyAny>,
        cluster: bool,
        deleting: bool,
    ) -> PyResult<Vec<bool>> {
        let ids = oids(object_ids)?;
        // Safety: the work done detached touches no Python object (Rust data
        // only: no Py<T> captured, dropped or returned).
        unsafe {
            detach(py, || {
                if deleting {
                    self.inner.contains_deleting(&ids)
                } else {
                    self.inner.contains_in(&ids, cluster)
                }
            })
        }
        .py_err()
    }

    /// Deletes objects; one of "deleted", "deferred", "not_found" per id.
    fn delete<'py>(
        &self,
        py: Python<'py>,
        object_ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let ids = oids(object_ids)?;
        // Safety: the work done detached touches no Python object (Rust data
        // only: no Py<T> captured, dropped or returned).
        let st = unsafe { detach(py, || self.inner.delete(&ids)) }.py_err()?;
        // The three answers are interned once: a new string per id cost a
        // fifth of a batched delete.
        let [deleted, deferred, not_found] = [
            pyo3::intern!(py, "deleted"),
            pyo3::intern!(py, "deferred"),
            pyo3::intern!(py, "not_found"),
        ];
        PyList::new(
            py,
            st.into_iter().map(|s| match s {
                DeleteStatus::Deleted => deleted,
                DeleteStatus::Deferred => deferred,
                DeleteStatus::NotFound => not_found,
            }),
        )
    }

    /// Every object, as dicts (with `cluster`: every copy on every live
    /// member, each naming its member).
    #[pyo3(signature = (cluster=false))]
    fn list<'py>(&self, py: Python<'py>, cluster: bool) -> PyResult<Vec<Bound<'py, PyDict>>> {
        // Safety: the work done detached touches no Python object (Rust data
        // only: no Py<T> captured, dropped or returned).
        let objs = unsafe { detach(py, || self.inner.list_in(cluster)) }.py_err()?;
        objs.into_iter()
            .map(|o| {
                let d = PyDict::new(py);
                d.set_item("object_id", PyBytes::new(py, o.id.as_bytes()))?;
                d.set_item("data_size", o.data_size)?;
                d.set_item("metadata_size", o.metadata_size)?;
                d.set_item("ref_count", o.ref_count)?;
                d.set_item("state", if o.sealed { "sealed" } else { "created" })?;
                d.set_item("create_time", o.create_time_us as f64 / 1e6)?;
                d.set_item(
                    "construct_duration",
                    o.construct_duration_us.map(|u| u as f64 / 1e6),
                )?;
                d.set_item("delete_pending", o.delete_pending)?;
                d.set_item("spilled", o.spilled)?;
                d.set_item("cached", o.cached)?;
                d.set_item("member", o.node)?;
                Ok(d)
            })
            .collect()
    }

    /// The store's objects, a page of at most `page_size` at a time, each
    /// page `{ObjectID: {field: value}}` (with `plasma`, the fields of
    /// `PlasmaClient.list()`).
    #[pyo3(signature = (page_size, plasma=false))]
    fn list_pages(&self, page_size: usize, plasma: bool) -> NativeListing {
        NativeListing::new(self.inner.list_pages(page_size), plasma)
    }

    /// Evicts LRU objects until `num_bytes` are freed; (freed, count).
    fn evict(&self, py: Python<'_>, num_bytes: u64) -> PyResult<(u64, u64)> {
        // Safety: the work done detached touches no Python object (Rust data
        // only: no Py<T> captured, dropped or returned).
        unsafe { detach(py, || self.inner.evict(num_bytes)) }.py_err()
    }

    /// The store's counters.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        // Safety: the work done detached touches no Python object (Rust data
        // only: no Py<T> captured, dropped or returned).
        let s = unsafe { detach(py, || self.inner.stats()) }.py_err()?;
        let d = PyDict::new(py);
        d.set_item("capacity", s.capacity)?;
        d.set_item("used", s.used)?;
        d.set_item("objects", s.objects)?;
        d.set_item("sealed_objects", s.sealed_objects)?;
        d.set_item("referenced_objects", s.referenced_objects)?;
        d.set_item("clients", s.clients)?;
        d.set_item("evictions", s.evictions)?;
        d.set_item("evicted_bytes", s.evicted_bytes)?;
        d.set_item("largest_free_block", s.largest_free_block)?;
        d.set_item("free_blocks", s.free_blocks)?;
        d.set_item("fragmentation", s.fragmentation)?;
        d.set_item("evictable_bytes", s.evictable_bytes)?;
        d.set_item("spilled_objects", s.spilled_objects)?;
        d.set_item("spilled_bytes", s.spilled_bytes)?;
        d.set_item("spill_dir_bytes", s.spill_dir_bytes)?;
        d.set_item("spills", s.spills)?;
        d.set_item("restores", s.restores)?;
        d.set_item("awaited_objects", s.awaited_objects)?;
        d.set_item("waiting_creates", s.waiting_creates)?;
        Ok(d)
    }

    /// The store's view of its cluster.
    fn cluster_status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        // Safety: the work done detached touches no Python object (Rust data
        // only: no Py<T> captured, dropped or returned).
        let s = unsafe { detach(py, || self.inner.cluster_status()) }.py_err()?;
        let d = PyDict::new(py);
        d.set_item("enabled", s.enabled)?;
        let mut members = Vec::with_capacity(s.members.len());
        for m in &s.members {
            let md = PyDict::new(py);
            md.set_item("address", &m.addr)?;
            md.set_item("data_address", &m.data_addr)?;
            let health = match ferroplasma_client::MemberHealth::try_from(m.health) {
                Ok(ferroplasma_client::MemberHealth::ThisMember) => "this",
                Ok(ferroplasma_client::MemberHealth::Alive) => "alive",
                Ok(ferroplasma_client::MemberHealth::Dead) => "dead",
                Ok(ferroplasma_client::MemberHealth::Refused) => "refused",
                _ => "unknown",
            };
            md.set_item("health", health)?;
            md.set_item("capacity", m.capacity)?;
            md.set_item("used", m.used)?;
            md.set_item("objects", m.objects)?;
            md.set_item("last_seen", m.last_seen_ms as f64 / 1e3)?;
            members.push(md);
        }
        d.set_item("members", members)?;
        d.set_item("fetches", s.fetches)?;
        d.set_item("fetched_bytes", s.fetched_bytes)?;
        d.set_item("served", s.served)?;
        d.set_item("served_bytes", s.served_bytes)?;
        d.set_item("pulls", s.pulls)?;
        d.set_item("lookups", s.lookups)?;
        d.set_item("claims", s.claims)?;
        d.set_item("directory_entries", s.directory_entries)?;
        d.set_item("ids_claimed_ahead", s.ids_claimed_ahead)?;
        d.set_item("updates", s.updates)?;
        d.set_item("updates_pending", s.updates_pending)?;
        Ok(d)
    }

    /// A stream of seal/delete events on a new connection; with
    /// `plasma_framing`, the socket carries them as Plasma's notification
    /// socket did (u64 length, then one event); with `existing`, it starts
    /// with a seal event for each object already sealed.
    #[pyo3(signature = (plasma_framing=false, existing=false))]
    fn subscribe(
        &self,
        py: Python<'_>,
        plasma_framing: bool,
        existing: bool,
    ) -> PyResult<NativeSubscription> {
        let framing = if plasma_framing {
            ferroplasma_client::EventFraming::PlasmaFrames
        } else {
            ferroplasma_client::EventFraming::ReplyFrames
        };
        // Safety: the work done detached touches no Python object (Rust data
        // only: no Py<T> captured, dropped or returned).
        let s = unsafe { detach(py, || self.inner.subscribe_with(framing, existing)) }.py_err()?;
        Ok(NativeSubscription::new(s))
    }
}
