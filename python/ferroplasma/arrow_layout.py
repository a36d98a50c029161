"""A record batch as a flat list of its Arrow buffers plus a small
descriptor, and back — without copying a byte of column data.

This is what travels in a scan (``ferroplasma.scan``) and what a scan writes
into the store: every buffer of every column (validity bitmaps, offsets,
data, the children of nested types and the dictionaries of dictionary
columns), each exactly as Arrow holds it, and a descriptor that says how to
put them back together.

The descriptor is a flat list of integers with one entry per array node, in
depth-first order (column 0, its children, its dictionary; column 1; ...)::

    length, null_count, offset, n_buffers, n_children, has_dictionary,
    size of buffer 0, ..., size of buffer n_buffers-1   (-1: buffer absent)

followed by the node's children and then its dictionary. The buffers that
are present travel in the same order. The schema gives each node its type;
the descriptor gives the rest, so the receiver can place every buffer where
it wants (64-byte aligned, in the store) before a byte arrives.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["ALIGN", "flatten", "pack_meta", "place", "rebuild", "sizes", "unpack_meta"]

ALIGN = 64
_NODE_HEAD = 6
_META = struct.Struct("<II")


def _children(arr: Any) -> list[Any]:
    """The child arrays of ``arr`` as Arrow stores them."""
    import pyarrow as pa

    t = arr.type
    if pa.types.is_struct(t) or pa.types.is_union(t):
        return [arr.field(i) for i in range(t.num_fields)]
    if t.num_fields == 1:  # list, large list, list view, fixed-size list, map
        return [arr.values]
    return []


def _normalized(arr: Any) -> Any:
    """A sliced struct or sparse union exposes sliced children, which cannot
    be described with the parent's offset: such arrays (rare; DuckDB never
    makes them) are copied into a fresh layout first."""
    import pyarrow as pa

    t = arr.type
    if arr.offset != 0 and (pa.types.is_struct(t) or t.id == pa.sparse_union([]).id):
        return pa.concat_arrays([arr.slice(0, 0), arr])
    return arr


def _walk(arr: Any, desc: list[int], bufs: list[Any]) -> None:
    import pyarrow as pa

    if isinstance(arr.type, pa.BaseExtensionType):
        _walk(arr.storage, desc, bufs)
        return
    arr = _normalized(arr)
    is_dict = pa.types.is_dictionary(arr.type)
    children = [] if is_dict else _children(arr)
    everything = arr.buffers()
    below = sum(len(c.buffers()) for c in children)
    own = everything[: len(everything) - below]
    desc += [len(arr), arr.null_count, arr.offset, len(own), len(children), int(is_dict)]
    for b in own:
        desc.append(-1 if b is None else b.size)
        if b is not None:
            bufs.append(b)
    for c in children:
        _walk(c, desc, bufs)
    if is_dict:
        _walk(arr.dictionary, desc, bufs)


def flatten(batch: Any) -> tuple[list[int], list[Any]]:
    """The descriptor and the buffers (``pyarrow.Buffer``, not copied) of a
    ``RecordBatch``."""
    desc: list[int] = []
    bufs: list[Any] = []
    for col in batch.columns:
        _walk(col, desc, bufs)
    return desc, bufs


def sizes(desc: Sequence[int]) -> list[int]:
    """The sizes of the buffers that travel, in order. Raises
    SerializationError for a descriptor that is not well formed."""
    from .errors import SerializationError

    if not all(type(v) is int for v in desc):
        raise SerializationError("an Arrow layout descriptor holds only integers")
    out = []
    i = 0
    n = len(desc)
    while i < n:
        nbuf = desc[i + 3] if i + _NODE_HEAD <= n else -1
        if nbuf < 0 or i + _NODE_HEAD + nbuf > n or min(desc[i : i + 3]) < -1:
            raise SerializationError(f"malformed Arrow layout descriptor at entry {i}")
        for s in desc[i + _NODE_HEAD : i + _NODE_HEAD + nbuf]:
            if s >= 0:
                out.append(s)
        i += _NODE_HEAD + nbuf
    return out


def place(buffer_sizes: Sequence[int], start: int = 0) -> tuple[list[int], int]:
    """Offsets that put every buffer on a 64-byte boundary from ``start``
    (itself aligned), and the end of the last one."""
    offsets = []
    at = start
    for s in buffer_sizes:
        at = (at + ALIGN - 1) & ~(ALIGN - 1)
        offsets.append(at)
        at += s
    return offsets, at


class _Cursor:
    def __init__(self, desc: Sequence[int], bufs: Sequence[Any]) -> None:
        self.desc = desc
        self.bufs: Iterator[Any] = iter(bufs)
        self.i = 0

    def node(self, typ: Any) -> Any:
        import pyarrow as pa

        from .errors import SerializationError

        if isinstance(typ, pa.BaseExtensionType):
            return pa.ExtensionArray.from_storage(typ, self.node(typ.storage_type))
        d = self.desc
        if self.i + _NODE_HEAD > len(d):
            raise SerializationError("Arrow layout descriptor is shorter than the schema")
        length, nulls, offset, nbuf, nchild, has_dict = d[self.i : self.i + _NODE_HEAD]
        sizes_ = d[self.i + _NODE_HEAD : self.i + _NODE_HEAD + nbuf]
        self.i += _NODE_HEAD + nbuf
        try:
            own = [None if s < 0 else next(self.bufs) for s in sizes_]
        except StopIteration:
            raise SerializationError("fewer Arrow buffers than the descriptor lists") from None
        if bool(has_dict) != pa.types.is_dictionary(typ):
            raise SerializationError(f"descriptor and schema disagree about {typ}")
        if has_dict:
            dictionary = self.node(typ.value_type)
            try:
                return pa.DictionaryArray.from_buffers(typ, length, own, dictionary, nulls, offset)
            except (ValueError, TypeError, pa.ArrowException) as e:
                raise SerializationError(f"bad dictionary array {typ}: {e}") from None
        child_types = [typ.field(k).type for k in range(typ.num_fields)]
        if len(child_types) != nchild:
            raise SerializationError(f"{typ} has {len(child_types)} children, not {nchild}")
        children = [self.node(ct) for ct in child_types]
        try:
            return pa.Array.from_buffers(typ, length, own, nulls, offset, children or None)
        except (ValueError, TypeError, pa.ArrowException) as e:
            raise SerializationError(f"buffers do not make a valid {typ} array: {e}") from None


def rebuild(schema: Any, num_rows: int, desc: Sequence[int], bufs: Sequence[Any]) -> Any:
    """A ``RecordBatch`` around ``bufs`` (any buffer-like objects; not
    copied), as described by ``desc``."""
    import pyarrow as pa

    from .errors import SerializationError

    bufs = [b if isinstance(b, pa.Buffer) else pa.py_buffer(b) for b in bufs]
    cur = _Cursor(desc, bufs)
    cols = [cur.node(f.type) for f in schema]
    if cur.i != len(desc):
        raise SerializationError("Arrow layout descriptor is longer than the schema")
    if any(len(c) != num_rows for c in cols):
        raise SerializationError("a column's length differs from the batch's row count")
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def pack_meta(schema_bytes: bytes, num_rows: int, desc: Sequence[int]) -> bytes:
    """Schema, row count and descriptor as one byte string (for the store)."""
    return (
        _META.pack(len(schema_bytes), len(desc))
        + schema_bytes
        + struct.pack(f"<q{len(desc)}q", num_rows, *desc)
    )


def unpack_meta(meta: Any) -> tuple[Any, int, list[int]]:
    """The inverse of :func:`pack_meta`: (schema, num_rows, descriptor)."""
    import pyarrow as pa

    from .errors import SerializationError

    mv = memoryview(meta)
    if mv.nbytes < _META.size:
        raise SerializationError("Arrow layout metadata is truncated")
    slen, n = _META.unpack_from(mv, 0)
    end = _META.size + slen + 8 * (n + 1)
    if end > mv.nbytes:
        raise SerializationError("Arrow layout metadata is truncated")
    schema = pa.ipc.read_schema(pa.py_buffer(mv[_META.size : _META.size + slen]))
    vals = struct.unpack_from(f"<q{n}q", mv, _META.size + slen)
    return schema, vals[0], list(vals[1:])
