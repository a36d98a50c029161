"""ferroplasma.plasma against pyarrow 11's documented pyarrow.plasma behaviour."""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
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


def test_contains_is_true_while_a_delete_waits_for_a_reader(store):
    """As Plasma's store answered: an object deleted while another client
    reads it is still there for everyone until that client releases it (the
    C++ suite, test_plasma_cpp.py, shows Plasma 11 doing so)."""
    writer, reader = plasma.connect(store[0]), plasma.connect(store[0])
    oid = writer.put_raw_buffer(b"in use")
    [buf] = reader.get_buffers([oid])
    writer.delete([oid])
    assert writer.contains(oid) and reader.contains(oid)
    del buf  # the reader's last reference
    assert not reader.contains(oid)
    eventually(lambda: not writer.contains(oid), what="deleted once released")


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
    freed = client.evict(size)
    assert freed == size
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
    # Plasma's framing: an 8-byte length, then one notification.
    (length,) = struct.unpack("L", sock.recv(8))
    ids, data_sizes, meta_sizes = client.decode_notifications(sock.recv(length))
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
    probe = fp.connect(name)
    eventually(lambda: probe.stats()["awaited_objects"] == 1, what="the child's get to wait")
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


# ---------------------------------------------------------------- issue 16:
# what Plasma's own suite and real Plasma programs rely on.


def test_a_created_buffer_releases_the_object_when_garbage(client):
    oid = random_object_id()
    buf = client.create(oid, 1000)
    view = np.frombuffer(buf, dtype=np.uint8)
    view[:] = 7
    client.seal(oid)
    del buf
    assert client.list()[oid]["ref_count"] == 1, "a view of the buffer still holds it"
    assert client.evict(1) == 0
    del view
    eventually(lambda: client.list()[oid]["ref_count"] == 0, what="the creator's release")
    assert client.evict(1) == 1000
    assert not client.contains(oid)


def test_an_explicit_release_and_the_buffer_are_one_reference(client):
    oid = random_object_id()
    buf = client.create(oid, 100)
    client.seal(oid)
    [got] = client.get_buffers([oid])
    client.release(oid)
    del buf
    assert client.list()[oid]["ref_count"] == 1, "the get's reference is untouched"
    del got
    eventually(lambda: client.list()[oid]["ref_count"] == 0)


def test_the_native_create_releases_with_its_buffer(store):
    c = fp.connect(store[0])
    oid = fp.ObjectID.random()
    buf = c.create(oid, 64)
    memoryview(buf)[:] = b"x" * 64
    c.seal(oid)
    assert c.list()[oid]["ref_count"] == 1
    del buf
    eventually(lambda: c.list()[oid]["ref_count"] == 0)
    assert c.evict(1) == 64
    c.delete(list(c.list()))


def test_create_and_seal_of_large_objects(client):
    big = MEMORY // 10 * b"a"
    oid = random_object_id()
    client.create_and_seal(oid, big, big)
    [(meta, data)] = client.get_buffers([oid], with_meta=True)
    assert data.size == len(big) and meta == big
    del meta, data
    with pytest.raises(plasma.PlasmaObjectExists):
        client.create_and_seal(oid, big, b"")
    # Objects of 20 MB each keep fitting: the older ones are evicted.
    for _ in range(10):
        client.create_and_seal(random_object_id(), big, big)
    assert not client.contains(oid)


def test_evict_returns_data_plus_metadata_bytes(client):
    oid = random_object_id()
    buf = client.create(oid, 1000, b"12345")
    client.seal(oid)
    del buf
    eventually(lambda: client.list()[oid]["ref_count"] == 0)
    assert client.evict(1) == 1005


def test_object_id_errors_and_printing():
    with pytest.raises(ValueError):
        plasma.ObjectID("hello")
    with pytest.raises(ValueError):
        plasma.ObjectID(40 * "a")  # pyarrow took bytes only
    oid = plasma.ObjectID(20 * b"\x01")
    assert str(oid) == repr(oid) == "ObjectID(" + "01" * 20 + ")"
    native = fp.ObjectID(20 * b"\x01")
    assert str(native) == "01" * 20, "the native id keeps printing bare hex"
    assert native == oid and hash(native) == hash(oid)
    assert fp.ObjectID(str(native)) == native, "a printed id can be passed back"
    assert pickle.loads(pickle.dumps(oid)) == oid
    assert type(pickle.loads(pickle.dumps(oid))) is plasma.ObjectID


def test_connect_none_raises_like_pyarrow():
    with pytest.raises(TypeError):
        plasma.connect(None)


def test_pyarrow_plasma_and_its_private_module_alias():
    code = (
        "import ferroplasma.plasma, sys\n"
        "assert 'pyarrow.plasma' not in sys.modules\n"
        "ferroplasma.plasma.alias_pyarrow()\n"
        "import pyarrow.plasma as plasma\n"
        "from pyarrow._plasma import PlasmaObjectExists, PlasmaClient\n"
        "import pyarrow as pa\n"
        "assert plasma is ferroplasma.plasma and pa.plasma is plasma\n"
        "assert PlasmaObjectExists is ferroplasma.plasma.PlasmaObjectExists\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_store_of_4000_bytes():
    with plasma.start_plasma_store(4000) as (name, _):
        client = plasma.connect(name)
        assert client.store_capacity() == 4000
        oid = client.put_raw_buffer(b"x" * 3000)
        assert client.get_buffers([oid])[0].to_pybytes() == b"x" * 3000


def test_start_plasma_store_with_an_external_store_spills():
    with pytest.warns(UserWarning, match="spill"):
        ctx = plasma.start_plasma_store(1000 * 1024, external_store="hashtable://test")
        name, _ = ctx.__enter__()
    try:
        client = plasma.connect(name)
        ids = [random_object_id() for _ in range(20)]
        for i, oid in enumerate(ids):
            client.create_and_seal(oid, bytes([i]) * 100 * 1024)
        for i, oid in enumerate(ids):  # more than fits: they come back from disk
            [buf] = client.get_buffers([oid])
            assert buf.to_pybytes() == bytes([i]) * 100 * 1024
    finally:
        ctx.__exit__(None, None, None)


def _plasma_store_cmd(name: str) -> list:
    exe = os.path.join(os.path.dirname(sys.executable), name)
    if not os.path.exists(exe):  # not installed as a console script here
        pytest.skip(f"no {name} console script beside {sys.executable}")
    return [exe]


@pytest.mark.parametrize("name", ["plasma_store", "plasma-store-server"])
def test_the_plasma_store_command(name, tmp_path):
    # A NamedTemporaryFile's name as the socket: Plasma's store replaced it.
    with tempfile.NamedTemporaryFile(dir=tmp_path, delete=False) as f:
        socket_path = f.name
    cmd = [*_plasma_store_cmd(name), "-m", "10000000", "-s", socket_path, "-e", "hashtable://x"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        client = plasma.connect(socket_path)
        assert client.store_capacity() == 10_000_000
        with open(f"/proc/{proc.pid}/comm") as comm:
            # What `pgrep plasma_store` / `pkill plasma_store` look for.
            assert comm.read().strip() == name[:15]
        # A live store's socket is never replaced.
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        assert second.returncode != 0 and "already" in second.stderr
        assert client.contains(client.put_raw_buffer(b"x"))
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert "external stores" in err and "spill" in err


def test_the_plasma_store_command_flags_and_refusals(tmp_path):
    cmd = _plasma_store_cmd("plasma_store")
    out = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    assert all(flag in out.stdout for flag in ("-m", "-s", "-d", "-h", "-e"))
    out = subprocess.run([*cmd, "-q"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "unrecognized" in out.stderr
    # A directory at the socket path is never replaced.
    out = subprocess.run(
        [*cmd, "-m", "1000000", "-s", str(tmp_path)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode != 0 and "not a socket" in out.stderr
    assert tmp_path.is_dir()


def test_ferroplasma_store_refuses_a_regular_file_and_says_what_to_do(tmp_path):
    path = tmp_path / "plasma.sock"
    path.write_text("keep me")
    out = subprocess.run(
        [sys.executable, "-m", "ferroplasma", "store", "-m", "1MiB", "-s", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode != 0
    assert "not a socket" in out.stderr and "--replace-file" in out.stderr
    assert path.read_text() == "keep me"


def test_a_late_subscriber_hears_of_the_objects_already_sealed(store):
    # Plasma's store told a new subscriber of every sealed object first
    # (orchest's eviction manager subscribes after objects exist).
    a, b = plasma.connect(store[0]), plasma.connect(store[0])
    first, second = a.put_raw_buffer(b"1" * 10), a.put_raw_buffer(b"2" * 20)
    b.subscribe()
    sock = b.get_notification_socket()
    seen = []
    while len(seen) < 2:
        (length,) = struct.unpack("L", sock.recv(8))
        ids, sizes, _ = b.decode_notifications(sock.recv(length))
        seen += [(i, s) for i, s in zip(ids, sizes) if i in (first, second)]
    assert seen == [(first, 10), (second, 20)]
    a.delete([first, second])


@pytest.mark.parametrize("name", ["plasma_store_server", "plasma-store-server"])
def test_the_store_executable_beside_the_package(name, tmp_path):
    # pyarrow <= 11 kept the store beside its Python files; programs (such as
    # pandarallel) start it by that path.
    exe = os.path.join(os.path.dirname(plasma.__file__), name)
    sock = str(tmp_path / "s.sock")
    env = {k: v for k, v in os.environ.items() if k != "FERROPLASMA_PYTHON"}
    env["PATH"] = "/usr/bin:/bin"  # not this environment's bin directory
    proc = subprocess.Popen([exe, "-m", "5000000", "-s", sock], env=env)
    try:
        assert plasma.connect(sock).store_capacity() == 5_000_000
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


@pytest.mark.parametrize("name", ["plasma_store", "plasma-store-server"])
def test_the_plasma_commands_leave_their_socket_as_plasma_did(name, tmp_path):
    """A program written for Plasma stops the store with SIGTERM and then
    removes the socket file itself (84 of one project's 153 tests failed on
    FileNotFoundError when the store removed it)."""
    sock = str(tmp_path / "plasma.sock")
    cmd = [*_plasma_store_cmd(name), "-m", "10000000", "-s", sock]
    for _ in range(2):  # the second start replaces the stale socket
        proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
        try:
            plasma.connect(sock).put_raw_buffer(b"x")
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        assert os.path.exists(sock), "the socket file went with the store"
    os.remove(sock)  # what the program's own helper does


def test_start_plasma_store_leaves_its_socket_for_the_caller_to_remove():
    with plasma.start_plasma_store(10_000_000) as (name, proc):
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        os.remove(name)
