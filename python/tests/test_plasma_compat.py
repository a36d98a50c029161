"""ferroplasma.plasma against pyarrow 11's documented pyarrow.plasma behaviour."""

from __future__ import annotations

import os
import pickle
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pytest

import ferroplasma as fp
import ferroplasma.plasma as plasma
from conftest import eventually

MEMORY = 100_000_000  # the -m value; divisible by nothing in particular


@pytest.fixture(scope="module")
def store():
    with plasma.start_plasma_store(MEMORY) as (name, proc):
        yield name, proc


@pytest.fixture
def client(store):
    c = plasma.connect(store[0])
    yield c
    # Leave the store empty for the next test.
    c.delete(list(c.list()))
    c.evict(MEMORY)


def random_object_id():
    return plasma.ObjectID(np.random.bytes(20))


def test_object_ids():
    a = plasma.ObjectID.from_random()
    assert isinstance(a.binary(), bytes) and len(a.binary()) == 20
    assert plasma.ObjectID(a.binary()) == a and a != plasma.ObjectID.from_random()
    assert hash(plasma.ObjectID(a.binary())) == hash(a)
    assert pickle.loads(pickle.dumps(a)) == a
    assert repr(a) == f"ObjectID({a.binary().hex()})"
    for bad in [b"", b"x" * 19, b"x" * 21]:
        with pytest.raises(ValueError):
            plasma.ObjectID(bad)


def test_exceptions_derive_from_arrow_exception():
    for exc in (plasma.PlasmaObjectExists, plasma.PlasmaObjectNotFound, plasma.PlasmaStoreFull):
        assert issubclass(exc, pa.lib.ArrowException)
        assert issubclass(exc, fp.FerroplasmaError)


def test_connect_retries_then_raises_oserror(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(OSError):
        plasma.connect(str(tmp_path / "nothing.sock"), num_retries=3)
    assert time.monotonic() - t0 >= 0.2, "it retried"


def test_create_seal_get_buffers(client):
    oid = random_object_id()
    buf = client.create(oid, 1000, b"meta")
    assert isinstance(buf, plasma.PlasmaBuffer) and buf.is_mutable and buf.size == 1000
    arr = np.frombuffer(buf, dtype=np.uint8)
    arr[:] = np.arange(1000) % 256
    client.seal(oid)
    [got] = client.get_buffers([oid])
    assert isinstance(got, plasma.PlasmaBuffer) and not got.is_mutable
    assert np.array_equal(np.frombuffer(got, dtype=np.uint8), np.arange(1000) % 256)
    with pytest.raises(TypeError):
        memoryview(got)[0] = 1
    with pytest.raises(IndexError):
        got[1000]
    [(meta, data)] = client.get_buffers([oid], with_meta=True)
    assert meta == b"meta" and data.size == 1000
    [m] = client.get_metadata([oid])
    assert m.to_pybytes() == b"meta"
    with pytest.raises(plasma.PlasmaObjectExists):
        client.create(oid, 10)
    client.release(oid)
    client.release(oid)  # more releases than references are ignored, as in pyarrow


def test_create_and_seal_put_raw_buffer(client):
    oid = random_object_id()
    client.create_and_seal(oid, b"hello", b"m")
    [(meta, data)] = client.get_buffers([oid], with_meta=True)
    assert data.to_pybytes() == b"hello" and meta == b"m"
    raw = client.put_raw_buffer(np.arange(10, dtype=np.int32), metadata=b"ints")
    [buf] = client.get_buffers([raw])
    assert np.frombuffer(buf, dtype=np.int32).tolist() == list(range(10))


def test_put_get_objects_and_not_available(client):
    value = {"a": np.arange(5), "t": pa.table({"x": [1, 2]}), "s": "text"}
    oid = client.put(value)
    got = client.get(oid)
    assert got["a"].tolist() == [0, 1, 2, 3, 4] and got["t"].equals(value["t"])
    missing = random_object_id()
    t0 = time.monotonic()
    assert client.get(missing, timeout_ms=100) is plasma.ObjectNotAvailable
    assert time.monotonic() - t0 >= 0.1
    assert client.get([oid, missing], timeout_ms=0)[1] is plasma.ObjectNotAvailable
    assert client.get_buffers([missing], timeout_ms=10) == [None]
    # Objects interoperate with the native API.
    assert fp.connect(client._c.socket).get(oid)["s"] == "text"


def test_contains_hash_delete_list(client):
    a = client.put_raw_buffer(b"same bytes", metadata=b"m")
    b = client.put_raw_buffer(b"same bytes", metadata=b"m")
    c = client.put_raw_buffer(b"other", metadata=b"m")
    assert client.contains(a) and not client.contains(random_object_id())
    assert client.hash(a) == client.hash(b) != client.hash(c)
    assert len(client.hash(a)) == 8
    with pytest.raises(plasma.PlasmaObjectNotFound):
        client.hash(random_object_id())
    unsealed = random_object_id()
    client.create(unsealed, 7)
    info = client.list()
    assert set(info) >= {a, b, c, unsealed}
    assert info[unsealed]["state"] == "created" and info[unsealed]["construct_duration"] == -1
    assert info[a]["state"] == "sealed" and info[a]["data_size"] == 10
    assert info[a]["metadata_size"] == 1 and info[a]["ref_count"] == 0
    assert abs(info[a]["create_time"] - time.time()) < 60
    assert set(info[a]) == {
        "data_size",
        "metadata_size",
        "ref_count",
        "create_time",
        "construct_duration",
        "state",
    }
    client.delete([a, b])
    assert not client.contains(a) and not client.contains(b)


def test_store_capacity_is_exact_and_a_full_size_object_fits():
    memory = 10_000_001  # not even a multiple of 64
    with plasma.start_plasma_store(memory) as (name, _):
        client = plasma.connect(name)
        assert client.store_capacity() == memory
        oid = random_object_id()
        client.create(oid, memory)
        client.seal(oid)
        client.release(oid)
        with pytest.raises(plasma.PlasmaStoreFull):
            client.create(random_object_id(), memory + 1)


def test_evict_is_lru_by_release_time_and_spares_unsealed(client):
    size = 1_000_000
    ids = [random_object_id() for _ in range(4)]
    for oid in ids:
        client.create_and_seal(oid, b"x" * size)
    unsealed = random_object_id()
    client.create(unsealed, size)
    # Touch ids[0]: released last, so evicted last.
    [buf] = client.get_buffers([ids[0]])
    del buf
    eventually(lambda: client.list()[ids[0]]["ref_count"] == 0)
    # The size an object occupies is its data rounded up to 64 bytes.
    freed = client.evict(size)
    assert freed == (size + 63) // 64 * 64
    assert [client.contains(i) for i in ids] == [True, False, True, True]
    client.evict(10 * size)
    assert [client.contains(i) for i in ids] == [False] * 4
    assert unsealed in client.list(), "unsealed objects are never evicted"


def test_notifications(client):
    client.subscribe()
    sock = client.get_notification_socket()
    oid = random_object_id()
    client.create_and_seal(oid, b"12345", b"ab")
    assert client.get_next_notification() == (oid, 5, 2)
    client.delete([oid])
    assert client.get_next_notification() == (oid, -1, -1)
    other = client.put_raw_buffer(b"xyz")
    ready, _, _ = select.select([sock], [], [], 5)
    assert ready
    time.sleep(0.05)
    ids, data_sizes, meta_sizes = client.decode_notifications(sock.recv(1 << 16))
    assert ids == [other] and data_sizes == [3] and meta_sizes == [0]


def test_buffers_outlive_their_client(store):
    c = plasma.connect(store[0])
    oid = c.put_raw_buffer(b"persistent")
    [buf] = c.get_buffers([oid])
    c.disconnect()
    with pytest.raises(fp.Disconnected):
        c.contains(oid)
    assert buf.to_pybytes() == b"persistent"


def test_a_client_killed_while_blocked_in_get_leaves_the_store_up(store):
    name, proc = store
    code = (
        "import sys, ferroplasma.plasma as plasma; c = plasma.connect(sys.argv[1]); "
        "print('ready', flush=True); c.get(plasma.ObjectID.from_random())"
    )
    child = subprocess.Popen([sys.executable, "-c", code, name], stdout=subprocess.PIPE)
    assert child.stdout.readline().strip() == b"ready"
    time.sleep(0.1)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    c = plasma.connect(name)
    assert proc.poll() is None
    oid = c.put("alive")
    assert c.get(oid) == "alive"


def test_misc_methods(client):
    text = client.debug_string()
    assert "capacity" in text and str(MEMORY) in text
    with pytest.warns(UserWarning):
        client.set_client_options("worker-1", 1000)
    client.set_client_options("worker-1", 0)
    with pytest.raises(NotImplementedError):
        client.to_capsule()


def test_start_plasma_store_options(tmp_path):
    with plasma.start_plasma_store(10_000_000, plasma_directory=str(tmp_path)) as (name, proc):
        assert plasma.connect(name).store_capacity() == 10_000_000
    assert proc.poll() is not None, "the store is stopped on exit"
    with pytest.raises(NotImplementedError):
        with plasma.start_plasma_store(10_000_000, external_store="hashtable://test"):
            pass
