//! How an object that Python stored is laid out (docs/serialization.md),
//! so that C and C++ read its parts where they lie in the store: the
//! payload (an Arrow IPC stream, a pickle stream, ...) and the out-of-band
//! buffers (numpy data, Arrow buffers).

use crate::buffer::fp_buffer;
use crate::status::{fp_status, guard, invalid, CapiError};
use std::ffi::c_char;

/// The kind of an object (the byte at offset 5 of Python's header).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum fp_kind {
    /// A pickle protocol-5 stream and its out-of-band buffers (numpy
    /// arrays, pandas frames, any Python object).
    FP_KIND_PICKLE = 0,
    /// An Arrow IPC stream of a table (the payload).
    FP_KIND_ARROW_TABLE = 1,
    /// An Arrow IPC stream of one record batch (the payload).
    FP_KIND_ARROW_BATCH = 2,
    /// A record batch as its Arrow buffers (what a scan lands).
    FP_KIND_ARROW_BUFFERS = 3,
    /// A Python `bytes` object (the payload is its bytes).
    FP_KIND_BYTES = 4,
    /// A list of Python `str`: count, offsets, UTF-8 text (the payload).
    FP_KIND_STR_LIST = 5,
    /// A numpy array: dtype, shape and order (`fp_ndarray_info`) and its
    /// data (buffer 0).
    FP_KIND_NDARRAY = 6,
    /// No header: bytes written with create/seal, taken as they are.
    FP_KIND_RAW = 255,
}

/// Where an object's parts lie. Pointers point into the store's memory and
/// are valid while the buffer they came from lives.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fp_layout {
    /// The kind.
    pub kind: fp_kind,
    /// Format version of the header (0 for raw objects).
    pub version: u8,
    /// The payload (for FP_KIND_RAW: the whole object).
    pub payload: *const u8,
    /// Bytes of payload.
    pub payload_size: u64,
    /// Out-of-band buffers (`fp_layout_buffer` gives each).
    pub buffer_count: u32,
}

const MAGIC: &[u8; 4] = b"FPSO";
const HEAD: usize = 32;
const ENTRY: usize = 16;

fn u64_at(d: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(d.get(at..at + 8)?.try_into().ok()?))
}

fn range(d: &[u8], off: u64, len: u64) -> Result<&[u8], CapiError> {
    let end = off.checked_add(len).ok_or_else(corrupt)?;
    d.get(
        usize::try_from(off).map_err(|_| corrupt())?
            ..usize::try_from(end).map_err(|_| corrupt())?,
    )
    .ok_or_else(corrupt)
}

fn corrupt() -> CapiError {
    CapiError::Client(ferroplasma_client::ClientError::Protocol(
        "corrupt object header (a part lies past the end of the object)".into(),
    ))
}

/// The layout of `data` (one object's data bytes).
pub fn parse(data: &[u8]) -> Result<fp_layout, CapiError> {
    if data.len() < HEAD || &data[..4] != MAGIC {
        return Ok(fp_layout {
            kind: fp_kind::FP_KIND_RAW,
            version: 0,
            payload: data.as_ptr(),
            payload_size: data.len() as u64,
            buffer_count: 0,
        });
    }
    let version = data[4];
    if version != 1 {
        return Err(CapiError::Client(
            ferroplasma_client::ClientError::Protocol(format!(
                "object written with format version {version}; this library reads version 1"
            )),
        ));
    }
    let kind = match data[5] {
        0 => fp_kind::FP_KIND_PICKLE,
        1 => fp_kind::FP_KIND_ARROW_TABLE,
        2 => fp_kind::FP_KIND_ARROW_BATCH,
        3 => fp_kind::FP_KIND_ARROW_BUFFERS,
        4 => fp_kind::FP_KIND_BYTES,
        5 => fp_kind::FP_KIND_STR_LIST,
        6 => fp_kind::FP_KIND_NDARRAY,
        k => {
            return Err(CapiError::Client(
                ferroplasma_client::ClientError::Protocol(format!("unknown object kind {k}")),
            ))
        }
    };
    let n = u32::from_le_bytes(data[8..12].try_into().expect("4 bytes"));
    let payload = range(
        data,
        u64_at(data, 16).ok_or_else(corrupt)?,
        u64_at(data, 24).ok_or_else(corrupt)?,
    )?;
    let table_end = HEAD + ENTRY * n as usize;
    if table_end > data.len() {
        return Err(corrupt());
    }
    Ok(fp_layout {
        kind,
        version,
        payload: payload.as_ptr(),
        payload_size: payload.len() as u64,
        buffer_count: n,
    })
}

/// Out-of-band buffer `i` of `data` (checked).
pub fn buffer(data: &[u8], i: u32) -> Result<&[u8], CapiError> {
    let l = parse(data)?;
    if i >= l.buffer_count {
        return Err(invalid(format!(
            "buffer {i} of an object with {} buffers",
            l.buffer_count
        )));
    }
    let at = HEAD + ENTRY * i as usize;
    range(
        data,
        u64_at(data, at).ok_or_else(corrupt)?,
        u64_at(data, at + 8).ok_or_else(corrupt)?,
    )
}

/// Most dimensions of an array (numpy's limit).
pub const FP_MAX_DIMS: usize = 32;

/// A numpy array that Python stored (`FP_KIND_NDARRAY`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fp_ndarray {
    /// numpy's typestr of the dtype, NUL-terminated: byte order (`<`, `>`
    /// or `|`), kind (`f` float, `i` int, `u` unsigned, `b` bool, `M`
    /// datetime, `S` bytes, ...) and item size, e.g. "<f8".
    pub typestr: [c_char; 16],
    /// Bytes per item.
    pub itemsize: u64,
    /// Dimensions (0 for a scalar array).
    pub ndim: u32,
    /// True: Fortran order (first index fastest); false: C order.
    pub fortran_order: bool,
    /// The first `ndim` entries are the shape.
    pub shape: [u64; FP_MAX_DIMS],
    /// The data, in the store's memory.
    pub data: *const u8,
    /// Bytes of data (the product of the shape times itemsize).
    pub size: u64,
}

/// The array in `data`, a kind-6 object.
pub fn ndarray(data: &[u8]) -> Result<fp_ndarray, CapiError> {
    let l = parse(data)?;
    if l.kind != fp_kind::FP_KIND_NDARRAY {
        return Err(invalid(format!(
            "the object is not a numpy array (kind {:?})",
            l.kind
        )));
    }
    // Safety: parse() checked that the payload lies inside `data`.
    let desc = unsafe { std::slice::from_raw_parts(l.payload, l.payload_size as usize) };
    let bad = || corrupt();
    let (order, n_type) = (
        *desc.first().ok_or_else(bad)?,
        *desc.get(1).ok_or_else(bad)? as usize,
    );
    let ndim = u32::from_le_bytes(desc.get(4..8).ok_or_else(bad)?.try_into().expect("4 bytes"));
    if ndim as usize > FP_MAX_DIMS || n_type > 15 {
        return Err(bad());
    }
    let typestr = desc.get(8..8 + n_type).ok_or_else(bad)?;
    let shape_at = (8 + n_type).div_ceil(8) * 8;
    let mut out = fp_ndarray {
        typestr: [0; 16],
        itemsize: 0,
        ndim,
        fortran_order: order == b'F',
        shape: [0; FP_MAX_DIMS],
        data: std::ptr::null(),
        size: 0,
    };
    for (o, &b) in out.typestr.iter_mut().zip(typestr) {
        *o = b as c_char;
    }
    let digits: String = typestr
        .iter()
        .skip(2)
        .map(|&b| b as char)
        .take_while(char::is_ascii_digit)
        .collect();
    out.itemsize = digits.parse().map_err(|_| bad())?;
    let mut items = 1u64;
    for i in 0..ndim as usize {
        out.shape[i] = u64_at(desc, shape_at + 8 * i).ok_or_else(bad)?;
        items = items.checked_mul(out.shape[i]).ok_or_else(bad)?;
    }
    let d = buffer(data, 0)?;
    if items.checked_mul(out.itemsize) != Some(d.len() as u64) {
        return Err(bad());
    }
    out.data = d.as_ptr();
    out.size = d.len() as u64;
    Ok(out)
}

/// Reads the numpy array in `buf` (an `FP_KIND_NDARRAY` object) into
/// `*out`: dtype, shape, order, and a pointer to its data in the store.
/// FP_INVALID_ARGUMENT for an object of another kind.
///
/// # Safety
/// `buf` is a live buffer; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn fp_ndarray_info(buf: *const fp_buffer, out: *mut fp_ndarray) -> fp_status {
    guard(|| {
        let a = ndarray(data_of(buf, "fp_ndarray_info")?)?;
        if out.is_null() {
            return Err(invalid("fp_ndarray_info: out is NULL"));
        }
        // Safety: not NULL, writable (the caller's promise).
        unsafe { out.write(a) };
        Ok(())
    })
}

fn data_of<'a>(buf: *const fp_buffer, call: &str) -> Result<&'a [u8], CapiError> {
    crate::handle::value(buf, call).map(|b| b.data())
}

/// Reads the layout of the object in `buf` into `*out`. Objects without
/// Python's header are FP_KIND_RAW (the payload is the whole object).
///
/// # Safety
/// `buf` is a live buffer; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn fp_object_layout(buf: *const fp_buffer, out: *mut fp_layout) -> fp_status {
    guard(|| {
        let l = parse(data_of(buf, "fp_object_layout")?)?;
        if out.is_null() {
            return Err(invalid("fp_object_layout: out is NULL"));
        }
        // Safety: not NULL, writable (the caller's promise).
        unsafe { out.write(l) };
        Ok(())
    })
}

/// Out-of-band buffer `i` (0-based, below `buffer_count`) of the object in
/// `buf`: `*data` points into the store, `*size` is its length.
///
/// # Safety
/// `buf` is a live buffer; `data` and `size` are writable.
#[no_mangle]
pub unsafe extern "C" fn fp_layout_buffer(
    buf: *const fp_buffer,
    i: u32,
    data: *mut *const u8,
    size: *mut u64,
) -> fp_status {
    guard(|| {
        let b = buffer(data_of(buf, "fp_layout_buffer")?, i)?;
        if data.is_null() || size.is_null() {
            return Err(invalid("fp_layout_buffer: data and size must not be NULL"));
        }
        // Safety: not NULL, writable (the caller's promise).
        unsafe {
            data.write(b.as_ptr());
            size.write(b.len() as u64);
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(kind: u8, payload: &[u8], buffers: &[&[u8]]) -> Vec<u8> {
        let mut head = Vec::new();
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&[1, kind, 0, 0]);
        head.extend_from_slice(&(buffers.len() as u32).to_le_bytes());
        head.extend_from_slice(&[0; 4]);
        let mut at = (HEAD + ENTRY * buffers.len()) as u64;
        let p_at = at;
        at += payload.len() as u64;
        head.extend_from_slice(&p_at.to_le_bytes());
        head.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        let mut entries = Vec::new();
        for b in buffers {
            entries.push((at, b.len() as u64));
            at += b.len() as u64;
        }
        for (o, l) in &entries {
            head.extend_from_slice(&o.to_le_bytes());
            head.extend_from_slice(&l.to_le_bytes());
        }
        head.extend_from_slice(payload);
        for b in buffers {
            head.extend_from_slice(b);
        }
        head
    }

    #[test]
    fn parts_are_found_and_checked() {
        let o = object(0, b"pickle", &[b"abc", b"defg"]);
        let l = parse(&o).unwrap();
        assert_eq!(
            (l.kind, l.payload_size, l.buffer_count),
            (fp_kind::FP_KIND_PICKLE, 6, 2)
        );
        assert_eq!(buffer(&o, 1).unwrap(), b"defg");
        assert!(buffer(&o, 2).is_err());
        assert_eq!(parse(b"plain bytes").unwrap().kind, fp_kind::FP_KIND_RAW);
        let mut cut = o.clone();
        cut.truncate(o.len() - 2);
        assert!(buffer(&cut, 1).is_err(), "a buffer past the end is refused");
        let mut bad = o;
        bad[5] = 77;
        assert!(parse(&bad).is_err());
    }
}
