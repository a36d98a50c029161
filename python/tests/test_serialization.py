"""put/get round trips, bit-exact, and zero-copy where promised."""

from __future__ import annotations

import datetime
import decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import ferroplasma as fp
from ferroplasma import serialization


class Point:
    """A user class (pickled by reference to this module)."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)


def round_trip(client, obj):
    return client.get(client.put(obj))


def inside(client, oid, arr_address):
    [b] = client.get_buffers([oid])
    return b.address <= arr_address < b.address + len(b)


NUMPY_CASES = [
    np.array(True),
    np.arange(0, dtype=np.int64),
    np.arange(100, dtype=np.int8),
    np.arange(1000, dtype=np.uint16).reshape(10, 100),
    np.random.default_rng(1).standard_normal((7, 11, 13)).astype(np.float32),
    np.random.default_rng(2).standard_normal(1000),
    np.arange(10, dtype=np.float16),
    (np.arange(12) + 1j * np.arange(12)).astype(np.complex128),
    np.array(["a", "bcd", "ef"], dtype="U3"),
    np.array([b"xy", b"z"], dtype="S2"),
    np.arange("2024-01-01", "2024-02-01", dtype="datetime64[D]"),
    np.arange(5).astype("timedelta64[ms]"),
    np.zeros(4, dtype=[("a", "<i4"), ("b", "<f8", (2,))]),
    np.asfortranarray(np.arange(24.0).reshape(4, 6)),
    np.arange(100.0)[::3],  # not contiguous: pickled in-band
    np.array([{"x": 1}, None], dtype=object),
]


@pytest.mark.parametrize("arr", NUMPY_CASES, ids=lambda a: f"{a.dtype}-{a.shape}")
def test_numpy_arrays_round_trip_bit_exact(client, arr):
    got = round_trip(client, arr)
    assert got.dtype == arr.dtype and got.shape == arr.shape
    assert got.flags.f_contiguous == arr.flags.f_contiguous or arr.ndim < 2
    if arr.dtype != object:
        assert got.tobytes(order="A") == arr.tobytes(order="A")
    else:
        assert list(got) == list(arr)


def test_large_arrays_are_views_of_the_store(client):
    arr = np.arange(1_000_000, dtype=np.float64)
    oid = client.put(arr)
    got = client.get(oid)
    assert not got.flags.owndata and not got.flags.writeable
    assert inside(client, oid, got.__array_interface__["data"][0])
    assert got.__array_interface__["data"][0] % 64 == 0, "buffers are 64-byte aligned"
    nested = client.put({"a": [arr, (arr[:10].copy(), "s")]})
    inner = client.get(nested)["a"][0]
    assert inside(client, nested, inner.__array_interface__["data"][0])


def test_pandas_frames_and_series(client):
    df = pd.DataFrame(
        {
            "i": np.arange(1000),
            "f": np.linspace(0, 1, 1000),
            "s": [f"row{i}" for i in range(1000)],
            "t": pd.date_range("2024-01-01", periods=1000, freq="min"),
            "c": pd.Categorical(["a", "b"] * 500),
            "b": np.arange(1000) % 2 == 0,
        }
    )
    got = round_trip(client, df)
    pd.testing.assert_frame_equal(got, df)
    oid = client.put(df[["i", "f"]])
    fi = client.get(oid)["f"].to_numpy()
    assert inside(client, oid, fi.__array_interface__["data"][0]), "numeric blocks are views"
    s = pd.Series(np.arange(50, dtype=np.int32), name="x", index=[f"k{i}" for i in range(50)])
    pd.testing.assert_series_equal(round_trip(client, s), s)


def test_arrow_tables_and_batches_via_ipc(client):
    t = pa.table(
        {
            "n": pa.array(range(10000), pa.int64()),
            "s": pa.array([f"v{i}" for i in range(10000)]),
            "l": pa.array([[i, i + 1] for i in range(10000)]),
            "d": pa.array([decimal.Decimal("1.5")] * 10000),
        }
    )
    oid = client.put(t)
    got = client.get(oid)
    assert got.equals(t)
    col = got.column("n").chunk(0)
    assert inside(client, oid, col.buffers()[1].address), "columns are views of the store"
    # Any Arrow reader can read the object: header, then a plain IPC stream.
    [raw] = client.get_buffers([oid])
    head = serialization._HEAD.unpack_from(memoryview(raw), 0)
    payload = memoryview(raw)[head[6] : head[6] + head[7]]
    assert pa.ipc.open_stream(pa.py_buffer(payload)).read_all().equals(t)
    batch = t.to_batches()[0]
    got_b = round_trip(client, batch)
    assert isinstance(got_b, pa.RecordBatch) and got_b.equals(batch)


def test_bytes_bytearray_memoryview(client):
    for obj in [b"", b"\x00\xff" * 1000, bytearray(b"mutable"), bytearray(10**6)]:
        got = round_trip(client, obj)
        assert type(got) is type(obj) and got == obj
    mv = memoryview(np.arange(12, dtype=np.int32).reshape(3, 4))
    got = round_trip(client, mv)
    assert isinstance(got, memoryview) and got.tolist() == mv.tolist() and got.format == "i"
    strided = memoryview(b"abcdefgh")[::2]
    assert bytes(round_trip(client, strided)) == b"aceg"


def test_plain_and_nested_python_objects(client):
    obj = {
        "ints": list(range(100)),
        "set": {1, 2, 3},
        "frozen": frozenset("ab"),
        "tuple": (1, "two", 3.0, None, True),
        "when": datetime.datetime(2024, 5, 6, 7, 8, 9),
        "point": Point(1, 2),
        "big": 2**100,
        "nested": [{"a": np.arange(3)}, pa.table({"x": [1, 2]})],
        "unicode": "ünïcødé ✓",
    }
    got = round_trip(client, obj)
    assert got["nested"][1].equals(obj["nested"][1])
    assert list(got["nested"][0]["a"]) == [0, 1, 2]
    for k in obj:
        if k != "nested":
            assert got[k] == obj[k]


def test_raw_objects_come_back_as_memoryviews(client):
    oid = fp.ObjectID.random()
    client.create_and_seal(oid, b"not serialized", b"")
    got = client.get(oid)
    assert isinstance(got, memoryview) and got.readonly and bytes(got) == b"not serialized"


def test_format_errors_are_clear():
    bad = bytearray(serialization.write([1, 2, 3]))
    bad[4] = 99
    with pytest.raises(fp.SerializationError, match="version"):
        serialization.read(bad)
    cut = serialization.write(np.arange(100))[:40]
    with pytest.raises(fp.SerializationError, match="corrupt"):
        serialization.read(cut)


def test_large_bytes_are_copied_once_on_put(client):
    """A top-level bytes object goes straight into the store: no pickle
    stream holding a second copy of it (Python allocates ~nothing)."""
    import tracemalloc

    data = np.random.default_rng(3).integers(0, 256, 32 * 2**20, dtype=np.uint8).tobytes()
    tracemalloc.start()
    try:
        oid = client.put(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20, f"put of 32 MiB of bytes allocated {peak} bytes on the way"
    got = client.get(oid)
    assert type(got) is bytes and got == data


def test_bytes_can_come_back_as_a_view_of_the_store(client):
    data = bytes(range(256)) * 4096
    oid = client.put(data)
    view = client.get(oid, bytes_as_view=True)
    assert isinstance(view, memoryview) and view.readonly and view == data
    [b] = client.get_buffers([oid])
    at = np.frombuffer(view, dtype=np.uint8).ctypes.data
    assert b.address <= at < b.address + len(b), "the view is a copy"
    # Everything else is unchanged by the flag; the default stays bytes.
    assert type(client.get(oid)) is bytes
    other = client.put({"b": b"x"})
    assert client.get(other, bytes_as_view=True) == {"b": b"x"}
    assert client.get([oid], bytes_as_view=True)[0] == data


STRING_LISTS = [
    ["a", "", "bc" * 100, "ünïcødé ✓", "\U0001f600", "x\x00y"],
    [f"string {i}" for i in range(10_000)],
    [""] * 3,
]


@pytest.mark.parametrize("obj", STRING_LISTS, ids=["mixed", "many", "empty-strings"])
def test_lists_of_strings_have_a_native_layout(client, obj):
    """A list of plain str is stored as offsets and UTF-8 (no pickle), and
    comes back equal, as a list of str."""
    blob = serialization.write(obj)
    assert blob[5] == serialization.KIND_STR_LIST
    got = round_trip(client, obj)
    assert type(got) is list and got == obj and all(type(s) is str for s in got)


class Name(str):
    pass


@pytest.mark.parametrize(
    "obj",
    [[], ["a", 1], ["a", Name("b")], ["lone \udc80 surrogate"], ("a", "b")],
    ids=["empty", "int", "subclass", "surrogate", "tuple"],
)
def test_other_sequences_of_strings_are_pickled(client, obj):
    blob = serialization.write(obj)
    assert blob[5] == serialization.KIND_PICKLE
    got = round_trip(client, obj)
    assert got == obj and type(got) is type(obj)
    assert [type(x) for x in got] == [type(x) for x in obj]


def test_a_list_changed_while_it_is_stored_is_refused_not_overrun():
    obj = ["abc"] * 10
    p = serialization.plan(obj)
    obj.append("d" * 10_000)
    with pytest.raises(fp.SerializationError, match="changed"):
        p.fill(memoryview(bytearray(p.size)))


@pytest.mark.parametrize("n", [0, 1, 4095, 8 * 2**20 + 3, 40 * 2**20 + 17])
def test_the_parallel_copy_copies_every_byte(n):
    from ferroplasma import _native

    src = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    dst = bytearray(n)
    _native.copy_into(dst, src)
    assert dst == src.tobytes()
    with pytest.raises(ValueError, match="size"):
        _native.copy_into(bytearray(n + 1), src)
    with pytest.raises((TypeError, BufferError)):
        _native.copy_into(b"\x00" * n, src)


def test_a_corrupt_list_of_strings_is_a_clear_error():
    good = bytearray(serialization.write(["ab", "cd"]))
    bad_text = bytearray(good)
    bad_text[-1] = 0xFF
    with pytest.raises(fp.SerializationError, match="UTF-8"):
        serialization.read(bad_text)
    bad_offset = bytearray(good)
    bad_offset[64 + 24 : 64 + 32] = (10**6).to_bytes(8, "little")
    with pytest.raises(fp.SerializationError, match="past the end"):
        serialization.read(bad_offset)
    huge_count = bytearray(good)
    huge_count[64:72] = (2**62).to_bytes(8, "little")
    with pytest.raises(fp.SerializationError, match="count"):
        serialization.read(huge_count)


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(12, dtype="<f8").reshape(3, 4),
        np.asfortranarray(np.arange(24, dtype=np.int16).reshape(4, 6)),
        np.arange(5, dtype=">u4"),
        np.array(3.5),
        np.arange("2024-01-01", "2024-01-05", dtype="datetime64[D]"),
        np.zeros((0, 3), dtype=np.uint8),
    ],
    ids=lambda a: f"{a.dtype.str}-{a.shape}",
)
def test_top_level_arrays_have_a_layout_other_languages_read(client, arr):
    """A top-level numpy array of a plain dtype is stored as its dtype,
    shape and order plus its data (kind 6), which C reads without pickle."""
    import struct as st

    blob = serialization.write(arr)
    assert blob[5] == serialization.KIND_NDARRAY
    (p_off,) = st.unpack_from("<Q", blob, 16)
    order, n_type, _, ndim = st.unpack_from("<BBHI", blob, p_off)
    typestr = bytes(blob[p_off + 8 : p_off + 8 + n_type]).decode()
    assert np.dtype(typestr) == arr.dtype and chr(order) in "CF" and ndim == arr.ndim
    got = round_trip(client, arr)
    assert got.dtype == arr.dtype and got.shape == arr.shape
    assert np.array_equal(got, arr) and not got.flags.writeable


def test_arrays_without_a_plain_dtype_stay_pickled():
    for arr in [
        np.zeros(2, dtype=[("a", "<i4")]),
        np.array([{"x": 1}], dtype=object),
        np.arange(10.0)[::2],
    ]:
        assert serialization.write(arr)[5] == serialization.KIND_PICKLE
