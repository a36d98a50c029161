"""The client API against a real store."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import ferroplasma as fp
from conftest import eventually
from ferroplasma import errors


def test_create_write_seal_get_release(client):
    oid = fp.ObjectID.random()
    buf = client.create(oid, 1000, metadata=b"meta")
    view = memoryview(buf)
    assert not view.readonly and len(view) == 1000
    arr = np.frombuffer(buf, dtype=np.uint8)
    arr[:] = np.arange(1000) % 251
    assert client.contains(oid) is False, "unsealed objects are invisible"
    client.seal(oid)
    client.release(oid)  # Plasma's call: the buffer still holds the reference
    assert client.list()[oid]["ref_count"] == 1
    expected = bytes(arr)
    view.release()
    del view, arr, buf  # the creator's reference goes with its buffer
    [got] = client.get_buffers([oid])
    assert bytes(memoryview(got)) == expected
    assert got.metadata == b"meta" and len(got) == 1000
    assert client.contains(oid) is True
    info = client.list()[oid]
    assert info["state"] == "sealed" and info["data_size"] == 1000 and info["ref_count"] == 1
    assert info["construct_duration"] >= 0
    del got
    eventually(lambda: client.list()[oid]["ref_count"] == 0, what="release on garbage")
    assert client.delete(oid) == ["deleted"]
    assert client.delete([oid]) == ["not_found"]


def test_sealed_buffers_are_read_only(client):
    oid = fp.ObjectID.random()
    wb = client.create(oid, 16)
    memoryview(wb)[:] = b"x" * 16
    client.seal(oid)
    assert memoryview(wb).readonly, "new views of a sealed object are read-only"
    with pytest.raises(ValueError):
        np.frombuffer(wb, dtype=np.uint8).setflags(write=True)
    client.release(oid)
    [b] = client.get_buffers([oid])
    with pytest.raises(TypeError):
        memoryview(b)[0] = 1
    arr = client.get(client.put(np.zeros(10)))
    assert not arr.flags.writeable
    with pytest.raises(ValueError):
        arr[0] = 1.0


def test_out_of_bounds_access_raises(client):
    oid = client.put(b"abc")
    [b] = client.get_buffers([oid])
    with pytest.raises(IndexError):
        memoryview(b)[10**6]


def test_seal_and_abort_only_what_this_client_is_creating(client, store):
    oid = fp.ObjectID.random()
    with pytest.raises(fp.ObjectNotFound, match="creating no object"):
        client.seal(oid)
    buf = client.create(oid, 8)
    other = store.connect()
    with pytest.raises(fp.ObjectNotFound):
        other.seal(oid)  # another client's object
    client.seal(oid)
    with pytest.raises(fp.InvalidObjectState, match="sealed already"):
        client.seal(oid)
    with pytest.raises(fp.InvalidObjectState, match="sealed already"):
        client.abort(oid)
    assert memoryview(buf).readonly  # new views of a sealed buffer
    with pytest.raises(TypeError):
        memoryview(buf)[0] = 1
    # The native buffer refuses a second seal or an abort after the seal.
    raw = fp.ObjectID.random().binary()
    native = client._native
    wb = native.create(raw, 8, b"")
    native.seal(wb)
    with pytest.raises(fp.InvalidObjectState, match="already sealed"):
        native.seal(wb)
    with pytest.raises(fp.InvalidObjectState, match="already sealed"):
        native.abort(wb)


def test_abort_and_create_and_seal(client):
    oid = fp.ObjectID.random()
    client.create(oid, 100)
    client.abort(oid)
    assert client.stats()["objects"] == 0
    client.create_and_seal(oid, b"small", b"m")
    [b] = client.get_buffers([oid], timeout=0)
    assert bytes(memoryview(b)) == b"small" and b.metadata == b"m"


def test_get_timeouts(client):
    missing = fp.ObjectID.random()
    t0 = time.monotonic()
    assert client.get_buffers([missing], timeout=0.2) == [None]
    assert time.monotonic() - t0 >= 0.2
    t0 = time.monotonic()
    assert client.get(missing, timeout=0) is fp.NotAvailable
    assert time.monotonic() - t0 < 0.5
    present = client.put("here")
    assert client.get([present, missing], timeout=0.05) == ["here", fp.NotAvailable]


def test_blocking_get_is_woken_by_a_put_elsewhere(store):
    oid = fp.ObjectID.random()
    result = []
    waiter = store.connect()
    t = threading.Thread(target=lambda: result.append(waiter.get(oid, timeout=10)))
    t.start()
    other = store.connect()
    # Put only once the get waits, so that the wake-up is what runs.
    eventually(lambda: other.stats()["awaited_objects"] == 1, what="the get to wait")
    other.put({"k": np.arange(3)}, oid)
    t.join(10)
    assert list(result[0]["k"]) == [0, 1, 2]


def test_exceptions_are_typed_and_builtin_compatible(client, store):
    oid = client.put(1)
    with pytest.raises(fp.ObjectExists) as e:
        client.put(2, oid)
    assert isinstance(e.value, FileExistsError)
    with pytest.raises(KeyError):
        client.seal(fp.ObjectID.random())
    with pytest.raises(MemoryError):
        client.create(fp.ObjectID.random(), 1 << 40)
    with pytest.raises(fp.StoreFull, match="--memory"):
        client.create(fp.ObjectID.random(), 1 << 40)
    with pytest.raises(ConnectionError):
        fp.connect(os.path.join(os.path.dirname(store.socket), "nothing-here.sock"))
    with pytest.raises(fp.InvalidRequest):
        fp.ObjectID(b"short")
    with pytest.raises(ValueError):
        client.release(fp.ObjectID.random())
    with pytest.raises(fp.InvalidObjectState):
        client.seal(oid)
    with pytest.raises(fp.SerializationError):
        client.put(threading.Lock())
    assert issubclass(errors.ObjectLost, LookupError)
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), fp.FerroplasmaError)


def test_a_view_keeps_the_object_referenced_until_it_dies(client):
    oid = client.put(np.ones(1000))
    arr = client.get(oid)
    view = arr[10:20]
    del arr
    assert client.list()[oid]["ref_count"] == 1
    assert client.delete(oid) == ["deferred"]
    assert view.sum() == 10
    del view
    eventually(lambda: oid not in client.list(), what="deferred delete after the last view")


def test_buffers_outlive_their_client(store):
    c = store.connect()
    arr = c.get(c.put(np.arange(5)))
    del c
    assert list(arr) == [0, 1, 2, 3, 4]


def test_evict_list_stats_subscribe(client):
    sub = client.subscribe()
    oids = [client.put(np.zeros(1000, dtype=np.uint8)) for _ in range(3)]
    ev = sub.next(timeout=5)
    assert ev.kind == "sealed" and ev.object_id == oids[0] and ev.data_size > 1000
    assert client.evict(1) > 0
    assert client.contains(oids) == [False, True, True], "LRU first"
    kinds = [sub.next(timeout=5).kind for _ in range(3)]
    assert kinds == ["sealed", "sealed", "deleted"]
    assert sub.next(timeout=0.05) is None
    st = client.stats()
    assert st["capacity"] == 64 << 20 and st["objects"] == 2 and st["evictions"] == 1
    assert 0.0 <= st["fragmentation"] <= 1.0


def test_a_client_is_shared_by_threads(client):
    errs = []

    def work(t):
        try:
            for i in range(100):
                a = np.full(100, t * 1000 + i)
                assert (client.get(client.put(a)) == a).all()
        except Exception as e:  # collected and asserted below
            errs.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errs
    eventually(lambda: client.stats()["referenced_objects"] == 0, what="all released")


def test_after_fork_the_child_gets_a_clear_error_and_fp_get_reconnects(store, monkeypatch):
    monkeypatch.setenv("FERROPLASMA_SOCKET", store.socket)
    client = store.connect()
    oid = fp.put(np.arange(4))
    held = client.get(oid)
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            try:
                client.stats()
            except fp.ForkedClient as e:
                if "connect a new client" in str(e) and list(fp.get(oid)) == [0, 1, 2, 3]:
                    code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert list(held) == [0, 1, 2, 3] and client.stats()["clients"] >= 1


def test_console_script_and_module_entry(store):
    exe = os.path.join(os.path.dirname(sys.executable), "ferroplasma")
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True)
    assert "store" in out.stdout and "shared-memory object store" in out.stdout
    out = subprocess.run(
        [sys.executable, "-m", "ferroplasma", "stats", "--socket", store.socket],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "capacity" in out.stdout and "64.0 MiB" in out.stdout
    bad = subprocess.run([exe, "store", "--memory", "lots"], capture_output=True, text=True)
    assert bad.returncode != 0 and "512MiB" in bad.stderr


def test_start_store_reports_a_failed_start():
    with pytest.raises(fp.StoreUnavailable, match=r"nr_hugepages|exited"):
        with fp.start_store("4MiB", hugepages=True):
            pass


def test_start_store_passes_options(tmp_path):
    with fp.start_store("8MiB", prefault=True, dir=str(tmp_path)) as s:
        c = s.connect()
        assert c.get(c.put("ok")) == "ok"
        assert list(tmp_path.iterdir()) == [], "the arena file is unlinked"


def test_blocking_calls_release_the_gil(client):
    missing = fp.ObjectID.random()
    done = threading.Event()

    def waiter():
        client.get(missing, timeout=1.0)
        done.set()

    t = threading.Thread(target=waiter)
    t.start()
    eventually(lambda: client.stats()["awaited_objects"] == 1, what="the get to wait")
    # While the other thread waits in the store, this one keeps running Python.
    spins, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < 0.3:
        spins += 1
    assert not done.is_set(), "the get should still be waiting"
    assert spins > 10_000, f"the GIL was held during the wait ({spins} loops in 0.3 s)"
    # The same client serves this thread meanwhile: requests are multiplexed.
    t0 = time.monotonic()
    assert client.get(client.put("meanwhile")) == "meanwhile"
    assert time.monotonic() - t0 < 0.5 and not done.is_set()
    t.join()
    assert done.is_set()


def test_object_ids():
    import pickle

    a = fp.ObjectID.random()
    assert len(a.binary()) == 20 and a != fp.ObjectID.random()
    assert fp.ObjectID(a.binary()) == a and hash(fp.ObjectID(a.binary())) == hash(a)
    assert str(a) == a.binary().hex() and fp.ObjectID.from_hex(str(a)) == a
    assert pickle.loads(pickle.dumps(a)) == a
    assert {a: 1}[fp.ObjectID(a.binary())] == 1
    for bad in [b"", b"x" * 19, b"x" * 21]:
        with pytest.raises(fp.InvalidRequest):
            fp.ObjectID(bad)
    with pytest.raises(fp.InvalidRequest):
        fp.ObjectID.from_hex("zz")


def test_create_and_seal_takes_any_buffer_large_or_strided(client):
    big = np.random.default_rng(5).integers(0, 256, 9 * 2**20 + 7, dtype=np.uint8)
    strided = np.arange(4000, dtype=np.int32)[::3]  # not contiguous
    for data in (big, memoryview(big)[1:], strided):
        oid = fp.ObjectID.random()
        client.create_and_seal(oid, data)
        [buf] = client.get_buffers([oid])
        assert bytes(buf) == np.ascontiguousarray(data).tobytes()


def test_too_many_objects_awaited_on_one_connection_is_its_own_error(client):
    """A connection may await at most 1,000,000 objects; one more was raised
    as ObjectTooLarge, a name that says something else."""

    ids = [[fp.ObjectID.from_random() for _ in range(100_000)] for _ in range(10)]
    threads = [
        threading.Thread(target=client.get_buffers, args=(batch,), kwargs={"timeout": 4})
        for batch in ids
    ]
    for t in threads:
        t.start()
    try:
        eventually(lambda: client.stats()["awaited_objects"] == 1_000_000, what="parked gets")
        with pytest.raises(fp.TooManyWaiting, match="1000000 objects") as e:
            client.get_buffers([fp.ObjectID.from_random()], timeout=1)
        assert not isinstance(e.value, fp.ObjectTooLarge)
    finally:
        for t in threads:
            t.join()
    assert client.get_buffers([fp.ObjectID.from_random()], timeout=0) == [None]


def test_a_store_at_its_maximum_of_clients_says_it_is_busy():
    """A connection over --max-clients was refused as ObjectTooLarge, a
    name that says something else; it is StoreBusy, a StoreUnavailable."""
    with fp.start_store("16MiB", max_clients=2) as s:
        held = [s.connect()]
        eventually(lambda: held.append(s.connect()) is None and len(held) >= 2, what="two")
        with pytest.raises(fp.StoreBusy, match="--max-clients") as e:
            s.connect()
        assert isinstance(e.value, fp.StoreUnavailable)
        held.pop()
        eventually(lambda: s.connect() is not None, what="a place frees up")
