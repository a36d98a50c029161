"""Each system's operations on numbered small objects, for growing a store
to millions of them.

Object i has a key computed from i (a 20-byte id hashed from i, or a
segment name), so the worker keeps no list of keys and the store sees ids
spread as random ones are; Ray names its objects itself, so its worker keeps
the ObjectRefs (dropping one deletes the object). Starting and stopping each
system is bench/compare's adapter, so both benchmarks run the same stores
with the same flags.

This module imports only the standard library and numpy (and each system's
own package when it starts), so it loads in every peer's venv.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from compare.adapters import Unsupported, make

# Which call stands for which operation (shown in the report).
NOTES = {
    "ferroplasma": "create_and_seal of 64 B; get_buffers([id]), released by dropping the buffer; "
    "contains; get_buffers of 1,000 ids; delete in chunks of 10,000",
    "plasma": "pyarrow 11: create_and_seal of 64 B; get_buffers([id]), released by dropping; "
    "contains; get_buffers of 1,000 ids; delete in chunks of 10,000",
    "ray": "ray.put of a 64 B uint8 array; ray.get(ref); contains = ray.wait([ref], "
    "timeout=0); ray.get of 1,000 refs; no absent contains (a ref nobody owns); delete = "
    "dropping the refs; the store's processes: the raylet (its plasma store)",
    "shm": "a multiprocessing.shared_memory segment of 64 B per object, named from i: put = "
    "create, write, close; get = attach by name, released by close; contains = attach; "
    "no batched get; delete = unlink; no store process (RSS n/a)",
}
SYSTEMS = list(NOTES)
ABSENT = 1 << 40  # object numbers from here on are never put


def object_id(i: int) -> bytes:
    """The 20-byte id of object i: a hash, so ids look random to the store."""
    return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=20).digest()


class System:
    """One system's numbered objects. Subclasses map the operations."""

    name = ""
    has_store_process = True
    # Memory each object takes that no process's RSS shows (run.py adds it
    # when it checks that the machine has room for the next count).
    unseen_bytes_per_object = 0

    def __init__(self, object_size: int):
        self.adapter = make(self.name)
        self.payload = np.random.default_rng(object_size).integers(
            0, 255, object_size, dtype=np.uint8
        )
        self.data = self.payload.tobytes()

    def start(self, capacity: int, workdir: str) -> None:
        self.adapter.start(capacity, workdir)

    def stop(self) -> None:
        self.adapter.stop()

    def version(self) -> str:
        return self.adapter.version()

    def store_pids(self) -> list[int]:
        """The processes that make up the store (their memory is its RSS)."""
        return []

    def limit(self, count: int) -> str | None:
        """Why this system cannot hold `count` objects, or None."""
        return None

    # Keys are computed outside the timed calls.
    def key(self, i: int):
        return object_id(i)

    def absent_key(self, i: int):
        return self.key(ABSENT + i)

    def new_key(self, i: int):
        """The key to put object i under (None where the system names it)."""
        return self.key(i)

    def put(self, key) -> None:
        raise NotImplementedError

    def get(self, key):
        return self.get_many([key])[0]

    def get_many(self, keys: list) -> list:
        raise Unsupported

    def release(self, handle) -> None:
        """Gives up what get returned (most systems: dropping it)."""

    def contains(self, key) -> bool:
        raise NotImplementedError

    def delete(self, keys: list) -> None:
        raise NotImplementedError

    def delete_range(self, lo: int, hi: int) -> None:
        """Deletes objects lo..hi-1 (run.py goes from the first on)."""
        self.delete([self.key(i) for i in range(lo, hi)])


class _PlasmaShaped(System):
    def get_many(self, keys):
        return self.adapter.client.get_buffers(keys)

    def contains(self, key):
        return self.adapter.client.contains(key)

    def delete(self, keys):
        self.adapter.client.delete(keys)


class Ferroplasma(_PlasmaShaped):
    name = "ferroplasma"

    def put(self, key):
        self.adapter.client.create_and_seal(key, self.data)

    def store_pids(self):
        return [self.adapter.store.process.pid]


class Plasma(_PlasmaShaped):
    name = "plasma"

    def key(self, i):
        return self.adapter.plasma.ObjectID(object_id(i))

    def put(self, key):
        self.adapter.client.create_and_seal(key, self.data)

    def store_pids(self):
        return [self.adapter.proc.pid]


class Ray(System):
    name = "ray"

    def __init__(self, object_size):
        super().__init__(object_size)
        self.refs: list = []

    def key(self, i):
        return self.refs[i]

    def absent_key(self, i):
        raise Unsupported  # an ObjectRef nobody owns cannot be waited on

    def new_key(self, i):
        return None  # Ray names the object; the ref is kept, in order

    def put(self, key):
        self.refs.append(self.adapter.ray.put(self.payload))

    def get(self, key):
        return self.adapter.ray.get(key)

    def get_many(self, keys):
        return self.adapter.ray.get(keys)

    def contains(self, key):
        return self.adapter.contains(key)

    def delete_range(self, lo, hi):
        # Ray frees an object when its last ObjectRef is dropped.
        self.refs[lo:hi] = [None] * (hi - lo)
        if hi >= len(self.refs):
            self.refs.clear()

    def store_pids(self):
        node = self.adapter.ray._private.worker._global_node
        return [p.process.pid for p in node.all_processes.get("raylet", [])]


class SharedMemory(System):
    """Segments named from the object number and a tag of this run, so two
    runs (or a test beside a run) never meet in /dev/shm."""

    name = "shm"
    has_store_process = False
    unseen_bytes_per_object = os.sysconf("SC_PAGE_SIZE")  # its file's page in /dev/shm

    def start(self, capacity, workdir):
        from multiprocessing import shared_memory

        super().start(capacity, workdir)
        self.shm = shared_memory
        self.tag = f"fps{os.getpid():x}_"

    def stop(self):
        pass  # run.py deletes every segment it made before stopping

    def key(self, i):
        return f"{self.tag}{i:x}"

    def put(self, key):
        seg = self.shm.SharedMemory(name=key, create=True, size=len(self.data))
        seg.buf[: len(self.data)] = self.data
        seg.close()

    def get(self, key):
        return self.shm.SharedMemory(name=key)

    def release(self, handle):
        handle.close()

    def contains(self, key):
        try:
            self.shm.SharedMemory(name=key).close()
        except FileNotFoundError:
            return False
        return True

    def delete(self, keys):
        for key in keys:
            seg = self.shm.SharedMemory(name=key)
            seg.close()
            seg.unlink()

    def limit(self, count):
        """Each segment is a file of its own in /dev/shm and takes a page
        there, however small; room is kept for the other systems."""
        page = os.sysconf("SC_PAGE_SIZE")
        st = os.statvfs("/dev/shm")
        free = st.f_bavail * st.f_frsize
        need = count * page
        if need > free // 2:
            return (
                f"{count:,} segments would take {need / 2**30:.1f} GiB of /dev/shm "
                f"(a {page} B page each), over half of its {free / 2**30:.1f} GiB free"
            )
        return None


CLASSES = {c.name: c for c in [Ferroplasma, Plasma, Ray, SharedMemory]}


def make_system(name: str, object_size: int) -> System:
    try:
        return CLASSES[name](object_size)
    except KeyError:
        raise ValueError(f"unknown system {name!r}; known: {', '.join(CLASSES)}") from None
