//! Python objects exporting shared memory through the buffer protocol.
//!
//! `memoryview(buf)`, `numpy.frombuffer(buf)` and friends see the object's
//! bytes in place. Each export holds a reference to the Python object, which
//! holds the store reference: the object stays alive while any view exists
//! and is released when the last one goes.

use crate::errors::InvalidObjectState;
use ferroplasma_client::{Client, MutableBuffer, ObjectBuffer, ObjectId};
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Fills `view` for `len` bytes at `ptr`; read-only unless `writable`.
///
/// # Safety
/// `view` must be the pointer CPython passed to `__getbuffer__`, `owner` the
/// exporting object, and `[ptr, ptr+len)` must stay valid while `owner` lives.
unsafe fn fill(
    view: *mut ffi::Py_buffer,
    owner: &Bound<'_, PyAny>,
    ptr: *mut u8,
    len: usize,
    writable: bool,
    flags: c_int,
) -> PyResult<()> {
    if view.is_null() {
        return Err(PyBufferError::new_err("no view to fill"));
    }
    // Safety: per this function's contract; PyBuffer_FillInfo checks the
    // flags (refusing a writable request on read-only memory with a
    // BufferError) and takes a new reference to `owner`.
    let rc = unsafe {
        ffi::PyBuffer_FillInfo(
            view,
            owner.as_ptr(),
            ptr as *mut c_void,
            len as ffi::Py_ssize_t,
            if writable { 0 } else { 1 },
            flags,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(PyErr::fetch(owner.py()))
    }
}

/// A sealed object: read-only, zero-copy. Supports the buffer protocol.
#[pyclass(module = "ferroplasma._native", frozen)]
#[derive(Debug)]
pub struct Buffer {
    pub(crate) inner: ObjectBuffer,
}

#[pymethods]
impl Buffer {
    /// The object id (20 bytes).
    #[getter]
    fn object_id<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.inner.id().as_bytes())
    }

    /// The metadata, copied into a bytes object (metadata is small).
    #[getter]
    fn metadata<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.inner.metadata())
    }

    /// Address of the data in this process (for diagnostics and tests).
    #[getter]
    fn address(&self) -> usize {
        self.inner.as_ptr() as usize
    }

    fn __len__(&self) -> usize {
        self.inner.data().len()
    }

    fn __repr__(&self) -> String {
        format!(
            "<ferroplasma Buffer {} ({} bytes)>",
            self.inner.id(),
            self.inner.data().len()
        )
    }

    /// Buffer protocol: a read-only view of the data.
    ///
    /// # Safety
    /// Called by CPython with a valid `view`.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let data = slf.get().inner.data();
        let (ptr, len) = (data.as_ptr() as *mut u8, data.len());
        // Safety: the data lies in the mapping kept alive by `inner`, which
        // lives as long as `slf`, which the view references.
        unsafe { fill(view, slf.as_any(), ptr, len, false, flags) }
    }

    /// Buffer protocol: nothing to undo (the view's reference to `self` is
    /// dropped by CPython).
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// What a [`WritableBuffer`] holds: the writable object until it is sealed
/// (then the sealed view, which holds the creator's reference) or aborted.
#[derive(Debug)]
pub(crate) enum Created {
    Writing(MutableBuffer),
    /// Kept for its drop, which gives the creator's reference back.
    Sealed(#[allow(dead_code)] ObjectBuffer),
    Aborted,
}

/// An object being created: writable until sealed.
#[pyclass(module = "ferroplasma._native", frozen)]
#[derive(Debug)]
pub struct WritableBuffer {
    pub(crate) state: Mutex<Created>,
    /// Keeps the arena mapped while views exported before a seal or an
    /// abort still point into it.
    pub(crate) _keep: Client,
    pub(crate) id: ObjectId,
    /// Address and length of the data (fixed for the object's life).
    pub(crate) addr: usize,
    pub(crate) len: usize,
    pub(crate) sealed: AtomicBool,
}

impl WritableBuffer {
    pub(crate) fn new(buf: MutableBuffer, keep: Client) -> Self {
        Self {
            id: buf.id(),
            addr: buf.data_ptr() as usize,
            len: buf.len(),
            state: Mutex::new(Created::Writing(buf)),
            _keep: keep,
            sealed: AtomicBool::new(false),
        }
    }

    /// Takes the writable object out (for seal or abort); an error if it
    /// was sealed or aborted already.
    pub(crate) fn take(&self) -> PyResult<MutableBuffer> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *st, Created::Aborted) {
            Created::Writing(b) => Ok(b),
            other => {
                let what = if matches!(other, Created::Sealed(_)) {
                    "sealed"
                } else {
                    "aborted"
                };
                *st = other;
                Err(InvalidObjectState::new_err(format!(
                    "object {} was already {what} through this buffer",
                    self.id
                )))
            }
        }
    }

    /// Puts the object's new state in.
    pub(crate) fn set(&self, state: Created) {
        if matches!(state, Created::Sealed(_)) {
            self.sealed.store(true, Ordering::Release);
        }
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = state;
    }
}

#[pymethods]
impl WritableBuffer {
    /// The object id (20 bytes).
    #[getter]
    fn object_id<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.id.as_bytes())
    }

    fn __len__(&self) -> usize {
        self.len
    }

    fn __repr__(&self) -> String {
        format!(
            "<ferroplasma WritableBuffer {} ({} bytes)>",
            self.id, self.len
        )
    }

    /// Buffer protocol: writable until the object is sealed through this
    /// client; read-only afterwards.
    ///
    /// # Safety
    /// Called by CPython with a valid `view`.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let me = slf.get();
        let writable = !me.sealed.load(Ordering::Acquire);
        if !writable && (flags & ffi::PyBUF_WRITABLE) != 0 {
            return Err(PyBufferError::new_err(
                "the object is sealed: its buffer is read-only",
            ));
        }
        // Safety: the allocation lies in the mapping kept alive by `_keep`,
        // which lives as long as `slf`, which the view references.
        unsafe {
            fill(
                view,
                slf.as_any(),
                me.addr as *mut u8,
                me.len,
                writable,
                flags,
            )
        }
    }

    /// Buffer protocol: nothing to undo.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}
