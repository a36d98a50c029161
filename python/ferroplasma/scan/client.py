"""The scan client: sends SQL to a scan server and receives the result's
Arrow buffers straight into 64-byte-aligned memory (or into the local store),
then builds the record batches around them without copying."""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
from collections.abc import Iterator
from typing import Any

from .. import arrow_layout, serialization
from .._ids import ObjectID
from .._optional import require
from ..errors import (
    AccessDenied,
    DatasetNotFound,
    FerroplasmaError,
    ProtocolError,
    QueryError,
    ScanError,
    ScanServerUnavailable,
)
from . import ucx, wire
from .transport import TcpTransport, Transport, tcp_connect

__all__ = ["Scan", "ScanClient", "connect", "typed_error"]

_ERRORS: dict[str, type[Exception]] = {
    "auth": AccessDenied,
    "access": AccessDenied,
    "dataset": DatasetNotFound,
    "query": QueryError,
    "protocol": ProtocolError,
    "busy": ScanServerUnavailable,  # a connection cap: try later
}
# ITERATE requests kept in flight, so the server is producing the next batch
# while this side receives the current one; each asks for up to _PER_ITERATE
# batches or _ITERATE_BYTES bytes, whichever comes first (small batches then
# cost one request per few MiB, not one each).
_IN_FLIGHT = 2
_PER_ITERATE = 64
_ITERATE_BYTES = 8 << 20
# Batches the native receiver lands ahead of the consumer.
_QUEUE = 2
# "QueryError: ..." in a pyarrow error: a scan error that crossed the Arrow
# C stream (which carries only a message).
_CLASS_IN_MESSAGE = re.compile(
    r"\b(QueryError|DatasetNotFound|AccessDenied|ScanServerUnavailable|ProtocolError|"
    r"SerializationError|ScanError): (.*)",
    re.S,
)


def _raise(fields: dict[str, Any]) -> None:
    cls = _ERRORS.get(fields.get("code", ""), ScanError)
    raise cls(fields.get("message") or "the scan server reported an error")


class ScanClient:
    """A connection pool to one scan server. Thread-safe; each running scan
    uses a connection of its own, so scans can run side by side."""

    def __init__(self, address: str, token: str | None = None, timeout: float | None = 30.0):
        require("the scan client (fp.scan)", "scan", "pyarrow")
        self.address = address
        self._token = token or ""
        self._timeout = timeout
        self._idle: list[Transport] = []
        self._lock = threading.Lock()
        self._connection().close()  # fail now if nobody answers

    # ------------------------------------------------------------ connections

    def _connection(self) -> Transport:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        try:
            if self.address.startswith(ucx.SCHEME):
                t: Transport = ucx.ucx_connect(self.address, self._timeout)
            else:
                t = tcp_connect(self.address, self._timeout)
        except ScanServerUnavailable:
            raise  # e.g. no UCX binding: its message says what to install
        except OSError as e:
            raise ScanServerUnavailable(
                f"no scan server answers at {self.address} ({e}); start one with "
                "`ferroplasma scan-server --listen HOST:PORT --root DIR`"
            ) from None
        try:
            wire.send(t, wire.HELLO, {"version": wire.VERSION, "token": self._token})
            kind, fields, _ = wire.recv(t)
        except OSError as e:
            t.close()
            raise ScanServerUnavailable(f"scan server {self.address} hung up: {e}") from None
        if isinstance(t, ucx.UcxTransport):
            t.deadline = None  # the HELLO's answer came in time
        if kind == wire.ERROR:
            t.close()
            _raise(fields)
        if kind != wire.READY:
            t.close()
            raise ProtocolError(f"{self.address} answered {wire.NAMES[kind]} to HELLO")
        return t

    def _give_back(self, t: Transport) -> None:
        with self._lock:
            self._idle.append(t)

    def close(self) -> None:
        """Closes the idle connections (running scans finish first)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for t in idle:
            t.close()

    def __enter__(self) -> ScanClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ queries

    def query(
        self,
        sql: str,
        dataset: str,
        *,
        into_store: Any = None,
        batch_rows: int | None = None,
        materialize: bool = False,
        wire_format: str = "buffers",
    ) -> Any:
        """Runs ``sql`` on the server over ``dataset`` (a path under the
        server's root, visible to the SQL as the view ``dataset``).

        Returns a ``pyarrow.RecordBatchReader`` whose batches are built
        around the received buffers (no copy). With ``into_store=client``
        every batch lands in that local ferroplasma store instead, and the
        call returns the list of their ObjectIDs (``client.get(oid)`` is a
        RecordBatch of shared memory, in any process on the host). If the
        server runs on this host with the same store, it puts the batches
        there itself and only the ids travel.

        ``batch_rows``: rows per batch (server default 1Mi).
        ``materialize``: the server runs the query to the end before sending
        (to time the transport alone). ``wire_format="ipc"``: the server
        serializes each batch into one contiguous Arrow IPC message first —
        the baseline the buffer transport is measured against.

        >>> sql = "SELECT a, b FROM dataset WHERE c > 3"
        >>> table = scan.query(sql, "t.parquet").read_all()      # doctest: +SKIP
        """
        s = self.open(
            sql,
            dataset,
            into_store=into_store,
            batch_rows=batch_rows,
            materialize=materialize,
            wire_format=wire_format,
        )
        if into_store is None:
            return s.reader()
        # Batches the client lands itself stay unsealed until the whole
        # result is in: a client killed midway leaves nothing in the store.
        s._seal_late = True
        ids: list[ObjectID] = []
        try:
            with s:
                ids.extend(s)
        except BaseException:
            with contextlib.suppress(Exception):
                into_store.delete(ids)  # no half results left in the store
            raise
        return ids

    def open(
        self,
        sql: str,
        dataset: str,
        *,
        into_store: Any = None,
        batch_rows: int | None = None,
        materialize: bool = False,
        wire_format: str = "buffers",
    ) -> Scan:
        """Starts a scan (``init_scan``) and returns it before any batch
        moves: iterate the :class:`Scan` for the batches (ObjectIDs with
        ``into_store``), :meth:`Scan.close` to stop early. Arguments as for
        :meth:`query`."""
        import pyarrow as pa

        t = self._connection()
        probe = None
        try:
            if into_store is not None:
                probe = ObjectID.random()
                into_store.create_and_seal(probe, b"scan probe")
            wire.send(
                t,
                wire.INIT_SCAN,
                {
                    "sql": sql,
                    "dataset": dataset,
                    "batch_rows": batch_rows,
                    "materialize": bool(materialize),
                    "wire": wire_format,
                    "store_probe": probe.hex() if probe else None,
                },
            )
            kind, fields, body_len = wire.recv(t)
            if kind == wire.ERROR:
                self._give_back(t)
                _raise(fields)
            if kind != wire.SCAN:
                raise ProtocolError(f"expected SCAN, got {wire.NAMES[kind]}")
            schema = pa.ipc.read_schema(pa.py_buffer(t.recv_exact(body_len)))
        except ProtocolError:
            t.close()
            raise
        except ScanError:
            raise
        except OSError as e:
            t.close()
            raise ScanServerUnavailable(f"scan server {self.address} hung up: {e}") from None
        finally:
            if probe is not None:
                with contextlib.suppress(Exception):
                    into_store.delete(probe)
        via_store = bool(fields.get("via_store"))
        native = (
            wire_format == "buffers"
            and isinstance(t, TcpTransport)
            and not via_store
            and (into_store is None or _native_client(into_store) is not None)
        )
        s = Scan(self, t, fields["scan"], schema, into_store, via_store, native)
        s._probe = probe
        return s

    def to_table(self, sql: str, dataset: str, **kwargs: Any) -> Any:
        """The whole result as a ``pyarrow.Table`` (its buffers are the
        received ones). Errors are typed, as for iterating a :class:`Scan`."""
        import pyarrow as pa

        reader = self.query(sql, dataset, **kwargs)
        try:
            return reader.read_all()
        except (pa.ArrowException, OSError) as e:  # pyarrow raises OSError for I/O errors
            raise typed_error(e) from None

    def status(self) -> dict[str, int]:
        """The server's open scans and connections, batches and bytes sent."""
        t = self._connection()
        wire.send(t, wire.STATUS, {})
        kind, fields, _ = wire.recv(t)
        self._give_back(t)
        if kind != wire.STATUS_REPLY:
            raise ProtocolError(f"expected STATUS_REPLY, got {wire.NAMES[kind]}")
        return fields

    def __repr__(self) -> str:
        return f"ScanClient({self.address!r})"


def _native_client(store: Any) -> Any:
    """The native connection of a ferroplasma ``Client`` (the receiver lands
    batches through it, from Rust), or None for any other store client."""
    from .._native import NativeClient

    native = getattr(store, "_native", None)
    return native if isinstance(native, NativeClient) else None


def typed_error(e: Exception) -> Exception:
    """The ``ferroplasma.errors`` exception a pyarrow error names (a scan
    error that crossed the Arrow C stream), else ``e`` itself."""
    from .. import errors

    m = _CLASS_IN_MESSAGE.search(str(e))
    if m is None:
        return e
    return getattr(errors, m.group(1))(m.group(2))


class Scan:
    """One open scan: iterate it for its batches (``pyarrow.RecordBatch``
    around the received buffers), or their ObjectIDs when it lands in a
    store. Batches are asked for ahead of the consumer (two requests in
    flight); over TCP without a store, a native thread receives them while
    the previous ones are consumed."""

    def __init__(
        self,
        owner: ScanClient,
        t: Transport,
        scan: int,
        schema: Any,
        store: Any,
        via_store: bool,
        native: bool = False,
    ):
        self.owner = owner
        self.t = t
        self.scan = scan
        self.schema = schema  #: the result's ``pyarrow.Schema``
        self.via_store = via_store  #: True: the server placed the batches in the store
        self.schema_bytes = schema.serialize().to_pybytes()
        self.store = store
        self._can_go_native = native
        self._native: Any = None  # the receiver, once batches are asked for
        self._iter: Iterator[Any] | None = None
        self._done = False
        self._seal_late = False  # see ScanClient.query
        self._unsealed: list[ObjectID] = []
        # Batches the server places in the store: requests unanswered and ids
        # received, so that those lost on their way can be deleted.
        self._probe: ObjectID | None = None
        self._in_flight = 0  # ITERATEs sent and not yet answered with DONE
        self._ids_seen = 0

    def __iter__(self) -> Iterator[Any]:
        if self._iter is None:
            self._iter = self._run_native() if self._start_native() else self._run()
        return self._iter

    def _start_native(self) -> bool:
        """Hands the connection to a native receiver, which starts asking
        for batches (TCP without a store only): True if it did."""
        if not self._can_go_native or self._done:
            return False
        from .._native import NativeScanReceiver

        self._can_go_native = False
        # From here the receiver owns the connection (it is not pooled).
        store = None if self.store is None else _native_client(self.store)
        self._native = NativeScanReceiver(
            self.t.detach(),
            self.scan,
            self.schema,
            _IN_FLIGHT,
            _PER_ITERATE,
            _ITERATE_BYTES,
            _QUEUE,
            store=store,
            schema_ipc=self.schema_bytes if store is not None else None,
            seal_late=self._seal_late,
        )
        return True

    def reader(self) -> Any:
        """The batches as a ``pyarrow.RecordBatchReader``. Over TCP without
        a store it reads the native receiver through the Arrow C stream, with
        no Python per batch; an error in mid-scan then surfaces as pyarrow's
        ``ArrowInvalid`` or ``OSError``, its message starting with the
        ``ferroplasma.errors`` class name (:func:`typed_error` maps it back;
        :meth:`ScanClient.to_table` and iterating the scan raise it typed)."""
        import pyarrow as pa

        if self._iter is None and self._start_native():
            self._done = True
            return pa.RecordBatchReader.from_stream(self._native)
        return pa.RecordBatchReader.from_batches(self.schema, iter(self))

    def close(self) -> None:
        """Ends the scan; the server frees it. Batches already received
        stay valid."""
        if self._iter is not None:
            self._iter.close()  # type: ignore[attr-defined]  (runs _run's finally)
        if self._native is not None:
            self._done = True
            self._native.close()  # drops the connection unless the scan ended
            return
        if not self._done:  # never started
            self._done = True
            try:
                wire.send(self.t, wire.FINALIZE, {"scan": self.scan})
                self._until_finalized()
                self.owner._give_back(self.t)
            except (OSError, ProtocolError):
                self.t.close()

    def __enter__(self) -> Scan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> Iterator[Any]:
        t = self.t
        in_flight = 0
        more = True
        clean = False
        try:
            for _ in range(_IN_FLIGHT):
                self._ask()
                in_flight += 1
            while in_flight:
                kind, f, body_len = wire.recv(t)
                if kind == wire.BATCH:
                    yield self._batch(f, body_len)
                elif kind == wire.BATCH_IPC:
                    yield self._ipc_batch(body_len)
                elif kind == wire.IDS:
                    self._ids_seen += 1
                    yield ObjectID.from_hex(f["id"])
                elif kind == wire.DONE:
                    in_flight -= 1
                    self._in_flight -= 1
                    more = more and bool(f.get("more"))
                    if more:
                        self._ask()
                        in_flight += 1
                elif kind == wire.ERROR:
                    _raise(f)
                else:
                    raise ProtocolError(f"unexpected {wire.NAMES[kind]} during a scan")
            wire.send(t, wire.FINALIZE, {"scan": self.scan})
            self._until_finalized()
            clean = True
            for oid in self._unsealed:
                serialization.seal_batch_object(self.store, oid)
            self._unsealed = []
        except GeneratorExit:
            # Closed early. Ids in flight are cheap to drain, and their
            # objects must not stay in the store unowned; batches in flight
            # may be large, so the connection is dropped instead.
            clean = self.via_store and self._finalize_draining_ids()
            raise
        except OSError as e:
            raise ScanServerUnavailable(f"scan server {self.owner.address} hung up: {e}") from None
        finally:
            self._done = True
            for oid in self._unsealed:  # the scan failed: nothing half done stays
                with contextlib.suppress(FerroplasmaError):
                    self.store.abort(oid)
            self._unsealed = []
            if not clean and self.via_store:
                self._delete_unreceived()
            if clean:
                self.owner._give_back(t)
            else:
                # The connection's state is unknown: close it; the server
                # frees the scan (and what it placed but never sent).
                t.close()

    def _run_native(self) -> Iterator[Any]:
        import pyarrow as pa

        try:
            if self.store is not None:  # landed in the store: their ids
                while (oid := self._native.next_id()) is not None:
                    yield ObjectID(oid)
            while (got := self._native.next_batch()) is not None:
                yield pa.RecordBatch._import_from_c_capsule(*got)
        finally:
            self._done = True
            self._native.close()

    def _delete_unreceived(self) -> None:
        """Deletes the batches the server may have placed and sent but whose
        ids never arrived (a server that died with them on the wire): every
        batch number asked for beyond those received. Those the server never
        sealed went with it."""
        if self._probe is None or not self._in_flight:
            return
        from .result import batch_ids

        # Only ITERATEs still unanswered can have sent ids that never came.
        last = self._ids_seen + self._in_flight * _PER_ITERATE
        names = itertools.islice(batch_ids(self._probe), self._ids_seen, last)
        with contextlib.suppress(Exception):
            self.store.delete(list(names))

    def _ask(self) -> None:
        self._in_flight += 1
        wire.send(
            self.t,
            wire.ITERATE,
            {"scan": self.scan, "batches": _PER_ITERATE, "bytes": _ITERATE_BYTES},
        )

    def _finalize_draining_ids(self) -> bool:
        try:
            wire.send(self.t, wire.FINALIZE, {"scan": self.scan})
            unread = self._until_finalized()
            if unread:
                self.store.delete(unread)
            return True
        except (OSError, FerroplasmaError):
            return False

    def _until_finalized(self) -> list[ObjectID]:
        """Reads up to FINALIZED, dropping batches; the ids it passed."""
        ids = []
        while True:
            kind, f, body_len = wire.recv(self.t)
            if kind == wire.FINALIZED:
                return ids
            if kind == wire.IDS:
                ids.append(ObjectID.from_hex(f["id"]))
            wire.skip(self.t, body_len)

    def _batch(self, f: dict[str, Any], body_len: int) -> Any:
        import pyarrow as pa

        desc = f["desc"]
        sizes = arrow_layout.sizes(desc)
        if sum(sizes) != body_len:
            raise ProtocolError("a batch's body does not match its descriptor")
        if self.store is not None:
            return self._batch_into_store(f["rows"], desc)
        offsets, end = arrow_layout.place(sizes)
        region = pa.allocate_buffer(end)  # 64-byte aligned
        mv = memoryview(region).cast("B")
        self.t.recv_into([mv[o : o + s] for o, s in zip(offsets, sizes)])
        parts = [region.slice(o, s) for o, s in zip(offsets, sizes)]
        return arrow_layout.rebuild(self.schema, f["rows"], desc, parts)

    def _batch_into_store(self, rows: int, desc: list[int]) -> ObjectID:
        oid, _ = serialization.put_batch_object(
            self.store, self.schema_bytes, rows, desc, self.t.recv_into, seal=not self._seal_late
        )
        if self._seal_late:
            self._unsealed.append(oid)
        return oid

    def _ipc_batch(self, body_len: int) -> Any:
        import pyarrow as pa

        region = pa.allocate_buffer(body_len)
        self.t.recv_into([memoryview(region).cast("B")])
        return pa.ipc.read_record_batch(region, self.schema)


def connect(address: str, token: str | None = None, timeout: float | None = 30.0) -> ScanClient:
    """Connects to the scan server at ``address`` (``"host:port"``).

    >>> scan = fp.scan.connect("10.0.0.5:7700")                       # doctest: +SKIP
    >>> scan.query("SELECT * FROM dataset LIMIT 5", "lineitem").read_all()  # doctest: +SKIP
    """
    return ScanClient(address, token, timeout)
