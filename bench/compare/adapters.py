"""One small adapter per system, so every workload runs the same code on all.

An adapter starts and stops its system's store, and maps the operations
the workloads need onto that system's own API:

    raw objects   create_seal(src) -> key, get(key) -> handle, get_many(keys),
                  view(handle) -> buffer, release(handle), contains(key),
                  delete(keys)
    objects       put(obj) -> key, get_obj(key), delete_obj(keys)
    other process reader_info() (what a reader process needs to connect),
                  attach(info) (in that process), key_text/key_from_text

Where a system has no such operation the adapter says so (`raw`,
`batched_get`, `cross_process` flags) and the figure is reported as
"n/a", never faked. The notes in `NOTES` say which call stands for which
operation where the mapping is not one-to-one.

This module imports only the standard library and numpy; each adapter
imports its system when it starts, so it loads in every peer's venv.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

# Which call stands for each operation, where it is not the obvious one.
NOTES = {
    "ferroplasma": (
        "create/write/seal/release; get_buffers; buffers release when dropped; "
        "get of bytes with bytes_as_view=True (a memoryview of the store, as Vineyard's)"
    ),
    "plasma": "pyarrow 11 plasma client: create/seal, get_buffers, buffers release when dropped",
    "ray": (
        "ray.put/ray.get of a uint8 array (objects under 100 KiB live in the owner's heap, "
        "not the shared store); contains = ray.wait(timeout=0); delete = dropping the last "
        "ObjectRef; no batch create; the reader is a Ray task"
    ),
    "vineyard": (
        "create_blob/seal, get_blob(s), exists, delete; release = dropping the Blob; "
        "put/get native for arrays, bytes and containers of arrays; other objects pickled "
        "into one blob (native put makes one object per element: minutes for 200,000 strings)"
    ),
    "shm": (
        "multiprocessing.shared_memory: one segment per object; get = attach; release = close; "
        "delete = unlink; objects are pickle-5 with out-of-band buffers in one segment; "
        "no batched get"
    ),
    "pickle": "pickle.dumps/loads (protocol 5) in process memory; another process = a pipe",
}


class Unsupported(Exception):
    """The system has no such operation; the figure is reported as n/a."""


class Adapter:
    """The operations every system offers; the base class documents them."""

    name = ""
    raw = True  # create/get/contains/release/delete of raw buffers
    batched_get = True  # one call gets many objects
    cross_process = True  # another process can read what this one stored

    def start(self, capacity: int, workdir: str) -> None:
        """Starts this system's store (capacity in bytes) and connects."""

    def stop(self) -> None:
        """Disconnects and stops the store; must not raise."""

    def version(self) -> str:
        raise NotImplementedError

    # -------------------------------------------------------------- raw objects
    def create_seal(self, src: np.ndarray):
        """Creates an object of src.nbytes, writes src into it, seals it."""
        raise Unsupported

    def get(self, key):
        """A zero-copy handle of a sealed object (blocks until sealed)."""
        return self.get_many([key])[0]

    def get_many(self, keys: list) -> list:
        raise Unsupported

    def view(self, handle):
        """A buffer over the handle's bytes (exactly the object's size)."""
        return handle

    def release(self, handle) -> None:
        """Gives up a handle from get (most systems: by dropping it)."""

    def contains(self, key) -> bool:
        raise Unsupported

    def delete(self, keys: list) -> None:
        raise Unsupported

    # ------------------------------------------------------------------ objects
    def put(self, obj):
        raise Unsupported

    def get_obj(self, key):
        raise Unsupported

    def delete_obj(self, keys: list) -> None:
        self.delete(keys)

    # ------------------------------------------------------------ other process
    def reader_info(self) -> dict:
        """What a reader process needs to connect (JSON-able)."""
        return {}

    def attach(self, info: dict) -> None:
        """Connects in a reader process, from reader_info()."""

    def key_text(self, key) -> str:
        raise Unsupported

    def key_from_text(self, text: str):
        raise Unsupported


def _wait_for_socket(path: str, proc: subprocess.Popen, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} before listening")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not create {path} within {timeout} s")
        time.sleep(0.05)


def _stop_process(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _fill(buffer, src: np.ndarray) -> None:
    np.copyto(np.frombuffer(buffer, dtype=np.uint8, count=src.nbytes), src)


# ------------------------------------------------- the Plasma-shaped client API
class _PlasmaShaped(Adapter):
    """ferroplasma and Plasma share the client calls: get_buffers,
    contains, delete, put, get, a socket path for readers."""

    socket = None
    client = None

    def get_many(self, keys):
        return self.client.get_buffers(keys)

    def contains(self, key):
        return self.client.contains(key)

    def delete(self, keys):
        self.client.delete(keys)

    def put(self, obj):
        return self.client.put(obj)

    def get_obj(self, key):
        return self.client.get(key)

    def reader_info(self):
        return {"socket": self.socket}


# ----------------------------------------------------------------- ferroplasma
class FerroplasmaAdapter(_PlasmaShaped):
    name = "ferroplasma"

    def __init__(self):
        self._stack = contextlib.ExitStack()
        self.client = None
        self.socket = None
        self.store = None

    def start(self, capacity, workdir):
        import ferroplasma as fp

        self.fp = fp
        store = self._stack.enter_context(
            fp.start_store(str(capacity), socket=os.path.join(workdir, "ferroplasma.sock"))
        )
        self.store = store  # its process: bench/scale reads its memory
        self.socket = store.socket
        self.client = fp.connect(self.socket)

    def stop(self):
        self.client = None
        self._stack.close()

    def version(self):
        from importlib.metadata import version

        return version("ferroplasma")

    def get_obj(self, key):
        return self.client.get(key, bytes_as_view=True)

    def create_seal(self, src):
        oid = self.fp.ObjectID.from_random()
        buf = self.client.create(oid, src.nbytes)
        _fill(buf, src)
        del buf
        self.client.seal(oid)
        self.client.release(oid)
        return oid

    def attach(self, info):
        import ferroplasma as fp

        self.fp = fp
        self.client = fp.connect(info["socket"])

    def key_text(self, key):
        return key.hex()

    def key_from_text(self, text):
        return self.fp.ObjectID.from_hex(text)


# ---------------------------------------------------------------------- plasma
class PlasmaAdapter(_PlasmaShaped):
    name = "plasma"

    def __init__(self):
        self.proc = None
        self.client = None

    def start(self, capacity, workdir):
        import warnings

        warnings.filterwarnings("ignore", message="Plasma is deprecated")
        import pyarrow.plasma as plasma

        self.plasma = plasma
        self.socket = os.path.join(workdir, "plasma.sock")
        server = shutil.which("plasma_store", path=os.path.dirname(sys.executable))
        if server is None:
            raise RuntimeError("plasma_store is not in this venv (pyarrow==11.0.0 provides it)")
        self.log = open(os.path.join(workdir, "plasma.log"), "wb")
        self.proc = subprocess.Popen(
            [server, "-m", str(capacity), "-s", self.socket],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        _wait_for_socket(self.socket, self.proc, "plasma_store")
        self.client = plasma.connect(self.socket)

    def stop(self):
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.disconnect()
        self.client = None
        _stop_process(self.proc)

    def version(self):
        import pyarrow

        return "pyarrow " + pyarrow.__version__

    def create_seal(self, src):
        oid = self.plasma.ObjectID.from_random()
        buf = self.client.create(oid, src.nbytes)
        _fill(buf, src)
        self.client.seal(oid)
        del buf  # drops the creator's reference, as Plasma's own put does
        return oid

    def attach(self, info):
        import warnings

        warnings.filterwarnings("ignore", message="Plasma is deprecated")
        import pyarrow.plasma as plasma

        self.plasma = plasma
        self.client = plasma.connect(info["socket"])

    def key_text(self, key):
        return key.binary().hex()

    def key_from_text(self, text):
        return self.plasma.ObjectID(bytes.fromhex(text))


# ------------------------------------------------------------------------- ray
class RayAdapter(Adapter):
    """Ray's object store through ray.put/ray.get. Objects are named by
    ObjectRefs owned by this driver, so the reader is a Ray task (a worker
    process) that receives the refs, not a separate driver."""

    name = "ray"

    def start(self, capacity, workdir):
        import ray

        self.ray = ray
        ray.init(
            num_cpus=1,
            object_store_memory=capacity,
            include_dashboard=False,
            log_to_driver=False,
            logging_level="ERROR",
        )

    def stop(self):
        with contextlib.suppress(Exception):
            self.ray.shutdown()

    def version(self):
        import ray

        return ray.__version__

    def create_seal(self, src):
        return self.ray.put(src)

    def get_many(self, keys):
        return self.ray.get(keys)

    def contains(self, key):
        ready, _ = self.ray.wait([key], timeout=0, fetch_local=False)
        return bool(ready)

    def delete(self, keys):
        # Ray frees an object when its last ObjectRef is dropped; the caller
        # hands over its references, so clearing the list drops them.
        keys.clear()

    def put(self, obj):
        return self.ray.put(obj)

    def get_obj(self, key):
        return self.ray.get(key)

    def remote_read(self, keys, mode):
        """Runs the reader as a Ray task; returns what worker.read_objects does."""
        import ray

        @ray.remote(num_cpus=1)
        def reader(boxed, mode):
            from compare.worker import read_with

            return read_with(_RayReader(ray), boxed[0], mode)

        return ray.get(reader.remote([keys], mode))


class _RayReader(Adapter):
    """The adapter as seen from inside a Ray task."""

    def __init__(self, ray):
        self.ray = ray

    def get_many(self, keys):
        return self.ray.get(keys)

    def get_obj(self, key):
        return self.ray.get(key)


# -------------------------------------------------------------------- vineyard
class VineyardAdapter(Adapter):
    name = "vineyard"

    def __init__(self):
        self.proc = None
        self.client = None

    def start(self, capacity, workdir):
        import vineyard

        self.vineyard = vineyard
        self.socket = os.path.join(workdir, "vineyard.sock")
        server = os.path.join(os.path.dirname(vineyard.__file__), "bdist", "vineyardd")
        if not os.path.exists(server):
            raise RuntimeError(f"vineyardd is not where the wheel puts it ({server})")
        self.log = open(os.path.join(workdir, "vineyard.log"), "wb")
        self.proc = subprocess.Popen(
            [server, "--socket", self.socket, "--size", str(capacity), "--meta=local", "--norpc"],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        _wait_for_socket(self.socket, self.proc, "vineyardd")
        self.client = vineyard.connect(self.socket)

    def stop(self):
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close()
        self.client = None
        _stop_process(self.proc)

    def version(self):
        import vineyard

        return vineyard.__version__

    def create_seal(self, src):
        builder = self.client.create_blob(src.nbytes)
        _fill(memoryview(builder), src)
        return builder.seal(self.client).id

    def get(self, key):
        return self.client.get_blob(key)

    def get_many(self, keys):
        return self.client.get_blobs(keys)

    def view(self, handle):
        return memoryview(handle)

    def contains(self, key):
        return self.client.exists(key)

    def delete(self, keys):
        self.client.delete(keys)

    def put(self, obj):
        if _array_like(obj):
            return self.client.put(obj)
        # Vineyard stores a list or dict as one object per element (minutes
        # for the Ray serialization post's 200,000 strings); its users pickle such objects
        # into one blob instead, and so does this adapter.
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        builder = self.client.create_blob(len(data))
        _fill(memoryview(builder), np.frombuffer(data, dtype=np.uint8))
        return _Pickled(builder.seal(self.client).id)

    def get_obj(self, key):
        if isinstance(key, _Pickled):
            return pickle.loads(memoryview(self.client.get_blob(key.id)))
        return self.client.get(key)

    def delete_obj(self, keys):
        self.client.delete([k.id if isinstance(k, _Pickled) else k for k in keys], deep=True)

    def reader_info(self):
        return {"socket": self.socket}

    def attach(self, info):
        import vineyard

        self.vineyard = vineyard
        self.client = vineyard.connect(info["socket"])

    def key_text(self, key):
        if isinstance(key, _Pickled):
            return f"p{int(key.id)}"
        return str(int(key))

    def key_from_text(self, text):
        if text.startswith("p"):
            return _Pickled(self.vineyard.ObjectID(int(text[1:])))
        return self.vineyard.ObjectID(int(text))


class _Pickled:
    """A vineyard blob that holds a pickled object."""

    def __init__(self, oid):
        self.id = oid


def _array_like(obj) -> bool:
    """numpy arrays, bytes, and lists/dicts/tuples of numpy arrays."""
    if isinstance(obj, (np.ndarray, bytes)):
        return True
    items = obj.values() if isinstance(obj, dict) else obj
    if isinstance(obj, (list, tuple, dict)):
        return all(isinstance(x, np.ndarray) for x in items)
    return False


# -------------------------------------------------- multiprocessing.shared_memory
class SharedMemoryAdapter(Adapter):
    """One POSIX shared-memory segment per object, named by the key."""

    name = "shm"
    batched_get = False

    def __init__(self):
        self.owned = {}  # name -> SharedMemory kept by the creator until delete
        self.attached = {}  # name -> SharedMemory kept for objects from get_obj
        self.reader = False

    def start(self, capacity, workdir):
        from multiprocessing import shared_memory

        self.shm = shared_memory

    def stop(self):
        for seg in list(self.owned.values()):
            with contextlib.suppress(Exception):
                seg.close()
                seg.unlink()
        self.owned.clear()

    def version(self):
        return "python " + sys.version.split()[0]

    def _attach(self, name):
        seg = self.shm.SharedMemory(name=name)
        if self.reader:
            # Python < 3.13 registers attached segments with this process's
            # resource tracker, which would unlink them when the reader exits.
            from multiprocessing import resource_tracker

            resource_tracker.unregister(seg._name, "shared_memory")
        return seg

    def create_seal(self, src):
        seg = self.shm.SharedMemory(create=True, size=src.nbytes)
        _fill(seg.buf, src)
        self.owned[seg.name] = seg
        return (seg.name, src.nbytes)

    def get(self, key):
        return (self._attach(key[0]), key[1])

    def get_many(self, keys):
        return [self.get(k) for k in keys]

    def view(self, handle):
        return handle[0].buf[: handle[1]]

    def release(self, handle):
        handle[0].close()

    def contains(self, key):
        try:
            self._attach(key[0]).close()
        except FileNotFoundError:
            return False
        return True

    def delete(self, keys):
        for name, _ in keys:
            seg = self.owned.pop(name)
            seg.close()
            seg.unlink()

    # Objects: a pickle-5 stream and its out-of-band buffers in one segment:
    # u64 pickle length, u64 buffer count, u64 buffer lengths, the pickle,
    # then each buffer at a 64-byte aligned offset.
    def put(self, obj):
        buffers = []
        data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
        raws = [b.raw() for b in buffers]
        head = struct.pack(f"<QQ{len(raws)}Q", len(data), len(raws), *[r.nbytes for r in raws])
        offsets, pos = [], _align(len(head) + len(data))
        for r in raws:
            offsets.append(pos)
            pos = _align(pos + r.nbytes)
        seg = self.shm.SharedMemory(create=True, size=max(pos, 1))
        seg.buf[: len(head)] = head
        seg.buf[len(head) : len(head) + len(data)] = data
        for off, r in zip(offsets, raws):
            seg.buf[off : off + r.nbytes] = r
        self.owned[seg.name] = seg
        return (seg.name, pos)

    def get_obj(self, key):
        seg = self.attached.get(key[0]) or self._attach(key[0])
        self.attached[key[0]] = seg
        buf = seg.buf
        plen, nbuf = struct.unpack_from("<QQ", buf, 0)
        lens = struct.unpack_from(f"<{nbuf}Q", buf, 16)
        start = 16 + 8 * nbuf
        pos = _align(start + plen)
        views = []
        for n in lens:
            views.append(buf[pos : pos + n])
            pos = _align(pos + n)
        return pickle.loads(buf[start : start + plen], buffers=views)

    def delete_obj(self, keys):
        # Objects handed out by get_obj may still view the segment; it is
        # unlinked now and unmapped when the last view is garbage.
        for name, _ in keys:
            self.attached.pop(name, None)
            seg = self.owned.pop(name)
            seg.unlink()

    def attach(self, info):
        from multiprocessing import shared_memory

        self.shm = shared_memory
        self.reader = True

    def key_text(self, key):
        return f"{key[0]}:{key[1]}"

    def key_from_text(self, text):
        name, size = text.rsplit(":", 1)
        return (name, int(size))


def _align(n: int, to: int = 64) -> int:
    return (n + to - 1) // to * to


# ---------------------------------------------------------------------- pickle
class PickleAdapter(Adapter):
    """Plain pickle: the object is its bytes, in this process's memory; a
    reader process receives the bytes through a pipe."""

    name = "pickle"
    raw = False
    batched_get = False

    def version(self):
        return "python " + sys.version.split()[0]

    def put(self, obj):
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)

    def get_obj(self, key):
        return pickle.loads(key)

    def delete_obj(self, keys):
        keys.clear()


ADAPTERS = {
    cls.name: cls
    for cls in [
        FerroplasmaAdapter,
        PlasmaAdapter,
        RayAdapter,
        VineyardAdapter,
        SharedMemoryAdapter,
        PickleAdapter,
    ]
}


def make(name: str) -> Adapter:
    try:
        return ADAPTERS[name]()
    except KeyError:
        raise ValueError(f"unknown system {name!r}; known: {', '.join(ADAPTERS)}") from None


def scratch_dir() -> str:
    return tempfile.mkdtemp(prefix="fp-compare-")
