//! `NativeListing`: the pages of a listing as a Python iterator, each page
//! a `dict` from `ObjectID` to a `dict` of the object's figures, built
//! here: a million objects become Python objects in well under a second,
//! where a dict per row made by the facade took seconds.

use crate::detach::detach;
use crate::errors::IntoPy;
use ferroplasma_client::{ListPages, ObjectInfo};
use pyo3::exceptions::PyStopIteration;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString, PyType};
use std::sync::Mutex;

/// The pages of one listing (`NativeClient.list_pages`).
#[pyclass(module = "ferroplasma._native", frozen)]
#[derive(Debug)]
pub struct NativeListing {
    pages: Mutex<ListPages>,
    /// Rows shaped as `ferroplasma.plasma`'s `list()` gives them.
    plasma: bool,
}

impl NativeListing {
    pub(crate) fn new(pages: ListPages, plasma: bool) -> Self {
        Self {
            pages: Mutex::new(pages),
            plasma,
        }
    }
}

#[pymethods]
impl NativeListing {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next page: `{ObjectID: {field: value}}`.
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        // Safety: the work done detached touches no Python object (Rust data
        // only: no Py<T> captured, dropped or returned).
        let page = unsafe {
            detach(py, || {
                let mut pages = self.pages.lock().unwrap_or_else(|p| p.into_inner());
                pages.next()
            })
        };
        match page {
            None => Err(PyStopIteration::new_err(())),
            Some(rows) => {
                let rows = rows.py_err()?;
                let _gc = GcPaused::new(py)?;
                let out = presized(py, rows.len() as u64)?;
                add_rows(&out, &rows, self.plasma)?;
                Ok(out)
            }
        }
    }

    /// Every page left, as one dict (sized for the whole listing once the
    /// first page says how large it is).
    fn read_all<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let _gc = GcPaused::new(py)?;
        let mut out: Option<Bound<'py, PyDict>> = None;
        loop {
            // Safety: the work done detached touches no Python object
            // (Rust data only: no Py<T> captured, dropped or returned).
            let (page, total) = unsafe {
                detach(py, || {
                    let mut pages = self.pages.lock().unwrap_or_else(|p| p.into_inner());
                    (pages.next(), pages.total())
                })
            };
            let out = match out.as_ref() {
                Some(d) => d,
                None => out.insert(presized(py, total.unwrap_or(0))?),
            };
            let Some(rows) = page else {
                return Ok(out.clone());
            };
            add_rows(out, &rows.py_err()?, self.plasma)?;
        }
    }

    /// Objects the store had when the listing started (the most it
    /// returns); None before the first page.
    #[getter]
    fn total(&self) -> Option<u64> {
        self.pages.lock().unwrap_or_else(|p| p.into_inner()).total()
    }
}

/// `ObjectID(raw)` without running its `__init__` (which checks and copies
/// what it is given: a third of the time of a listing), and its hash
/// (`ObjectID.__hash__` is the hash of its bytes).
fn object_id<'py>(
    cls: &Bound<'py, PyType>,
    slot: &Bound<'py, PyString>,
    raw: &[u8],
) -> PyResult<(Bound<'py, PyAny>, ffi::Py_hash_t)> {
    let py = cls.py();
    let tp = cls.as_type_ptr();
    // Safety: `tp` is a live type object (held by `cls`) and we hold the
    // GIL; `tp_alloc` (PyType_GenericAlloc for a class defined in Python)
    // returns a new reference, or NULL with an exception set, which
    // `from_owned_ptr_or_err` turns into the error.
    let obj = unsafe {
        let alloc = (*tp).tp_alloc.unwrap_or(ffi::PyType_GenericAlloc);
        Bound::from_owned_ptr_or_err(py, alloc(tp, 0))?
    };
    let bytes = PyBytes::new(py, raw);
    let hash = bytes.hash()?;
    obj.setattr(slot, bytes)?;
    Ok((obj, hash as ffi::Py_hash_t))
}

/// An empty dict with room for `n` items (no resizing as they come).
fn presized(py: Python<'_>, n: u64) -> PyResult<Bound<'_, PyDict>> {
    let n = ffi::Py_ssize_t::try_from(n).unwrap_or(0);
    // Safety: GIL held; a new reference to a new dict, or NULL with an
    // exception set, which `from_owned_ptr_or_err` turns into the error.
    let d = unsafe { Bound::from_owned_ptr_or_err(py, ffi::_PyDict_NewPresized(n))? };
    Ok(d.cast_into::<PyDict>()?)
}

/// Python's cyclic garbage collector off until dropped (if it was on): a
/// page makes hundreds of thousands of dicts, each of which would count
/// towards a collection that walks every object made so far.
struct GcPaused<'py>(Option<Bound<'py, PyModule>>);

impl<'py> GcPaused<'py> {
    fn new(py: Python<'py>) -> PyResult<Self> {
        let gc = py.import("gc")?;
        if !gc.call_method0("isenabled")?.is_truthy()? {
            return Ok(Self(None));
        }
        gc.call_method0("disable")?;
        Ok(Self(Some(gc)))
    }
}

impl Drop for GcPaused<'_> {
    fn drop(&mut self) {
        if let Some(gc) = &self.0 {
            let _ = gc.call_method0("enable");
        }
    }
}

/// Adds a page's rows to `out` as `{ObjectID: {field: value}}`, the fields
/// of `Client.list()` or, with `plasma`, of `PlasmaClient.list()`.
pub(crate) fn add_rows(out: &Bound<'_, PyDict>, rows: &[ObjectInfo], plasma: bool) -> PyResult<()> {
    let py = out.py();
    let cls = py.import("ferroplasma._ids")?.getattr("ObjectID")?;
    let cls = cls.cast::<PyType>()?;
    let slot = pyo3::intern!(py, "_b");
    let keys: &[&str] = if plasma {
        &[
            "data_size",
            "metadata_size",
            "ref_count",
            "create_time",
            "construct_duration",
            "state",
        ]
    } else {
        &[
            "data_size",
            "metadata_size",
            "ref_count",
            "state",
            "create_time",
            "construct_duration",
            "delete_pending",
            "spilled",
            "cached",
        ]
    };
    let keys: Vec<Bound<'_, PyString>> = keys.iter().map(|k| PyString::intern(py, k)).collect();
    // Each row's dict is a copy of this one (its keys' table copied whole),
    // then its values set: faster than a dict grown a key at a time.
    let template = PyDict::new(py);
    for k in &keys {
        template.set_item(k, py.None())?;
    }
    let sealed = pyo3::intern!(py, "sealed");
    let created = pyo3::intern!(py, "created");
    for o in rows {
        let d = template.copy()?;
        let seconds = o.create_time_us as f64 / 1e6;
        let construct = o.construct_duration_us.map(|u| u as f64 / 1e6);
        let state = if o.sealed { sealed } else { created };
        d.set_item(&keys[0], o.data_size)?;
        d.set_item(&keys[1], o.metadata_size)?;
        d.set_item(&keys[2], o.ref_count)?;
        if plasma {
            d.set_item(&keys[3], seconds.trunc() as i64)?;
            d.set_item(
                &keys[4],
                construct.map_or(-1, |c| c.round_ties_even() as i64),
            )?;
            d.set_item(&keys[5], state)?;
        } else {
            d.set_item(&keys[3], state)?;
            d.set_item(&keys[4], seconds)?;
            d.set_item(&keys[5], construct)?;
            d.set_item(&keys[6], o.delete_pending)?;
            d.set_item(&keys[7], o.spilled)?;
            d.set_item(&keys[8], o.cached)?;
        }
        let (id, hash) = object_id(cls, slot, o.id.as_bytes())?;
        // Safety: GIL held; `out`, `id` and `d` are live objects, which the
        // dict takes new references to (it steals nothing); `hash` is
        // `hash(id)`, as `ObjectID.__hash__` computes it.
        let r =
            unsafe { ffi::_PyDict_SetItem_KnownHash(out.as_ptr(), id.as_ptr(), d.as_ptr(), hash) };
        if r != 0 {
            return Err(PyErr::fetch(py));
        }
    }
    Ok(())
}
