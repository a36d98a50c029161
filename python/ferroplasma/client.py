"""The Python client: objects and raw buffers in a ferroplasma store."""

from __future__ import annotations

import builtins
import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from typing import (
    Any,
    NamedTuple,
    Union,
    overload,
)

from . import _native, serialization
from ._ids import ObjectID, as_bytes
from .errors import InvalidObjectState, ObjectNotFound

__all__ = ["Client", "Event", "NotAvailable", "connect"]

IdLike = Union[ObjectID, bytes, str]
# What names one object (rather than a list of them): an ObjectID, its 20
# bytes, or the 40 hex digits str(oid) prints.
_ONE_ID = (ObjectID, bytes, bytearray, str)

# Objects asked of the store at a time by list(): the store's largest page.
LIST_PAGE = 100_000

# Objects up to this size travel inside one create-and-seal message.
_INLINE_PUT = 64 * 1024


class _NotAvailableType:
    """The result of ``get`` for an object that was not sealed in time."""

    _instance: _NotAvailableType | None = None

    def __new__(cls) -> _NotAvailableType:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ferroplasma.NotAvailable"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self):
        return (_NotAvailableType, ())


NotAvailable = _NotAvailableType()
"""Returned by :meth:`Client.get` for objects not sealed within the timeout
(a timeout is a normal result, not an error). It is falsy."""


class Event(NamedTuple):
    """A subscription event."""

    kind: str  #: "sealed" or "deleted"
    object_id: ObjectID
    data_size: int
    metadata_size: int


def _timeout_ms(timeout: float | None) -> int:
    if timeout is None:
        return -1
    if timeout < 0:
        raise ValueError("timeout must be None (wait forever) or >= 0 seconds")
    return round(timeout * 1000)


class Client:
    """A connection to a ferroplasma store.

    Safe to share between threads; blocking calls release the GIL. After
    ``os.fork()`` the child must connect a new client (using this one raises
    :class:`~ferroplasma.errors.ForkedClient`).

    >>> import ferroplasma as fp, numpy as np
    >>> with fp.start_store("64MiB") as store:            # doctest: +SKIP
    ...     client = fp.connect(store.socket)
    ...     oid = client.put(np.arange(10))
    ...     client.get(oid)
    array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    """

    def __init__(self, socket: str | None = None, *, trust_uid: int | list[int] = ()) -> None:
        uids = [trust_uid] if isinstance(trust_uid, int) else list(trust_uid)
        self._native = _native.NativeClient(socket, uids)
        self._creating: dict[bytes, _native.WritableBuffer] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ properties

    @property
    def socket(self) -> str:
        """The store's socket path."""
        return self._native.socket

    @property
    def read_only(self) -> bool:
        """Whether this client's user may only read the store: another user
        the store allows (``--allow-uid``). It can get, contains, list and
        subscribe, but not put, create, delete or evict (docs/security.md)."""
        return self._native.read_only

    @property
    def capacity(self) -> int:
        """Bytes the store manages."""
        return self._native.capacity

    # ------------------------------------------------------------ raw buffers

    def create(
        self,
        object_id: IdLike,
        size: int,
        metadata: bytes = b"",
        wait: float | None = 0.0,
    ) -> _native.WritableBuffer:
        """Allocates an object of ``size`` bytes and returns its writable
        buffer (use it with ``memoryview`` or ``numpy.frombuffer``). Call
        :meth:`seal` when it is written. The creator's reference ends when
        the buffer and every view of it are garbage; until then the object
        is never evicted.

        When the store is full of objects in use, waits up to ``wait``
        seconds (None: without limit) for other clients to release or delete
        enough; the default 0 fails at once.

        Raises ObjectExists if the id is taken, StoreFull if it cannot fit.
        """
        oid = as_bytes(object_id)
        buf = self._native.create(oid, size, bytes(metadata), _timeout_ms(wait))
        with self._lock:
            self._creating[oid] = buf
        return buf

    def seal(self, object_id: IdLike) -> None:
        """Makes a created object immutable and visible to every client.
        New views of its buffer are read-only from now on. Raises
        ObjectNotFound if this client is creating no such object,
        InvalidObjectState if it is sealed already."""
        oid = as_bytes(object_id)
        with self._lock:
            buf = self._creating.pop(oid, None)
        self._native.seal(created_buffer(self._native, oid, buf))

    def abort(self, object_id: IdLike) -> None:
        """Discards an object this client created and has not sealed."""
        oid = as_bytes(object_id)
        with self._lock:
            buf = self._creating.pop(oid, None)
        self._native.abort(created_buffer(self._native, oid, buf))

    def create_and_seal(self, object_id: IdLike, data: Any, metadata: bytes = b"") -> None:
        """Creates, fills and seals an object: in one message up to 8 MiB of
        data and metadata, as create + copy + seal above that. ``data`` is
        any buffer (bytes, a numpy array of any dtype, a strided view): its
        bytes in C order."""
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1 or not view.c_contiguous:
            view = view.cast("B") if view.c_contiguous else memoryview(view.tobytes())
        self._native.create_and_seal(as_bytes(object_id), view, bytes(metadata))

    def get_buffers(
        self, object_ids: Sequence[IdLike], timeout: float | None = None
    ) -> builtins.list[_native.Buffer | None]:
        """Read-only, zero-copy buffers of sealed objects, waiting up to
        ``timeout`` seconds (None: forever, 0: not at all) for those not yet
        sealed; None for objects not available in time. Each buffer keeps
        its object alive until it (and every view of it) is garbage."""
        # The native side reads ObjectIDs and bytes in place.
        ids = object_ids if type(object_ids) is list else list(object_ids)
        return self._native.get_buffers(ids, _timeout_ms(timeout))

    def release(self, object_id: IdLike) -> None:
        """Plasma's ``release``, kept for code written against it. References
        belong to buffers (those of :meth:`create` and :meth:`get_buffers`)
        and end when a buffer and every view of it are garbage, so the store
        never reuses memory something can still read; this only checks that
        this client holds (or created) the object: ObjectNotHeld otherwise."""
        self._native.release(as_bytes(object_id))

    # ------------------------------------------------------------ objects

    def put(
        self,
        obj: Any,
        object_id: IdLike | None = None,
        metadata: bytes = b"",
        wait: float | None = 0.0,
    ) -> ObjectID:
        """Stores a Python object and returns its id (:meth:`new_id` unless
        given). numpy arrays, pandas objects, Arrow tables and any nesting
        of them are copied once, into shared memory; other objects cost what
        pickling them costs. ``wait``: as for :meth:`create`.

        On a cluster member, let the store choose the id: an id you give
        costs a claim at its directory members, a round trip to another
        host (docs/cluster.md, "Ids the store hands out").

        >>> oid = client.put({"weights": np.zeros(1000)})    # doctest: +SKIP
        """
        oid = ObjectID(as_bytes(object_id) if object_id is not None else self._native.new_id())
        plan = serialization.plan(obj)
        raw = oid.binary()
        wait_ms = _timeout_ms(wait)
        if plan.size <= _INLINE_PUT and wait_ms == 0:
            # Small: serialize here and send it in the create message (one round trip).
            data = bytearray(plan.size)
            plan.fill(memoryview(data))
            self._native.create_and_seal(raw, data, bytes(metadata))
            return oid
        buf = self._native.create(raw, plan.size, bytes(metadata), wait_ms)
        try:
            view = memoryview(buf)
            plan.fill(view)
            view.release()
            self._native.seal(buf)
        except BaseException:
            # The first error is the one to report.
            with contextlib.suppress(Exception):
                self._native.abort(buf)
            raise
        self._native.release(raw)
        return oid

    def new_id(self) -> ObjectID:
        """An id for a new object. On a lone store a random one; on a
        cluster member one the store claimed cluster-wide ahead, so that
        creating it asks no other host (:meth:`put` without an id uses
        these). Ids never used go back when the client disconnects; at most
        4096 unused at once.

        >>> oid = client.new_id()                            # doctest: +SKIP
        >>> buf = client.create(oid, 1000)                   # doctest: +SKIP
        """
        return ObjectID(self._native.new_id())

    @overload
    def get(
        self, object_id: IdLike, timeout: float | None = None, *, bytes_as_view: bool = False
    ) -> Any: ...

    @overload
    def get(
        self,
        object_id: Sequence[IdLike],
        timeout: float | None = None,
        *,
        bytes_as_view: bool = False,
    ) -> builtins.list[Any]: ...

    def get(self, object_id, timeout=None, *, bytes_as_view=False):
        """Gets one object (or a list of them, in one round trip), waiting up
        to ``timeout`` seconds for those not yet sealed. Arrays, frames and
        tables come back as read-only views of shared memory, kept alive as
        long as they are referenced. Objects not available in time come back
        as :data:`NotAvailable`. ``bytes_as_view=True``: a stored ``bytes``
        object comes back as a read-only ``memoryview`` of shared memory
        instead of a copy (for callers that take any buffer).

        >>> client.get(oid)["weights"].flags.writeable       # doctest: +SKIP
        False
        >>> client.get(client.put(b"abc"), bytes_as_view=True)  # doctest: +SKIP
        <memory at 0x...>
        """
        single = isinstance(object_id, _ONE_ID)
        ids = [object_id] if single else list(object_id)
        bufs = self.get_buffers(ids, timeout)
        out = [NotAvailable if b is None else serialization.read(b, bytes_as_view) for b in bufs]
        return out[0] if single else out

    # ------------------------------------------------------------ queries

    def contains(self, object_id: IdLike | Sequence[IdLike], cluster: bool = False):
        """True if the object is sealed in the store (a list for a list).

        With ``cluster=True`` (a store started with ``--cluster-listen``):
        true when it is sealed on any live member of the cluster, e.g.
        ``client.contains(oid, cluster=True)``."""
        if isinstance(object_id, _ONE_ID):
            return self._native.contains([object_id], cluster)[0]
        ids = object_id if type(object_id) is list else list(object_id)
        return self._native.contains(ids, cluster)

    def delete(self, object_ids: IdLike | Sequence[IdLike]) -> builtins.list[str]:
        """Deletes objects now, or when their last reference goes. One of
        "deleted", "deferred", "not_found" per id."""
        if isinstance(object_ids, _ONE_ID):
            object_ids = [object_ids]
        ids = object_ids if type(object_ids) is list else list(object_ids)
        return self._native.delete(ids)

    def list(self, cluster: bool = False) -> dict[ObjectID, dict[str, Any]]:
        """Every object: data_size, metadata_size, ref_count, state
        ("created"/"sealed"), create_time and construct_duration (seconds),
        delete_pending, spilled, cached (a copy pulled from another member).

        Read from the store in pages (see :meth:`list_pages`): a million
        objects take well under a second.

        With ``cluster=True``: the objects of every live cluster member; each
        entry describes the original copy and adds ``members``, the
        addresses of every member holding a copy."""
        if not cluster:
            return self._native.list_pages(LIST_PAGE).read_all()
        out: dict[ObjectID, dict[str, Any]] = {}
        for d in self._native.list(cluster):
            oid = ObjectID(d.pop("object_id"))
            member = d.pop("member")
            prev = out.get(oid)
            if prev is None or (prev["cached"] and not d["cached"]):
                d["members"] = (prev["members"] if prev else []) + [member]
                out[oid] = d
            else:
                prev["members"].append(member)
        return out

    def list_pages(self, page_size: int = 10_000) -> Iterator[dict[ObjectID, dict[str, Any]]]:
        """The store's objects a page at a time: each page is a dict like
        :meth:`list` returns, of at most ``page_size`` objects (the store
        caps pages at 100,000; the first page is at most 1,000, so that it
        comes at once from a store of millions).

        The store takes a snapshot of the ids at the first page and reads
        each page's objects when it is asked for: an object that exists for
        the whole listing is in exactly one page; one deleted meanwhile may
        be missing; one created after the first page is not listed. A page
        may be smaller than asked (objects deleted since), even empty.

        >>> big = 0
        >>> for page in client.list_pages(50_000):  # doctest: +SKIP
        ...     big += sum(1 for info in page.values() if info["data_size"] > 2**20)
        """
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1, got {page_size}")
        yield from self._native.list_pages(page_size)

    def cluster_status(self) -> dict[str, Any]:
        """This store's view of its cluster: ``enabled`` (False for a lone
        store), ``members`` (each with address, data_address, health —
        "this", "alive", "dead", "unknown" or "refused" (another
        cluster token) —, capacity, used, objects,
        last_seen in seconds) and this store's transfer counters (fetches,
        fetched_bytes, pulls — pull requests sent, each carrying every
        object asked of one holder —, served, served_bytes, lookups, claims,
        directory_entries, updates — directory update requests delivered
        to other members, each may carry many objects' news — and
        updates_pending:
        objects whose news this store has not yet delivered to the
        directory, and ids_claimed_ahead: ids claimed cluster-wide for
        :meth:`new_id` and not handed out yet)."""
        return self._native.cluster_status()

    def evict(self, num_bytes: int) -> int:
        """Evicts least recently used, unreferenced objects until at least
        ``num_bytes`` are freed; returns the bytes freed."""
        return self._native.evict(num_bytes)[0]

    def stats(self) -> dict[str, Any]:
        """The store's counters, as a dict.

        Memory: ``capacity``, ``used`` (bytes held by allocations),
        ``largest_free_block``, ``free_blocks``, ``fragmentation`` (0 to 1),
        ``evictable_bytes``. Objects: ``objects``, ``sealed_objects``,
        ``referenced_objects``, ``evictions``, ``evicted_bytes``. Spilling
        (zero without a spill directory): ``spilled_objects``,
        ``spilled_bytes``, ``spill_dir_bytes``, ``spills``, ``restores``.
        Waiting: ``clients``, ``awaited_objects`` (objects some get waits to
        see sealed), ``waiting_creates`` (creates waiting for space).

        >>> client.stats()["waiting_creates"]  # doctest: +SKIP
        0
        """
        return self._native.stats()

    def subscribe(self, existing: bool = False) -> Subscription:
        """An iterator of :class:`Event` for every seal and deletion from now
        on; with ``existing=True`` it starts with a seal event for every
        object already sealed (oldest first)."""
        return Subscription(self._native.subscribe(existing=existing))

    def __repr__(self) -> str:
        return f"<ferroplasma.Client socket={self.socket!r}>"


class Subscription:
    """Seal and delete events, in order. Iterate, or call :meth:`next` with
    a timeout."""

    def __init__(self, native: _native.NativeSubscription) -> None:
        self._native = native

    def next(self, timeout: float | None = None) -> Event | None:
        """The next event, or None if none came within ``timeout`` seconds."""
        ev = self._native.next_event(timeout)
        if ev is None:
            return None
        kind, oid, data_size, meta_size = ev
        return Event(kind, ObjectID(oid), data_size, meta_size)

    def fileno(self) -> int:
        """The socket, for ``selectors``/``select``."""
        return self._native.fileno()

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        ev = self.next(None)
        if ev is None:  # pragma: no cover - next(None) blocks until an event
            raise StopIteration
        return ev


def default_socket() -> str:
    """The socket every client and command uses by default:
    ``$FERROPLASMA_SOCKET``, else ``/tmp/ferroplasma.sock``."""
    return os.environ.get("FERROPLASMA_SOCKET") or "/tmp/ferroplasma.sock"


def connect(socket: str | None = None, *, trust_uid: int | list[int] = ()) -> Client:
    """Connects to a store: ``socket``, else ``$FERROPLASMA_SOCKET``, else
    ``/tmp/ferroplasma.sock``. Raises StoreUnavailable if none answers.

    The store must be run by this user or root: one run by another user is
    refused with :class:`~ferroplasma.errors.PermissionDenied` (naming its
    owner) before anything is sent, since it would see every object put.
    ``trust_uid`` (or ``$FERROPLASMA_TRUST_UID=1001,1002``) names other
    users whose stores to trust."""
    return Client(socket, trust_uid=trust_uid)


_default: Client | None = None
_default_pid = 0
_default_lock = threading.Lock()


def default_client() -> Client:
    """The module-level client used by ``ferroplasma.put``/``get``;
    reconnected automatically in a forked child."""
    global _default, _default_pid
    with _default_lock:
        if _default is None or _default_pid != os.getpid():
            _default = Client(None)
            _default_pid = os.getpid()
        return _default


def created_buffer(
    native: _native.NativeClient, oid: bytes, buf: _native.WritableBuffer | None
) -> _native.WritableBuffer:
    """The buffer of an object this client is creating, for seal or abort;
    the error that fits when there is none."""
    if buf is not None:
        return buf
    if native.contains([oid])[0]:
        raise InvalidObjectState(f"object {oid.hex()} is sealed already")
    raise ObjectNotFound(f"this client is creating no object {oid.hex()}")
