"""How Python objects are laid out in the store (format version 1).

``put`` writes an object straight into its allocation; ``get`` rebuilds it
with its large buffers as views of shared memory (no copy, no parse of the
data). The layout (all integers little-endian, every region 64-byte aligned)::

    offset  size  field
    0       4     magic b"FPSO"
    4       1     format version (1)
    5       1     kind: 0 = pickle protocol 5, 1 = Arrow IPC stream of a
                  Table, 2 = Arrow IPC stream of a RecordBatch, 3 = the
                  buffers of a RecordBatch (see below), 4 = a ``bytes``
                  object (the payload is its bytes), 5 = a list of ``str``
                  (see below), 6 = a numpy array (see below)
    6       2     reserved (0)
    8       4     n = number of out-of-band buffers
    12      4     reserved (0)
    16      8     offset of the payload (pickle stream or IPC stream)
    24      8     length of the payload
    32      16*n  (offset, length) of each out-of-band buffer, in order
    ...           padding to 64, payload, padding, buffers (each at a
                  multiple of 64 from the start of the object)

A pickle payload is loaded with ``pickle.loads(payload, buffers=[...])``
where each buffer is a read-only ``memoryview`` of shared memory: numpy
arrays, pandas blocks and Arrow buffers become views of the store. A
top-level ``pyarrow.Table`` or ``RecordBatch`` is stored as a plain Arrow IPC
stream, so any Arrow implementation can read it from the store. Kind 3 is
what a scan (``ferroplasma.scan``) lands in the store: the payload is the
schema, row count and buffer descriptor of :mod:`ferroplasma.arrow_layout`,
and the out-of-band buffers are the batch's Arrow buffers, each 64-byte
aligned, so the receiver can write them straight from the network. Kind 4
is a top-level ``bytes``: put copies it once, straight into the store, and
``get(..., bytes_as_view=True)`` returns a read-only ``memoryview`` of it
instead of a copy. Kind 5 is a non-empty list of exact ``str``, laid out as
little-endian u64 ``n``, ``n + 1`` offsets into the text (the first is 0),
then the UTF-8 text; Rust writes and reads it (``_native.str_list_*``),
about 4x faster than pickle writes it. Kind 6 is a top-level numpy array
of a plain dtype, C or Fortran contiguous: the payload is u8 order (``C`` or
``F``), u8 length of the dtype's typestr, u16 0, u32 ndim, the typestr
(e.g. ``<f8``) padded to 8 bytes, then ndim u64 dimensions; its one
out-of-band buffer is the data, so C, C++ and Go read it without pickle
(``fp_ndarray_info``). An object
without the magic (made with ``create``/``seal``) comes back as a read-only
``memoryview`` of its bytes.
"""

from __future__ import annotations

import collections
import copyreg
import io
import pickle
import struct
import sys
from typing import Any, Callable, ClassVar

from . import _native, arrow_layout
from .errors import SerializationError

__all__ = ["MAGIC", "VERSION", "copy", "plan", "read", "write"]

MAGIC = b"FPSO"
VERSION = 1
KIND_PICKLE = 0
KIND_ARROW_TABLE = 1
KIND_ARROW_BATCH = 2
KIND_ARROW_BUFFERS = 3
KIND_BYTES = 4
KIND_STR_LIST = 5
KIND_NDARRAY = 6
_NDARRAY = struct.Struct("<BBHI")  # order ('C' or 'F'), len(typestr), 0, ndim

_HEAD = struct.Struct("<4sBBHIIQQ")
_ENTRY = struct.Struct("<QQ")
ALIGN = 64


# Buffers at least this large are copied by Rust, with the GIL released and
# with several threads above 8 MiB; smaller ones by a memoryview assignment.
_NATIVE_COPY_FROM = 64 * 1024


def _align(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


def copy(target: memoryview, src: Any) -> None:
    """Copies ``src`` (a contiguous buffer of ``target``'s size) into
    ``target``, in parallel when it is large."""
    if target.nbytes >= _NATIVE_COPY_FROM:
        _native.copy_into(target, src)
    else:
        target[:] = memoryview(src).cast("B")


def _memoryview_from(buf: Any, fmt: str, shape: tuple[int, ...]) -> memoryview:
    return memoryview(buf).cast("B").cast(fmt, shape) if shape else memoryview(buf)


def _reduce_memoryview(mv: memoryview):
    if mv.c_contiguous:
        return _memoryview_from, (pickle.PickleBuffer(mv), mv.format, mv.shape)
    return memoryview, (mv.tobytes(),)


def _ndarray_from(buf: Any, dtype: Any, shape: tuple, order: str) -> Any:
    arr = sys.modules["numpy"].frombuffer(buf, dtype)
    if len(shape) != 1:
        arr = arr.reshape(shape, order=order)
    return arr


def _reduce_ndarray(arr: Any):
    """numpy arrays as one out-of-band buffer, rebuilt by ``frombuffer``
    (numpy's own path costs ~3x more per array)."""
    if arr.dtype.hasobject or not (arr.flags.c_contiguous or arr.flags.f_contiguous):
        return arr.__reduce_ex__(5)
    order = "C" if arr.flags.c_contiguous else "F"
    try:
        if arr.dtype.kind in "Mm":  # datetimes export no buffer: same bytes as ints
            raw = pickle.PickleBuffer(arr.view(f"i{arr.dtype.itemsize}"))
        else:
            raw = pickle.PickleBuffer(arr)
    except (ValueError, TypeError):
        return arr.__reduce_ex__(5)
    if arr.ndim == 1:
        # Rebuilt by numpy.frombuffer itself: no Python-level call at all.
        return sys.modules["numpy"].frombuffer, (raw, arr.dtype)
    return _ndarray_from, (raw, arr.dtype, arr.shape, order)


_OURS: dict = {memoryview: _reduce_memoryview}


class _Pickler(pickle.Pickler):
    """pickle protocol 5, plus memoryviews (as zero-copy buffers) and a
    faster rebuild of numpy arrays."""

    # Our reducers first, then everything registered with copyreg.
    dispatch_table: ClassVar[collections.ChainMap] = collections.ChainMap(
        _OURS, copyreg.dispatch_table
    )


def _register_numpy() -> None:
    np = sys.modules.get("numpy")
    if np is not None and np.ndarray not in _OURS:
        _OURS[np.ndarray] = _reduce_ndarray


class Plan:
    """What ``put`` will write: the size to allocate and how to fill it."""

    __slots__ = ("_fill", "size")

    def __init__(self, size: int, fill: Callable[[memoryview], None]) -> None:
        self.size = size
        self._fill = fill

    def fill(self, target: memoryview) -> None:
        """Writes the object into ``target`` (exactly ``size`` bytes)."""
        self._fill(target)


def _header(kind: int, payload: tuple[int, int], buffers: list[tuple[int, int]]) -> bytes:
    head = _HEAD.pack(MAGIC, VERSION, kind, 0, len(buffers), 0, payload[0], payload[1])
    return head + b"".join(_ENTRY.pack(o, n) for o, n in buffers)


def _arrow_plan(obj: Any, kind: int) -> Plan:
    import pyarrow as pa

    sink = pa.MockOutputStream()
    with pa.ipc.new_stream(sink, obj.schema) as w:
        w.write(obj)
    size = sink.size()
    start = _align(_HEAD.size)
    head = _header(kind, (start, size), [])

    def fill(target: memoryview) -> None:
        target[: len(head)] = head
        out = pa.FixedSizeBufferWriter(pa.py_buffer(target[start : start + size]))
        with pa.ipc.new_stream(out, obj.schema) as w:
            w.write(obj)

    return Plan(start + size, fill)


def _bytes_plan(obj: bytes) -> Plan:
    start = _align(_HEAD.size)
    head = _header(KIND_BYTES, (start, len(obj)), [])

    def fill(target: memoryview) -> None:
        target[: len(head)] = head
        copy(target[start : start + len(obj)], obj)

    return Plan(start + len(obj), fill)


def _ndarray_plan(arr: Any) -> Plan | None:
    """Kind 6 for a contiguous array whose dtype its typestr spells fully
    (numbers, bools, datetimes, fixed strings); None for the rest."""
    if arr.dtype.hasobject or _dtype_lost(arr.dtype):
        return None
    order = b"C" if arr.flags.c_contiguous else b"F" if arr.flags.f_contiguous else None
    if order is None:
        return None
    typestr = arr.dtype.str.encode()
    desc = _NDARRAY.pack(order[0], len(typestr), 0, arr.ndim) + typestr
    desc += b"\0" * (-len(desc) % 8) + struct.pack(f"<{arr.ndim}Q", *arr.shape)
    data = arr.reshape(-1, order="A").view("u1") if arr.size else b""
    start = _align(_HEAD.size + _ENTRY.size)
    data_at = _align(start + len(desc))
    head = _header(KIND_NDARRAY, (start, len(desc)), [(data_at, arr.nbytes)])

    def fill(target: memoryview) -> None:
        target[: len(head)] = head
        target[start : start + len(desc)] = desc
        if arr.nbytes:
            copy(target[data_at : data_at + arr.nbytes], data)

    return Plan(data_at + arr.nbytes, fill)


def _dtype_lost(dtype: Any) -> bool:
    """True when the typestr would not give this dtype back (structured,
    subarray or otherwise described by more than its typestr)."""
    try:
        return sys.modules["numpy"].dtype(dtype.str) != dtype or dtype.names is not None
    except TypeError:
        return True


def _read_ndarray(desc: memoryview, buf: memoryview) -> Any:
    np = sys.modules.get("numpy") or __import__("numpy")
    order, n_type, _, ndim = _NDARRAY.unpack_from(desc, 0)
    typestr = bytes(desc[8 : 8 + n_type]).decode()
    at = _NDARRAY.size + n_type + (-(_NDARRAY.size + n_type) % 8)
    shape = struct.unpack_from(f"<{ndim}Q", desc, at)
    arr = np.frombuffer(buf, dtype=np.dtype(typestr))
    return arr.reshape(shape, order=chr(order))


def _str_list_plan(obj: list, size: int) -> Plan:
    start = _align(_HEAD.size)
    head = _header(KIND_STR_LIST, (start, size), [])

    def fill(target: memoryview) -> None:
        target[: len(head)] = head
        try:
            _native.str_list_write(obj, target[start : start + size])
        except SerializationError:
            raise
        except (TypeError, ValueError) as e:
            raise SerializationError(f"cannot store the list: {e}") from e

    return Plan(start + size, fill)


def batch_layout(meta: bytes, buffer_sizes: list[int]) -> tuple[bytes, int, list[int], int]:
    """Where the parts of a kind-3 object go: (header, offset of ``meta``,
    offset of each buffer, total size). ``meta`` is
    :func:`arrow_layout.pack_meta`'s output; write the header at 0, ``meta``
    at its offset and each buffer at its own."""
    payload_at = _align(_HEAD.size + _ENTRY.size * len(buffer_sizes))
    offsets, end = arrow_layout.place(buffer_sizes, _align(payload_at + len(meta)))
    head = _header(KIND_ARROW_BUFFERS, (payload_at, len(meta)), list(zip(offsets, buffer_sizes)))
    return head, payload_at, offsets, max(end, payload_at + len(meta))


def put_batch_object(
    client: Any,
    schema_bytes: bytes,
    num_rows: int,
    desc: list[int],
    fill: Callable[[list[memoryview]], None],
    seal: bool = True,
    oid: Any = None,
) -> tuple[Any, int]:
    """Creates a kind-3 object in ``client``'s store for a batch laid out as
    ``desc``, lets ``fill`` write the buffers into their places (one writable
    view each, in order: copied from memory, or received from a socket),
    then seals it. Returns (ObjectID, size). The object is aborted if
    ``fill`` fails, so nothing half written stays in the store.

    ``seal=False`` leaves it written but unsealed (the caller seals or
    aborts it later): should this client die first, the store discards it.
    ``oid``: the id to give it (default: a new random one)."""
    import contextlib

    from ._ids import ObjectID

    meta = arrow_layout.pack_meta(schema_bytes, num_rows, desc)
    sizes = arrow_layout.sizes(desc)
    head, meta_at, offsets, total = batch_layout(meta, sizes)
    if oid is None:
        oid = ObjectID.random()
    buf = client.create(oid, total, wait=30.0)
    try:
        mv = memoryview(buf).cast("B")
        mv[: len(head)] = head
        mv[meta_at : meta_at + len(meta)] = meta
        fill([mv[o : o + n] for o, n in zip(offsets, sizes)])
        mv.release()
        if seal:
            client.seal(oid)
    except BaseException:
        with contextlib.suppress(Exception):  # the first error is the one to report
            client.abort(oid)
        raise
    if seal:
        client.release(oid)
    return oid, total


def seal_batch_object(client: Any, oid: Any) -> None:
    """Seals an object of :func:`put_batch_object` made with ``seal=False``
    and lets go of the creator's reference."""
    client.seal(oid)
    client.release(oid)


def plan(obj: Any) -> Plan:
    """Serializes ``obj`` as far as possible without copying its large
    buffers, and says how much room it needs in the store."""
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        if isinstance(obj, pa.Table):
            return _arrow_plan(obj, KIND_ARROW_TABLE)
        if isinstance(obj, pa.RecordBatch):
            return _arrow_plan(obj, KIND_ARROW_BATCH)
    if type(obj) is bytes:
        return _bytes_plan(obj)
    np = sys.modules.get("numpy")
    if np is not None and type(obj) is np.ndarray:
        p = _ndarray_plan(obj)
        if p is not None:
            return p
    if type(obj) is list:
        size = _native.str_list_size(obj)
        if size is not None:
            return _str_list_plan(obj, size)
    _register_numpy()
    oob: list[pickle.PickleBuffer] = []
    stream = io.BytesIO()
    try:
        _Pickler(stream, protocol=5, buffer_callback=oob.append).dump(obj)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise SerializationError(f"cannot serialize {type(obj).__name__}: {e}") from e
    payload = stream.getbuffer()
    raws = [b.raw() for b in oob]
    cursor = _align(_HEAD.size + _ENTRY.size * len(raws))
    payload_at = cursor
    cursor = _align(cursor + len(payload))
    entries = []
    for r in raws:
        entries.append((cursor, r.nbytes))
        cursor = _align(cursor + r.nbytes)
    head = _header(KIND_PICKLE, (payload_at, len(payload)), entries)
    size = max(cursor, payload_at + len(payload))

    def fill(target: memoryview) -> None:
        target[: len(head)] = head
        target[payload_at : payload_at + len(payload)] = payload
        for (off, n), r in zip(entries, raws):
            copy(target[off : off + n], r)

    return Plan(size, fill)


def write(obj: Any) -> bytes:
    """The serialized bytes of ``obj`` (for tests and for transports)."""
    p = plan(obj)
    out = bytearray(p.size)
    p.fill(memoryview(out))
    return bytes(out)


def read(data: Any, bytes_as_view: bool = False) -> Any:
    """Rebuilds an object from its serialized bytes (any buffer); large
    buffers stay views of ``data``. ``bytes_as_view``: a stored ``bytes``
    object comes back as a read-only ``memoryview`` of ``data`` (no copy)."""
    mv = memoryview(data)
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    if mv.nbytes < _HEAD.size or mv[:4] != MAGIC:
        return mv
    _magic, version, kind, _, n, _, p_off, p_len = _HEAD.unpack_from(mv, 0)
    if version != VERSION:
        raise SerializationError(
            f"object written with format version {version}; this ferroplasma reads "
            f"version {VERSION}: upgrade ferroplasma"
        )
    end = _HEAD.size + _ENTRY.size * n
    if end > mv.nbytes or p_off + p_len > mv.nbytes:
        raise SerializationError("corrupt object header (offsets past the end)")
    payload = mv[p_off : p_off + p_len]
    if kind == KIND_BYTES:
        return payload if bytes_as_view else bytes(payload)
    if kind == KIND_STR_LIST:
        return _native.str_list_read(payload)
    if kind == KIND_NDARRAY:
        if n != 1:
            raise SerializationError("corrupt array header (no data buffer)")
        d_off, d_len = _ENTRY.unpack_from(mv, _HEAD.size)
        if d_off + d_len > mv.nbytes:
            raise SerializationError("corrupt object header (buffer past the end)")
        try:
            return _read_ndarray(payload, mv[d_off : d_off + d_len])
        except (ValueError, TypeError, struct.error) as e:
            raise SerializationError(f"corrupt array header: {e}") from e
    if kind in (KIND_PICKLE, KIND_ARROW_BUFFERS):
        table = mv[_HEAD.size : end].cast("Q").tolist() if n else []
        offs, lens = table[0::2], table[1::2]
        if n and max(o + ln for o, ln in zip(offs, lens)) > mv.nbytes:
            raise SerializationError("corrupt object header (buffer past the end)")
        bufs = [mv[o : o + ln] for o, ln in zip(offs, lens)]
        if kind == KIND_ARROW_BUFFERS:
            schema, rows, desc = arrow_layout.unpack_meta(payload)
            return arrow_layout.rebuild(schema, rows, desc, bufs)
        return pickle.loads(payload, buffers=bufs)
    if kind in (KIND_ARROW_TABLE, KIND_ARROW_BATCH):
        import pyarrow as pa

        reader = pa.ipc.open_stream(pa.py_buffer(payload))
        if kind == KIND_ARROW_TABLE:
            return reader.read_all()
        return reader.read_next_batch()
    raise SerializationError(f"unknown object kind {kind}")
