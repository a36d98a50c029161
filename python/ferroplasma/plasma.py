"""A drop-in replacement for ``pyarrow.plasma`` (removed from Arrow in 12.0).

Change one line::

    import pyarrow.plasma as plasma        # before (pyarrow <= 11)
    import ferroplasma.plasma as plasma    # after

and run ``plasma_store -m BYTES -s SOCKET`` (ferroplasma's, with Plasma's
flags) or :func:`start_plasma_store`, which starts one. Names, signatures
and behaviour follow pyarrow 11; the differences are listed in
docs/migrating-from-plasma.md. Code that cannot be edited (it imports
``pyarrow.plasma`` or ``pyarrow._plasma`` itself) runs unchanged after
:func:`alias_pyarrow`.

>>> import ferroplasma.plasma as plasma
>>> with plasma.start_plasma_store(10**8) as (socket_name, proc):   # doctest: +SKIP
...     client = plasma.connect(socket_name)
...     oid = client.put({"answer": 42})
...     client.get(oid)
{'answer': 42}
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket as _socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from . import _native, _pyarrow_alias, errors, serialization
from ._ids import ObjectID as _AnyObjectID
from .client import created_buffer
from .store import start_store

__all__ = [
    "ObjectID",
    "ObjectNotAvailable",
    "PlasmaBuffer",
    "PlasmaClient",
    "PlasmaObjectExists",
    "PlasmaObjectNotFound",
    "PlasmaStoreFull",
    "alias_pyarrow",
    "connect",
    "start_plasma_store",
]


def alias_pyarrow() -> None:
    """Makes ``import pyarrow.plasma`` and ``from pyarrow._plasma import X``
    give this module from now on, for code that cannot be edited (a
    dependency, a test suite). Call it once, early (e.g. in a ``conftest.py``
    or ``sitecustomize.py``); it imports nothing until such an import
    happens.

    >>> import ferroplasma.plasma
    >>> ferroplasma.plasma.alias_pyarrow()
    >>> from pyarrow._plasma import PlasmaObjectExists   # doctest: +SKIP
    """
    _pyarrow_alias.install()


class ObjectID(_AnyObjectID):
    """A 20-byte object id, as pyarrow.plasma's: ``ObjectID(20 bytes)``,
    ``from_random()``, ``binary()``; ``str()`` and ``repr()`` print
    ``ObjectID(<hex>)``. Equal to :class:`ferroplasma.ObjectID` of the same
    bytes; anything but 20 bytes raises ``ValueError``."""

    __slots__ = ()

    def __init__(self, binary: bytes | bytearray | memoryview) -> None:
        if not isinstance(binary, (bytes, bytearray, memoryview)):
            raise errors.InvalidRequest(
                f"an object id is 20 bytes, not {type(binary).__name__} {binary!r}"
            )
        super().__init__(binary)

    def __str__(self) -> str:
        return repr(self)


try:  # the originals derived from pyarrow.lib.ArrowException
    from pyarrow.lib import ArrowException as _ArrowBase
except ImportError:  # pragma: no cover - pyarrow is optional
    _ArrowBase = Exception  # type: ignore[assignment,misc]


class PlasmaObjectExists(errors.ObjectExists, _ArrowBase):
    """An object with this id already exists in the store."""


class PlasmaObjectNotFound(errors.ObjectNotFound, _ArrowBase):
    """The object is not in the store."""


class PlasmaStoreFull(errors.StoreFull, _ArrowBase):
    """The store cannot make room for the object."""


class ObjectNotAvailable:
    """Placeholder returned by :meth:`PlasmaClient.get` (the class itself,
    as in pyarrow) for an object not available within the timeout."""


def _as_buffer(native: Any) -> Any:
    """A ``pyarrow.Buffer`` over native memory (zero-copy) when pyarrow is
    installed, as pyarrow.plasma returned; else the native buffer itself."""
    pa = sys.modules.get("pyarrow")
    if pa is None:
        try:
            import pyarrow as pa
        except ImportError:
            return native
    return pa.py_buffer(native)


def _plasma_buffer_type() -> type:
    try:
        import pyarrow as pa

        return pa.Buffer
    except ImportError:  # pragma: no cover
        return _native.Buffer


PlasmaBuffer = _plasma_buffer_type()
"""The type of the buffers ``get_buffers`` and ``create`` return:
``pyarrow.Buffer`` when pyarrow is installed (as in pyarrow.plasma)."""

_TRANSLATE = {
    errors.ObjectExists: PlasmaObjectExists,
    errors.ObjectNotFound: PlasmaObjectNotFound,
    errors.StoreFull: PlasmaStoreFull,
}


@contextlib.contextmanager
def _plasma_errors() -> Iterator[None]:
    try:
        yield
    except tuple(_TRANSLATE) as e:
        for ours, theirs in _TRANSLATE.items():
            if isinstance(e, ours) and not isinstance(e, theirs):
                raise theirs(str(e)) from None
        raise


def _ids(object_ids: Sequence[ObjectID]) -> list[bytes]:
    out = []
    for oid in object_ids:
        if not isinstance(oid, _AnyObjectID):
            raise TypeError(f"expected an ObjectID, got {type(oid).__name__}")
        out.append(oid.binary())
    return out


class PlasmaClient:
    """A connection to a store, with pyarrow.plasma's methods. Make one with
    :func:`connect`."""

    def __init__(self, native: _native.NativeClient) -> None:
        self._native: _native.NativeClient | None = native
        self._creating: dict[bytes, _native.WritableBuffer] = {}
        self._subscription: _native.NativeSubscription | None = None
        self._client_name = ""

    @property
    def _c(self) -> _native.NativeClient:
        if self._native is None:
            raise errors.Disconnected("this PlasmaClient was disconnected; connect() again")
        return self._native

    # ------------------------------------------------------------ creating

    def create(self, object_id: ObjectID, data_size: int, metadata: bytes = b"") -> Any:
        """Creates an object and returns its buffer, mutable until
        :meth:`seal`. Raises PlasmaObjectExists, PlasmaStoreFull."""
        with _plasma_errors():
            buf = self._c.create(_ids([object_id])[0], int(data_size), bytes(metadata))
        self._creating[object_id.binary()] = buf
        return _as_buffer(buf)

    def create_and_seal(self, object_id: ObjectID, data: bytes, metadata: bytes = b"") -> None:
        """Creates, fills and seals an object in one call."""
        with _plasma_errors():
            self._c.create_and_seal(_ids([object_id])[0], data, bytes(metadata))

    def seal(self, object_id: ObjectID) -> None:
        """Makes a created object immutable and visible to all clients."""
        raw = _ids([object_id])[0]
        with _plasma_errors():
            self._c.seal(created_buffer(self._c, raw, self._creating.pop(raw, None)))

    def release(self, object_id: ObjectID) -> None:
        """Tells the store this client no longer needs the object. Buffers
        also release themselves when garbage collected; a release of an
        object this client holds nothing of is ignored (as in pyarrow)."""
        with contextlib.suppress(errors.ObjectNotHeld):
            self._c.release(_ids([object_id])[0])

    def put_raw_buffer(
        self,
        value: Any,
        object_id: ObjectID | None = None,
        metadata: bytes = b"",
        memcopy_threads: int = 6,
    ) -> ObjectID:
        """Stores the bytes of a buffer-protocol object as they are."""
        oid = object_id or ObjectID(self._c.new_id())
        data = memoryview(value).cast("B")
        with _plasma_errors():
            buf = self._c.create(oid.binary(), data.nbytes, bytes(metadata))
            memoryview(buf)[:] = data
            self._c.seal(buf)
            self._c.release(oid.binary())
        return oid

    def put(
        self,
        value: Any,
        object_id: ObjectID | None = None,
        memcopy_threads: int = 6,
        serialization_context: Any = None,
    ) -> ObjectID:
        """Stores a Python object (ferroplasma's serialization: numpy,
        pandas and Arrow data come back as zero-copy views)."""
        if serialization_context is not None:
            warnings.warn(
                "serialization_context is ignored: pyarrow.serialize is gone; "
                "ferroplasma pickles with protocol 5 and out-of-band buffers",
                DeprecationWarning,
                stacklevel=2,
            )
        oid = object_id or ObjectID(self._c.new_id())
        plan = serialization.plan(value)
        with _plasma_errors():
            buf = self._c.create(oid.binary(), plan.size, b"")
            view = memoryview(buf)
            plan.fill(view)
            view.release()
            self._c.seal(buf)
            self._c.release(oid.binary())
        return oid

    # ------------------------------------------------------------ getting

    def get_buffers(
        self, object_ids: Sequence[ObjectID], timeout_ms: int = -1, with_meta: bool = False
    ) -> list[Any]:
        """Buffers of the objects (read-only, zero-copy), ``None`` for those
        not sealed within ``timeout_ms`` (-1: wait forever). With
        ``with_meta``, ``(metadata bytes, buffer)`` pairs."""
        bufs = self._c.get_buffers(_ids(object_ids), int(timeout_ms))
        if not with_meta:
            return [None if b is None else _as_buffer(b) for b in bufs]
        return [(None, None) if b is None else (b.metadata, _as_buffer(b)) for b in bufs]

    def get_metadata(self, object_ids: Sequence[ObjectID], timeout_ms: int = -1) -> list[Any]:
        """The objects' metadata as buffers (``None`` if not available in time)."""
        bufs = self._c.get_buffers(_ids(object_ids), int(timeout_ms))
        return [None if b is None else _as_buffer(b.metadata) for b in bufs]

    def get(self, object_ids: Any, timeout_ms: int = -1, serialization_context: Any = None) -> Any:
        """Objects put with :meth:`put` (or any ferroplasma client); the class
        :class:`ObjectNotAvailable` for those not sealed within ``timeout_ms``."""
        if isinstance(object_ids, Sequence):
            bufs = self._c.get_buffers(_ids(object_ids), int(timeout_ms))
            return [ObjectNotAvailable if b is None else serialization.read(b) for b in bufs]
        return self.get([object_ids], timeout_ms, serialization_context)[0]

    def contains(self, object_id: ObjectID) -> bool:
        """Whether the object is sealed in the store: as in Plasma, also
        while a delete waits for the last client using it to release it."""
        return self._c.contains(_ids([object_id]), deleting=True)[0]

    def hash(self, object_id: ObjectID) -> bytes:
        """An 8-byte digest (BLAKE2b) of the object's data and metadata:
        equal objects hash equal, on any store. Raises PlasmaObjectNotFound."""
        [buf] = self._c.get_buffers(_ids([object_id]), 0)
        if buf is None:
            raise PlasmaObjectNotFound(f"object {object_id} is not in the store")
        h = hashlib.blake2b(digest_size=8)
        h.update(memoryview(buf))
        h.update(buf.metadata)
        return h.digest()

    # ------------------------------------------------------------ managing

    def delete(self, object_ids: Sequence[ObjectID]) -> None:
        """Deletes objects (when their last reference goes, if in use)."""
        self._c.delete(_ids(object_ids))

    def evict(self, num_bytes: int) -> int:
        """Evicts least recently used, unused objects until ``num_bytes`` are
        freed (or none is left); returns the bytes freed."""
        return self._c.evict(int(num_bytes))[0]

    def list(self) -> dict[ObjectID, dict[str, Any]]:
        """Every object: data_size, metadata_size, ref_count, create_time
        (Unix seconds), construct_duration (seconds, -1 while unsealed),
        state ("created" or "sealed"). Read from the store in pages."""
        return self._c.list_pages(100_000, plasma=True).read_all()

    def store_capacity(self) -> int:
        """The store's memory, exactly as given to it."""
        return self._c.capacity

    def debug_string(self) -> str:
        """A human-readable summary of the store."""
        s = self._c.stats()
        return (
            "========== ferroplasma store ==========\n"
            f"socket: {self._c.socket}\n"
            f"capacity: {s['capacity']}\n"
            f"used: {s['used']}\n"
            f"objects: {s['objects']} ({s['sealed_objects']} sealed, "
            f"{s['referenced_objects']} in use)\n"
            f"clients: {s['clients']}\n"
            f"evictions: {s['evictions']} ({s['evicted_bytes']} bytes)\n"
            f"largest free block: {s['largest_free_block']} "
            f"(fragmentation {s['fragmentation']:.3f})\n"
        )

    def set_client_options(self, client_name: str, limit_output_memory: int) -> None:
        """Names this client (for ``debug_string`` callers). Per-client
        memory quotas are not enforced by ferroplasma: a warning says so."""
        self._client_name = str(client_name)
        if limit_output_memory:
            warnings.warn(
                "ferroplasma does not enforce per-client memory limits; "
                "limit_output_memory is ignored (see docs/migrating-from-plasma.md)",
                UserWarning,
                stacklevel=2,
            )

    def to_capsule(self) -> Any:
        """Not available: pyarrow.plasma wrapped its C++ client in a capsule
        for C++ extensions, and there is no C++ client here."""
        raise NotImplementedError(
            "to_capsule() exposed pyarrow's C++ PlasmaClient; ferroplasma has none. "
            "Use the Rust client crate or the documented protocol (docs/protocol.md)."
        )

    def disconnect(self) -> None:
        """Disconnects. Buffers already returned stay valid."""
        self._native = None
        self._subscription = None
        self._creating.clear()

    # ------------------------------------------------------------ notifications

    def subscribe(self) -> None:
        """Subscribes to seal and delete notifications, starting (as in
        Plasma) with one for every object already sealed. The notification
        socket carries them as Plasma's did: an 8-byte length, then one
        notification."""
        self._subscription = self._c.subscribe(plasma_framing=True, existing=True)

    def _sub(self) -> _native.NativeSubscription:
        if self._subscription is None:
            raise errors.InvalidRequest("call subscribe() first")
        return self._subscription

    def get_notification_socket(self) -> _socket.socket:
        """The notification socket, for ``select``. Each notification is an
        8-byte length (``struct.unpack("L", sock.recv(8))``) followed by that
        many bytes, which :meth:`decode_notifications` decodes."""
        return _socket.socket(fileno=os.dup(self._sub().fileno()))

    def decode_notifications(self, buf: Any) -> tuple[list[ObjectID], list[int], list[int]]:
        """Decodes one notification read from the notification socket (the
        bytes after its length) into ``(object_ids, data_sizes,
        metadata_sizes)``; deletions have sizes -1."""
        kind, oid, ds, ms = _native.decode_plasma_event(bytes(buf))
        if kind == "deleted":
            return [ObjectID(oid)], [-1], [-1]
        return [ObjectID(oid)], [ds], [ms]

    def get_next_notification(self) -> tuple[ObjectID, int, int]:
        """Waits for the next notification: ``(object_id, data_size,
        metadata_size)``, sizes -1 for a deletion."""
        kind, oid, ds, ms = self._sub().next_event(None)
        if kind == "deleted":
            return ObjectID(oid), -1, -1
        return ObjectID(oid), ds, ms


def connect(store_socket_name: str | os.PathLike, num_retries: int = -1) -> PlasmaClient:
    """Connects to the store at ``store_socket_name``, trying ``num_retries``
    times 100 ms apart (-1: 50 times, as pyarrow did). Raises an OSError
    (``ferroplasma.StoreUnavailable``) when nothing answers, and TypeError
    for a name that is not a path (``None`` included: unlike
    ``ferroplasma.connect``, there is no default socket, as in pyarrow)."""
    if not isinstance(store_socket_name, (str, os.PathLike)):
        raise TypeError(
            f"store_socket_name must be the store's socket path, "
            f"not {type(store_socket_name).__name__}"
        )
    store_socket_name = os.fspath(store_socket_name)
    attempts = 50 if num_retries < 0 else max(1, num_retries)
    for attempt in range(attempts):
        try:
            return PlasmaClient(_native.NativeClient(store_socket_name))
        except errors.StoreUnavailable:
            if attempt == attempts - 1:
                raise
            time.sleep(0.1)
    raise AssertionError("unreachable")  # pragma: no cover


@contextlib.contextmanager
def start_plasma_store(
    plasma_store_memory: int,
    use_valgrind: bool = False,
    use_profiler: bool = False,
    plasma_directory: str | None = None,
    use_hugepages: bool = False,
    external_store: str | None = None,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Starts a ferroplasma store with ``plasma_store_memory`` bytes on a
    fresh socket; yields ``(socket_name, process)`` and kills it on exit.
    ``use_valgrind``/``use_profiler`` applied to plasma's C++ binary and are
    ignored; with ``external_store``, evicted objects spill to a temporary
    directory (``--spill-dir``) and come back on get, which is what Plasma's
    external stores were for. Writes without a round trip are off, as in
    ``plasma_store``: all of the memory is for objects."""
    if use_valgrind or use_profiler:
        warnings.warn(
            "use_valgrind/use_profiler applied to plasma's C++ store; ignored",
            UserWarning,
            stacklevel=3,
        )
    tmp = tempfile.mkdtemp(prefix="test_plasma-")
    socket_name = os.path.join(tmp, "plasma.sock")
    spill_dir = None
    if external_store is not None:
        spill_dir = os.path.join(tmp, "spill")
        os.mkdir(spill_dir)
        warnings.warn(
            f"external stores ({external_store}) are replaced by spilling: evicted objects "
            "go to a temporary directory and come back on get (ferroplasma store --spill-dir)",
            UserWarning,
            stacklevel=3,
        )
    try:
        with start_store(
            str(int(plasma_store_memory)),
            socket=socket_name,
            dir=plasma_directory,
            hugepages=use_hugepages,
            spill_dir=spill_dir,
            keep_socket=True,  # as Plasma's store: callers may remove it themselves
            # Every byte for objects, as in Plasma (an object of the store's
            # whole size fits): no leases for writes without a round trip.
            fast_writes="off",
        ) as store:
            yield socket_name, store.process
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
