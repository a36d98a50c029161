//! The parts of `ferroplasma.serialization` that are faster in Rust: a
//! parallel copy of large buffers into the store, and the layout of a list
//! of `str` (kind 5), which pickle serializes at ~75 ns a string.
//!
//! The list layout, all integers little-endian `u64`:
//!
//! ```text
//! n, offsets[0..=n] (into the data, offsets[0] = 0), data (UTF-8)
//! ```

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};

use crate::detach::detach;
use crate::errors::serialization_error;

/// Below this many bytes a copy is one `memcpy`: threads cost more than
/// they save (measured: `bench/python_serialization.py`, numpy put).
const PARALLEL_FROM: usize = 8 << 20;
/// Each thread copies at least this much.
const PER_THREAD: usize = 4 << 20;
const MAX_THREADS: usize = 4;

/// A writable, C-contiguous byte view of `obj`, or a clear error.
fn writable(obj: &Bound<'_, PyAny>) -> PyResult<PyBuffer<u8>> {
    let buf = PyBuffer::<u8>::get(obj)?;
    if buf.readonly() {
        return Err(PyBufferError::new_err("the target buffer is read-only"));
    }
    if !buf.is_c_contiguous() {
        return Err(PyBufferError::new_err(
            "the target buffer is not contiguous",
        ));
    }
    Ok(buf)
}

fn contiguous(obj: &Bound<'_, PyAny>) -> PyResult<PyBuffer<u8>> {
    let buf = PyBuffer::<u8>::get(obj)?;
    if !buf.is_c_contiguous() {
        return Err(PyBufferError::new_err(
            "the source buffer is not contiguous",
        ));
    }
    Ok(buf)
}

/// A pointer that may cross to the copying threads.
#[derive(Clone, Copy)]
struct Span(*mut u8);
// Safety: each thread writes a disjoint range of the target, which outlives
// the scope the threads run in.
unsafe impl Send for Span {}

/// Copies `src` into `dst` (same size), with several threads when it is
/// large; the GIL is released meanwhile.
#[pyfunction]
pub fn copy_into(py: Python<'_>, dst: &Bound<'_, PyAny>, src: &Bound<'_, PyAny>) -> PyResult<()> {
    let d = writable(dst)?;
    let s = contiguous(src)?;
    let n = s.len_bytes();
    if d.len_bytes() != n {
        return Err(PyValueError::new_err(format!(
            "size mismatch: copying {n} bytes into a buffer of {}",
            d.len_bytes()
        )));
    }
    if n == 0 {
        return Ok(());
    }
    let (to, from) = (Span(d.buf_ptr().cast()), Span(s.buf_ptr().cast()));
    let work = move || {
        let threads = if n < PARALLEL_FROM {
            1
        } else {
            let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
            (n / PER_THREAD).clamp(1, cores.min(MAX_THREADS))
        };
        let chunk = n.div_ceil(threads);
        std::thread::scope(|scope| {
            for i in 1..threads {
                let start = i * chunk;
                let len = chunk.min(n - start);
                scope.spawn(move || {
                    let (to, from) = (to, from);
                    // Safety: [start, start+len) lies inside both buffers
                    // (same size n), the ranges of the threads do not
                    // overlap, and the PyBuffers keep both alive until the
                    // scope ends.
                    unsafe {
                        std::ptr::copy_nonoverlapping(from.0.add(start), to.0.add(start), len)
                    };
                });
            }
            // Safety: as above, for the first chunk, copied on this thread.
            unsafe { std::ptr::copy_nonoverlapping(from.0, to.0, chunk.min(n)) };
        });
    };
    // Safety: the work done detached touches no Python object (Rust data
    // only: no Py<T> captured, dropped or returned).
    unsafe { detach(py, work) };
    Ok(())
}

/// The UTF-8 bytes of each element when `obj` is a list of exact `str`
/// (no subclass, encodable), else None.
fn utf8_items<'a>(list: &'a Bound<'_, PyList>) -> Option<Vec<&'a [u8]>> {
    let mut out = Vec::with_capacity(list.len());
    for item in list.iter() {
        let s = item.cast_exact::<PyString>().ok()?;
        // Safety: the bytes are the string's cached UTF-8 form, which lives
        // as long as the string; the list holds the string, and `list`
        // outlives the returned slices ('a). A string changed under us is
        // impossible (str is immutable); a list changed under us is caught
        // by the length checks of the writer.
        let bytes: &'a [u8] = unsafe {
            let mut len: pyo3::ffi::Py_ssize_t = 0;
            let p = pyo3::ffi::PyUnicode_AsUTF8AndSize(s.as_ptr(), &mut len);
            if p.is_null() {
                pyo3::ffi::PyErr_Clear();
                return None;
            }
            std::slice::from_raw_parts(p.cast::<u8>(), len as usize)
        };
        out.push(bytes);
    }
    Some(out)
}

fn layout_size(items: &[&[u8]]) -> usize {
    8 * (items.len() + 2) + items.iter().map(|b| b.len()).sum::<usize>()
}

/// The payload size of `obj` in the list-of-str layout, or None when `obj`
/// is not a non-empty list of exact, UTF-8-encodable `str`.
#[pyfunction]
pub fn str_list_size(obj: &Bound<'_, PyAny>) -> Option<usize> {
    let list = obj.cast_exact::<PyList>().ok()?;
    if list.is_empty() {
        return None;
    }
    utf8_items(list).map(|items| layout_size(&items))
}

/// Writes `obj` in the list-of-str layout into `target`, which must be
/// exactly `str_list_size(obj)` bytes.
#[pyfunction]
pub fn str_list_write(obj: &Bound<'_, PyAny>, target: &Bound<'_, PyAny>) -> PyResult<()> {
    let changed = || serialization_error("the list changed while it was being stored");
    let list = obj.cast_exact::<PyList>().map_err(|_| changed())?;
    let items = utf8_items(list).ok_or_else(changed)?;
    let buf = writable(target)?;
    let size = layout_size(&items);
    if items.is_empty() || buf.len_bytes() != size {
        return Err(changed());
    }
    // Safety: the buffer is writable, contiguous and `size` bytes long, and
    // stays exported while `buf` lives.
    let out = unsafe { std::slice::from_raw_parts_mut(buf.buf_ptr().cast::<u8>(), size) };
    let n = items.len();
    out[..8].copy_from_slice(&(n as u64).to_le_bytes());
    let data_at = 8 * (n + 2);
    let mut offset = 0usize;
    out[8..16].copy_from_slice(&0u64.to_le_bytes());
    for (i, b) in items.iter().enumerate() {
        out[data_at + offset..data_at + offset + b.len()].copy_from_slice(b);
        offset += b.len();
        out[16 + 8 * i..24 + 8 * i].copy_from_slice(&(offset as u64).to_le_bytes());
    }
    Ok(())
}

fn read_u64(data: &[u8], at: usize) -> Option<usize> {
    let b = data.get(at..at + 8)?;
    usize::try_from(u64::from_le_bytes(b.try_into().ok()?)).ok()
}

/// Rebuilds the list from its layout (any buffer).
#[pyfunction]
pub fn str_list_read<'py>(
    py: Python<'py>,
    payload: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyList>> {
    let corrupt = |what: &str| serialization_error(format!("corrupt list of strings ({what})"));
    let buf = contiguous(payload)?;
    // Safety: a contiguous exported buffer of len_bytes() bytes, alive while
    // `buf` lives; only read.
    let data = unsafe { std::slice::from_raw_parts(buf.buf_ptr().cast::<u8>(), buf.len_bytes()) };
    let n = read_u64(data, 0).ok_or_else(|| corrupt("no count"))?;
    let data_at = n
        .checked_add(2)
        .and_then(|k| k.checked_mul(8))
        .filter(|&at| at <= data.len())
        .ok_or_else(|| corrupt("count past the end"))?;
    let text = &data[data_at..];
    let len = pyo3::ffi::Py_ssize_t::try_from(n).map_err(|_| corrupt("count"))?;
    // Safety: PyList_New returns a new list of `n` NULL items (or NULL with
    // an exception set); Bound takes ownership of that reference. Every
    // item is set below before the list is returned; on an error the
    // list is dropped with some items still NULL, which list_dealloc
    // allows.
    let list = unsafe {
        Bound::from_owned_ptr_or_err(py, pyo3::ffi::PyList_New(len))?
            .cast_into_unchecked::<PyList>()
    };
    let mut start = 0usize;
    for i in 0..n {
        let end = read_u64(data, 16 + 8 * i).ok_or_else(|| corrupt("offsets"))?;
        let bytes = text
            .get(start..end)
            .ok_or_else(|| corrupt("offset past the end"))?;
        // Safety: `bytes` is valid for reads of its length. ASCII text is
        // copied into a new compact ASCII string of that length (its data
        // is `len` one-byte characters, NUL-terminated by PyUnicode_New);
        // anything else goes through the UTF-8 decoder, which checks it
        // (NULL and an exception when invalid). PyList_SET_ITEM steals the
        // new reference into slot i < n of a list nobody else has seen yet.
        unsafe {
            let len = bytes.len() as pyo3::ffi::Py_ssize_t;
            let s = if bytes.is_ascii() {
                let s = pyo3::ffi::PyUnicode_New(len, 127);
                if !s.is_null() {
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr(),
                        pyo3::ffi::PyUnicode_DATA(s).cast::<u8>(),
                        bytes.len(),
                    );
                }
                s
            } else {
                pyo3::ffi::PyUnicode_DecodeUTF8(bytes.as_ptr().cast(), len, c"strict".as_ptr())
            };
            if s.is_null() {
                pyo3::ffi::PyErr_Clear();
                return Err(corrupt("not UTF-8"));
            }
            pyo3::ffi::PyList_SET_ITEM(list.as_ptr(), i as pyo3::ffi::Py_ssize_t, s);
        }
        start = end;
    }
    Ok(list)
}
