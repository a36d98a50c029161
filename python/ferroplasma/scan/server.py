"""The scan server: runs SQL on the datasets under a root with DuckDB and
streams the result batches, buffer by buffer, to its clients.

One thread per connection; a connection may hold several scans. A scan's
batches are sent as DuckDB produced them: the frame's descriptor, then every
Arrow buffer of every column in one gather send (see ``wire.py``). When the
client shares this host's store (it proves it with a probe object only that
store holds), batches go into the store instead and only their ids travel.
A connection that breaks takes its scans with it; errors in one request are
answered with an ERROR frame and the connection carries on.
"""

from __future__ import annotations

import collections
import contextlib
import hmac
import itertools
import logging
import socket
import threading
from pathlib import Path
from typing import Any

from .. import arrow_layout, serialization
from .._ids import ObjectID
from .._optional import require
from ..errors import AccessDenied, FerroplasmaError, ProtocolError, QueryError, ScanError
from . import engine, wire
from .transport import TcpTransport, Transport, parse_address

__all__ = ["DEFAULT_BATCH_ROWS", "ScanServer"]

log = logging.getLogger("ferroplasma.scan")

DEFAULT_BATCH_ROWS = 1 << 20
MAX_BATCH_ROWS = 1 << 24
_CODES = {
    AccessDenied: "access",
    engine.DatasetNotFound: "dataset",
    QueryError: "query",
    ProtocolError: "protocol",
}


def _code(e: Exception) -> str:
    for cls, code in _CODES.items():
        if isinstance(e, cls):
            return code
    return "scan"


class _Stored:
    """A batch the server placed in the local store."""

    __slots__ = ("id", "nbytes", "rows")

    def __init__(self, oid: ObjectID, rows: int, nbytes: int) -> None:
        self.id, self.rows, self.nbytes = oid, rows, nbytes


class _Scan:
    """One query's result, batch by batch: RecordBatches, or (for a client
    sharing this host's store) batches already placed in the store.
    ``materialize`` runs the query to the end first (placing every batch in
    the store, when it goes there)."""

    def __init__(
        self, con: Any, rel: Any, batch_rows: int, materialize: bool, wire: str, store: Any
    ) -> None:
        self.con = con
        self.wire = wire
        self.store = store
        self._reader = rel.to_arrow_reader(batch_rows)
        self.schema = self._reader.schema
        self._ready: collections.deque = collections.deque()
        if materialize:
            while (item := self._produce()) is not None:
                self._ready.append(item)
            self._reader = None

    @property
    def via_store(self) -> bool:
        return self.store is not None

    def _produce(self) -> Any:
        if self._reader is None:
            return None
        try:
            batch = self._reader.read_next_batch()
        except StopIteration:
            return None
        if self.store is None:
            return batch
        oid, nbytes = _put_batch(self.store, batch)
        return _Stored(oid, batch.num_rows, nbytes)

    def next(self) -> Any:
        """The next batch (or _Stored), or None at the end."""
        return self._ready.popleft() if self._ready else self._produce()

    def close(self) -> None:
        unsent = [item.id for item in self._ready if isinstance(item, _Stored)]
        self._ready.clear()
        if unsent:
            with contextlib.suppress(FerroplasmaError):
                self.store.delete(unsent)
        self._reader = None
        self.con.close()


class ScanServer:
    """Serves the datasets under ``root`` on ``listen`` (``"host:port"``;
    port 0 picks a free one, see :attr:`address`).

    ``token``: clients must present it (compared in constant time).
    ``store_socket``: the local store to place batches in for clients on
    this host (None: never). ``threads``: DuckDB threads per scan.
    """

    def __init__(
        self,
        listen: str,
        root: str | Path,
        token: str | None = None,
        store_socket: str | None = None,
        threads: int | None = None,
    ) -> None:
        require("the scan server", "scan", "duckdb", "pyarrow")
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"scan root {root} is not a directory")
        self.token = token or ""
        self.store_socket = store_socket
        self.threads = threads
        host, port = parse_address(listen)
        self._sock = socket.create_server((host, port), reuse_port=False, backlog=128)
        self.address = "{}:{}".format(*self._sock.getsockname()[:2])
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._open_scans = 0
        self._connections: set[Transport] = set()
        self._batches_sent = 0
        self._bytes_sent = 0
        self._store_batches = 0
        self._closed = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle

    def serve_forever(self) -> None:
        """Accepts connections until :meth:`close`."""
        while not self._closed:
            try:
                conn, peer = self._sock.accept()
            except OSError:
                if self._closed:
                    return
                raise
            t = TcpTransport(conn)
            with self._lock:
                self._connections.add(t)
            threading.Thread(
                target=self._serve_connection, args=(t, peer), daemon=True, name=f"scan {peer}"
            ).start()

    def start(self) -> ScanServer:
        """Serves in a background thread (for tests and embedding)."""
        self._thread = threading.Thread(target=self.serve_forever, daemon=True, name="scan-accept")
        self._thread.start()
        return self

    def close(self) -> None:
        """Stops accepting and drops every connection (their scans end)."""
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        with self._lock:
            conns = list(self._connections)
        for t in conns:
            t.close()

    def __enter__(self) -> ScanServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def status(self) -> dict[str, int]:
        """Open scans and connections; batches and bytes sent so far, and
        how many of those batches went through the local store."""
        with self._lock:
            return {
                "scans": self._open_scans,
                "connections": len(self._connections),
                "batches_sent": self._batches_sent,
                "bytes_sent": self._bytes_sent,
                "store_batches": self._store_batches,
            }

    # ------------------------------------------------------------ one connection

    def _serve_connection(self, t: Transport, peer: Any) -> None:
        scans: dict[int, _Scan] = {}
        store: list[Any] = []  # the store client, connected on first use
        try:
            if self._hello(t):
                while True:
                    kind, fields, body_len = wire.recv(t)
                    if body_len:
                        raise ProtocolError("clients send no frame bodies")
                    try:
                        self._request(t, kind, fields, scans, store)
                    except FerroplasmaError as e:  # ScanError, ProtocolError, StoreFull, ...
                        wire.send(t, wire.ERROR, {"code": _code(e), "message": str(e)})
        except (ConnectionError, OSError):
            pass  # the client went away: its scans end below
        except ProtocolError as e:
            log.warning("scan client %s: %s; closing its connection", peer, e)
            try:
                wire.send(t, wire.ERROR, {"code": "protocol", "message": str(e)})
            except OSError:
                pass
        except Exception:
            log.exception("scan client %s: unexpected error; closing its connection", peer)
        finally:
            for s in scans.values():
                s.close()
            with self._lock:
                self._open_scans -= len(scans)
                self._connections.discard(t)
            t.close()

    def _hello(self, t: Transport) -> bool:
        kind, fields, body_len = wire.recv(t)
        if kind != wire.HELLO or body_len:
            raise ProtocolError("a connection starts with HELLO")
        if fields.get("version") != wire.VERSION:
            wire.send(
                t,
                wire.ERROR,
                {
                    "code": "protocol",
                    "message": f"scan protocol version {fields.get('version')} is not "
                    f"{wire.VERSION}: use the same ferroplasma version on both sides",
                },
            )
            return False
        given = str(fields.get("token") or "").encode()
        if not hmac.compare_digest(given, self.token.encode()):
            if not self.token:
                why = (
                    "this scan server takes no token (it was started without --token): "
                    "connect without one"
                )
            elif not given:
                why = "this scan server needs a token: connect with token=... (its --token)"
            else:
                why = "wrong scan token"
            wire.send(t, wire.ERROR, {"code": "auth", "message": why})
            return False
        wire.send(t, wire.READY, {"version": wire.VERSION})
        return True

    def _request(
        self, t: Transport, kind: int, f: dict[str, Any], scans: dict[int, _Scan], store: list
    ) -> None:
        if kind == wire.INIT_SCAN:
            self._init_scan(t, f, scans, store)
        elif kind == wire.ITERATE:
            scan_id = f.get("scan")
            scan = scans.get(scan_id)  # type: ignore[arg-type]
            if scan is None:
                raise ScanError(f"no open scan {scan_id} on this connection")
            self._iterate(t, scan_id, scan, f.get("batches", 1), f.get("bytes"))  # type: ignore[arg-type]
        elif kind == wire.FINALIZE:
            scan = scans.pop(f.get("scan"), None)  # type: ignore[arg-type]
            if scan is not None:
                scan.close()
                with self._lock:
                    self._open_scans -= 1
            wire.send(t, wire.FINALIZED, {"scan": f.get("scan")})
        elif kind == wire.STATUS:
            wire.send(t, wire.STATUS_REPLY, self.status())
        else:
            raise ProtocolError(f"unexpected {wire.NAMES[kind]} frame from a client")

    def _init_scan(self, t: Transport, f: dict[str, Any], scans: dict, store: list) -> None:
        rows = f.get("batch_rows")
        rows = DEFAULT_BATCH_ROWS if rows is None else rows
        if not isinstance(rows, int) or not 0 < rows <= MAX_BATCH_ROWS:
            raise QueryError(f"batch_rows must be between 1 and {MAX_BATCH_ROWS}")
        wire_mode = f.get("wire", "buffers")
        if wire_mode not in ("buffers", "ipc"):
            raise QueryError(f"unknown wire format {wire_mode!r} (buffers or ipc)")
        via_store = self._shares_store(f.get("store_probe"), store)
        ds = engine.resolve(self.root, f.get("dataset"))  # type: ignore[arg-type]
        con, rel = engine.open_query(ds, f.get("sql"), self.threads)  # type: ignore[arg-type]
        try:
            scan = _Scan(
                con,
                rel,
                rows,
                bool(f.get("materialize")),
                wire_mode,
                store[0] if via_store else None,
            )
        except FerroplasmaError:
            con.close()
            raise
        except Exception as e:
            con.close()
            raise QueryError(str(e)) from None
        scan_id = next(self._ids)
        scans[scan_id] = scan
        with self._lock:
            self._open_scans += 1
        wire.send(
            t, wire.SCAN, {"scan": scan_id, "via_store": via_store}, [scan.schema.serialize()]
        )

    def _shares_store(self, probe: Any, store: list) -> bool:
        """True if the client's store is ours: it holds the probe object
        the client just made (a random id nobody else knows)."""
        if not probe or self.store_socket is None:
            return False
        try:
            if not store:
                from ..client import Client

                store.append(Client(self.store_socket))
            return bool(store[0].contains(ObjectID.from_hex(probe)))
        except (FerroplasmaError, ValueError):
            return False

    def _iterate(self, t: Transport, scan_id: int, scan: _Scan, n: Any, budget: Any) -> None:
        """Sends up to ``n`` batches, stopping early once ``budget`` bytes
        (if given) went out, then DONE."""
        if not isinstance(n, int) or n < 1:
            raise ProtocolError("ITERATE asks for at least one batch")
        if budget is not None and (not isinstance(budget, int) or budget < 1):
            raise ProtocolError("ITERATE's byte budget must be a positive integer")
        sent_bytes = 0
        sent = 0
        more = True
        for _ in range(n):
            if budget is not None and sent_bytes >= budget:
                break
            try:
                batch = scan.next()
            except FerroplasmaError:
                raise  # e.g. StoreFull from the local store
            except Exception as e:  # DuckDB failed mid-query (e.g. a bad cast)
                raise QueryError(str(e)) from None
            if batch is None:
                more = False
                break
            if isinstance(batch, _Stored):
                nbytes = batch.nbytes
                wire.send(t, wire.IDS, {"scan": scan_id, "id": batch.id.hex(), "rows": batch.rows})
            elif scan.wire == "ipc":
                msg = batch.serialize()  # the baseline: one contiguous copy
                nbytes = msg.size
                wire.send(t, wire.BATCH_IPC, {"scan": scan_id}, [msg])
            else:
                desc, bufs = arrow_layout.flatten(batch)
                nbytes = sum(b.size for b in bufs)
                wire.send(
                    t, wire.BATCH, {"scan": scan_id, "rows": batch.num_rows, "desc": desc}, bufs
                )
            sent += 1
            sent_bytes += nbytes
        wire.send(t, wire.DONE, {"scan": scan_id, "more": more})
        with self._lock:
            self._batches_sent += sent
            self._bytes_sent += sent_bytes
            if scan.via_store:
                self._store_batches += sent


def _put_batch(client: Any, batch: Any) -> tuple[ObjectID, int]:
    """Writes ``batch`` into the store as a kind-3 object (one copy, from
    DuckDB's memory into shared memory)."""
    desc, bufs = arrow_layout.flatten(batch)

    def copy(views: list[memoryview]) -> None:
        for view, b in zip(views, bufs):
            view[:] = memoryview(b).cast("B")

    schema = batch.schema.serialize().to_pybytes()
    return serialization.put_batch_object(client, schema, batch.num_rows, desc, copy)
