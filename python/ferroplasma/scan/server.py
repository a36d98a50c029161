"""The scan server: runs SQL on the datasets under a root with DuckDB and
streams the result batches, buffer by buffer, to its clients.

One thread (the gate, ``gate.py``) accepts connections and reads their
HELLOs, under a deadline and caps, so that strangers cost no thread; each
authenticated connection then gets a thread of its own, and may hold several
scans. A scan's batches are sent as DuckDB produced them: the frame's
descriptor, then every Arrow buffer of every column in one gather send (see
``wire.py``). When the client shares this host's store (it proves it with a
probe object only that store holds), batches go into the store instead and
only their ids travel.
A connection that breaks takes its scans with it; errors in one request
(wrongly typed fields included) are answered with an ERROR frame and the
connection carries on.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import itertools
import logging
import math
import socket
import threading
import time
from pathlib import Path
from typing import Any

from .. import arrow_layout
from .._ids import ObjectID
from .._optional import require
from ..errors import AccessDenied, FerroplasmaError, ProtocolError, QueryError, ScanError
from . import engine, wire
from .gate import Gate, HelloAnswer, RefusalLog
from .result import Scan as _Scan
from .result import Stored as _Stored
from .result import batch_ids
from .transport import TcpTransport, Transport, parse_address

__all__ = ["DEFAULT_BATCH_ROWS", "ScanServer", "batch_ids"]

log = logging.getLogger("ferroplasma.scan")

DEFAULT_BATCH_ROWS = 1 << 20
MAX_BATCH_ROWS = 1 << 24
_CODES = {
    AccessDenied: "access",
    engine.DatasetNotFound: "dataset",
    QueryError: "query",
    ProtocolError: "protocol",
}


_JSON_TYPES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    bool: "true or false",
    int: "an integer",
    float: "a number",
}


def _code(e: Exception) -> str:
    for cls, code in _CODES.items():
        if isinstance(e, cls):
            return code
    return "scan"


def _typed(f: dict[str, Any], name: str, want: type, request: str) -> Any:
    """Field ``name`` of a ``request``: None (absent or null) or of JSON
    type ``want`` (true is not an integer here); ProtocolError otherwise."""
    value = f.get(name)
    if value is None or type(value) is want:
        return value
    got = _JSON_TYPES.get(type(value), type(value).__name__)
    raise ProtocolError(f"{request}'s {name!r} must be {_JSON_TYPES[want]}, not {got}")


def _brief(value: Any) -> str:
    """A client's value for an error message: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_loopback(host: str) -> bool:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def _positive_int(name: str, value: Any) -> int:
    if type(value) is not int or value < 1:
        raise ValueError(f"{name} must be a positive whole number, not {value!r}")
    return value


class ScanServer:
    """Serves the datasets under ``root`` on ``listen`` (``"host:port"``;
    port 0 picks a free one, see :attr:`address`).

    ``token``: clients must present it (compared in constant time).
    ``store_socket``: the local store to place batches in for clients on
    this host (None: never). ``threads``: DuckDB threads per scan (1 to
    ``engine.MAX_THREADS``; None: every core).

    Strangers: a connection must send its HELLO within ``hello_timeout``
    seconds; at most ``max_pending`` connections may be waiting to, and at
    most ``max_connections`` be open in all; beyond a cap a connection is
    closed at once. Refusals are logged at most once per kind every
    ``refusal_log_interval`` seconds, with a count of those left out. Bad
    values raise ValueError (an unusable ``listen``: ValueError or OSError).
    Listening beyond loopback without a token logs a warning.

    ``ucx_listen`` (``"[ucx://]HOST:PORT"``): also serve over UCX (see
    :attr:`ucx_address`). The binding listens on every interface whatever
    HOST says, so it needs a ``token`` (ValueError without one).
    """

    def __init__(
        self,
        listen: str,
        root: str | Path,
        token: str | None = None,
        store_socket: str | None = None,
        threads: int | None = None,
        *,
        hello_timeout: float = 3.0,
        max_pending: int = 64,
        max_connections: int = 256,
        refusal_log_interval: float = 10.0,
        ucx_listen: str | None = None,
    ) -> None:
        require("the scan server", "scan", "duckdb", "pyarrow")
        if not engine.valid_threads(threads):
            raise ValueError(
                f"threads must be a whole number from 1 to {engine.MAX_THREADS} (or None for "
                f"every core), not {threads!r}"
            )
        for name, value in (
            ("hello_timeout", hello_timeout),
            ("refusal_log_interval", refusal_log_interval),
        ):
            if type(value) not in (int, float) or not (0 < value < math.inf):
                raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
        _positive_int("max_pending", max_pending)
        _positive_int("max_connections", max_connections)
        if not str(root):
            raise ValueError("the scan root is empty: name a directory")
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"scan root {str(root)!r} is not a directory")
        self.token = token or ""
        self.store_socket = store_socket
        self.threads = threads
        host, port = parse_address(listen)
        try:
            self._sock = socket.create_server((host, port), reuse_port=False, backlog=128)
        except OSError as e:
            raise OSError(f"cannot listen on {listen!r}: {e.strerror or e}") from e
        except (ValueError, TypeError) as e:  # e.g. a NUL in the host name
            raise ValueError(f"cannot listen on {listen!r}: {e}") from None
        self.address = "{}:{}".format(*self._sock.getsockname()[:2])
        if not self.token and not _is_loopback(self._sock.getsockname()[0]):
            log.warning(
                "the scan server listens on %s without a token: anyone who can reach it can "
                "query every dataset under %s. Give it a token (--token-file or "
                "$FERROPLASMA_SCAN_TOKEN) or listen on 127.0.0.1",
                self.address,
                self.root,
            )
        self._refusals = RefusalLog(refusal_log_interval)
        self._spares = engine.Spares()  # a DuckDB database ready for the next scan
        self._gate = Gate(
            self._sock,
            check_hello=self._check_hello,
            admit=self._admit,
            active=lambda: len(self._connections),
            hello_timeout=float(hello_timeout),
            max_pending=max_pending,
            max_connections=max_connections,
            refusals=self._refusals,
        )
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._open_scans = 0
        self._connections: set[Transport] = set()
        self._serving: set[threading.Thread] = set()
        self._running: set[_Scan] = set()  # open scans, to interrupt on close
        self._batches_sent = 0
        self._bytes_sent = 0
        self._store_batches = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._hello_timeout = float(hello_timeout)
        self._max_connections = max_connections
        self._ucx: Any = None
        #: ``ucx://HOST:PORT`` when also serving over UCX (``ucx_listen``).
        self.ucx_address: str | None = None
        if ucx_listen is not None:
            try:
                self._listen_ucx(ucx_listen, host)
            except Exception as e:
                self._gate.stop()  # never ran: its wake-up pair closes
                self._sock.close()
                if isinstance(e, (OSError, ValueError)):
                    raise
                raise OSError(f"cannot listen on UCX {ucx_listen!r}: {e}") from None

    # ------------------------------------------------------------ lifecycle

    def serve_forever(self) -> None:
        """Accepts connections until :meth:`close` (see ``gate.py``)."""
        self._spares.prime()  # the first scan's database, made meanwhile
        self._gate.run()

    def _admit(self, sock: socket.socket, peer: str) -> None:
        """Serves a connection whose HELLO was accepted, in its own thread."""
        t = TcpTransport(sock)
        with self._lock:
            if self._closed:
                t.close()
                return
            self._connections.add(t)
        th = threading.Thread(
            target=self._serve_connection, args=(t, peer), daemon=True, name=f"scan {peer}"
        )
        with self._lock:
            self._serving.add(th)  # here, so that close() joins it however early
        try:
            th.start()
        except RuntimeError as e:  # the system has no thread to give
            with self._lock:
                self._connections.discard(t)
                self._serving.discard(th)
            t.close()
            self._refusals("thread", peer, f"no thread to serve it: {e}")

    def _listen_ucx(self, listen: str, tcp_host: str) -> None:
        from . import ucx

        if listen.startswith(ucx.SCHEME):
            listen = listen[len(ucx.SCHEME) :]
        host, port = parse_address(listen)
        if not self.token:
            # The binding takes a port only: it listens on every interface,
            # whatever host was asked for.
            raise ValueError(
                f"--ucx-listen {listen!r} needs a token: the UCX binding listens on every "
                "interface whatever the host, so without one anyone who can reach this "
                "machine could query every dataset under the root. Give the server a token "
                "(--token-file or $FERROPLASMA_SCAN_TOKEN) and its clients token=..."
            )
        if not ucx.available():
            raise ValueError(
                f"--ucx-listen {listen!r} needs the UCX binding: pip install ucxx-cu12"
            )
        self._ucx = ucx.UcxListener(port, self._admit_ucx)
        shown = tcp_host if host in ("", "0.0.0.0", "::") else host
        self.ucx_address = f"{ucx.SCHEME}{shown}:{self._ucx.port}"

    def _admit_ucx(self, t: Any) -> None:
        """A UCX connection, in its own thread: its HELLO within the
        deadline, then served like a TCP one (the connection cap counts it)."""
        with self._lock:
            full = self._closed or len(self._connections) >= self._max_connections
            if not full:
                self._connections.add(t)
        if full:
            self._refusals("connection cap", t.peer, "a UCX connection beyond the cap")
            with contextlib.suppress(OSError):
                wire.send(t, wire.ERROR, {"code": "busy", "message": "the scan server is busy"})
            t.close()
            return
        served = False
        try:
            if self._ucx_hello(t):
                served = True
                self._serve_connection(t, t.peer)  # forgets and closes it at the end
        finally:
            if not served:
                with self._lock:
                    self._connections.discard(t)
                t.close()

    def _ucx_hello(self, t: Any) -> bool:
        """Reads and answers a UCX connection's HELLO: True if accepted."""
        t.deadline = time.monotonic() + self._hello_timeout
        try:
            kind, fields, body_len = wire.recv(t)
        except (OSError, ProtocolError) as e:
            self._refusals("hello", t.peer, f"no HELLO within the deadline ({e})")
            return False
        if kind != wire.HELLO or body_len:
            self._refusals("hello", t.peer, "not a scan client (its first frame is no HELLO)")
            return False
        reply_kind, reply, refusal = self._check_hello(fields)
        if refusal is not None:
            self._refusals(refusal[0], t.peer, refusal[1])
        try:
            wire.send(t, reply_kind, reply)
        except OSError:
            return False
        t.deadline = None
        return refusal is None

    def start(self) -> ScanServer:
        """Serves in a background thread (for tests and embedding)."""
        self._spares.prime()  # the first scan's database, made from now on
        self._thread = threading.Thread(target=self.serve_forever, daemon=True, name="scan-accept")
        self._thread.start()
        return self

    def close(self) -> None:
        """Stops accepting and drops every connection (their scans end)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._gate.stop()
        self._sock.close()
        if self._ucx is not None:
            self._ucx.close()
        self._refusals.flush()
        with self._lock:
            conns = list(self._connections)
            serving = list(self._serving)
            running = list(self._running)
        for scan in running:  # a long query holds its thread in DuckDB
            scan.interrupt()
        for t in conns:
            t.close()
        # Their threads end their scans (DuckDB and the native producer
        # threads with them) before this returns: an interpreter that exits
        # meanwhile would end a thread inside DuckDB or Rust, and abort.
        deadline = time.monotonic() + 10.0
        for th in serving:
            if th is not threading.current_thread():
                th.join(max(0.0, deadline - time.monotonic()))
        self._spares.close()

    def __enter__(self) -> ScanServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def status(self) -> dict[str, int]:
        """Open scans, authenticated connections and connections still to
        send their HELLO; batches and bytes sent so far, and how many of
        those batches went through the local store."""
        with self._lock:
            return {
                "scans": self._open_scans,
                "connections": len(self._connections),
                "unauthenticated": self._gate.pending,
                "batches_sent": self._batches_sent,
                "bytes_sent": self._bytes_sent,
                "store_batches": self._store_batches,
            }

    # ------------------------------------------------------------ one connection

    def _serve_connection(self, t: Transport, peer: str) -> None:
        scans: dict[int, _Scan] = {}
        store: list[Any] = []  # the store client, connected on first use
        with self._lock:
            self._serving.add(threading.current_thread())  # a UCX one comes here
        try:
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
                try:
                    s.close(finalized=False)
                except Exception:  # one scan's failure must not keep the rest open
                    log.exception("scan client %s: closing a scan failed", peer)
            with self._lock:
                self._open_scans -= len(scans)
                self._running.difference_update(scans.values())
                self._connections.discard(t)
                self._serving.discard(threading.current_thread())
            t.close()

    def _check_hello(self, fields: dict[str, Any]) -> HelloAnswer:
        """The answer to a HELLO (the gate sends it): READY, or ERROR and
        the refusal to log."""
        version = fields.get("version")
        if type(version) is not int or version != wire.VERSION:
            why = (
                f"scan protocol version {_brief(version)} is not {wire.VERSION}: use the "
                "same ferroplasma version on both sides"
            )
            return wire.ERROR, {"code": "protocol", "message": why}, ("version", why)
        try:
            token = _typed(fields, "token", str, "HELLO") or ""
        except ProtocolError as e:
            return wire.ERROR, {"code": "protocol", "message": str(e)}, ("hello", str(e))
        # surrogatepass: any str a JSON string or argv holds encodes.
        given = token.encode("utf-8", "surrogatepass")
        if not hmac.compare_digest(given, self.token.encode("utf-8", "surrogatepass")):
            if not self.token:
                why = (
                    "this scan server takes no token (it was started without --token): "
                    "connect without one"
                )
                logged = "it gave a token, and this server has none"
            elif not given:
                why = "this scan server needs a token: connect with token=... (its --token)"
                logged = "no token"
            else:
                why = logged = "wrong scan token"
            return wire.ERROR, {"code": "auth", "message": why}, ("token", logged)
        return wire.READY, {"version": wire.VERSION}, None

    def _request(
        self, t: Transport, kind: int, f: dict[str, Any], scans: dict[int, _Scan], store: list
    ) -> None:
        if kind == wire.INIT_SCAN:
            self._init_scan(t, f, scans, store)
        elif kind == wire.ITERATE:
            scan_id = _typed(f, "scan", int, "ITERATE")
            n = _typed(f, "batches", int, "ITERATE")
            budget = _typed(f, "bytes", int, "ITERATE")
            scan = None if scan_id is None else scans.get(scan_id)
            if scan_id is None or scan is None:
                raise ScanError(f"no open scan {scan_id} on this connection")
            self._iterate(t, scan_id, scan, 1 if n is None else n, budget)
        elif kind == wire.FINALIZE:
            scan_id = _typed(f, "scan", int, "FINALIZE")
            scan = None if scan_id is None else scans.pop(scan_id, None)
            if scan is not None:
                with self._lock:
                    self._open_scans -= 1
                    self._running.discard(scan)
            if scan is not None and scan.via_store:
                scan.close(finalized=True)  # what it placed and never sent goes first
                scan = None
            try:
                wire.send(t, wire.FINALIZED, {"scan": scan_id})
            finally:
                # Closing DuckDB's database takes milliseconds: after the
                # answer, off the client's path (this connection's next
                # request waits for it); closed even if the answer failed.
                if scan is not None:
                    try:
                        scan.close(finalized=True)
                    except Exception:  # answered already: log it, keep serving
                        log.exception("closing a finalized scan failed")
        elif kind == wire.STATUS:
            wire.send(t, wire.STATUS_REPLY, self.status())
        else:
            raise ProtocolError(f"unexpected {wire.NAMES[kind]} frame from a client")

    def _init_scan(self, t: Any, f: dict[str, Any], scans: dict, store: list) -> None:
        sql = _typed(f, "sql", str, "INIT_SCAN")
        dataset = _typed(f, "dataset", str, "INIT_SCAN")
        rows = _typed(f, "batch_rows", int, "INIT_SCAN")
        materialize = _typed(f, "materialize", bool, "INIT_SCAN")
        wire_mode = _typed(f, "wire", str, "INIT_SCAN")
        probe = _typed(f, "store_probe", str, "INIT_SCAN")
        rows = DEFAULT_BATCH_ROWS if rows is None else rows
        if not 0 < rows <= MAX_BATCH_ROWS:
            raise QueryError(f"batch_rows must be between 1 and {MAX_BATCH_ROWS}")
        wire_mode = "buffers" if wire_mode is None else wire_mode
        if wire_mode not in ("buffers", "ipc"):
            raise QueryError(f"unknown wire format {_brief(wire_mode)} (buffers or ipc)")
        via_store = self._shares_store(probe, store)
        ds = engine.resolve(self.root, dataset)  # type: ignore[arg-type]
        con, rel = engine.open_query(ds, sql, self.threads, self._spares)  # type: ignore[arg-type]
        try:
            scan = _Scan(
                con,
                rel,
                rows,
                bool(materialize),
                wire_mode,
                store[0] if via_store else None,
                batch_ids(ObjectID.from_hex(probe)) if via_store and probe else None,
                native=isinstance(t, TcpTransport),
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
            self._running.add(scan)
        wire.send(
            t, wire.SCAN, {"scan": scan_id, "via_store": via_store}, [scan.schema.serialize()]
        )

    def _shares_store(self, probe: str | None, store: list) -> bool:
        """True if the client's store is ours: it holds the probe object
        the client just made (a random id nobody else knows)."""
        if not probe or self.store_socket is None:
            return False
        try:
            if not store:
                from ..client import Client

                store.append(Client(self.store_socket))
            return bool(store[0].contains(ObjectID.from_hex(probe)))
        except (FerroplasmaError, ValueError, OSError):
            return False

    def _iterate(self, t: Any, scan_id: int, scan: _Scan, n: Any, budget: Any) -> None:
        """Sends up to ``n`` batches, stopping early once ``budget`` bytes
        (if given) went out, then DONE."""
        if not isinstance(n, int) or n < 1:
            raise ProtocolError("ITERATE asks for at least one batch")
        if budget is not None and (not isinstance(budget, int) or budget < 1):
            raise ProtocolError("ITERATE's byte budget must be a positive integer")
        if scan.native is not None:
            sent, sent_bytes, more = scan.native.send(t.fileno(), scan_id, n, budget)
        else:
            sent, sent_bytes, more = self._iterate_here(t, scan_id, scan, n, budget)
        wire.send(t, wire.DONE, {"scan": scan_id, "more": more})
        with self._lock:
            self._batches_sent += sent
            self._bytes_sent += sent_bytes
            if scan.via_store:
                self._store_batches += sent

    @staticmethod
    def _iterate_here(
        t: Transport, scan_id: int, scan: _Scan, n: int, budget: int | None
    ) -> tuple[int, int, bool]:
        """Sends up to ``n`` batches of a scan produced in Python (the IPC
        baseline, ids of batches in the store, or buffers over UCX):
        (batches, bytes, more)."""
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
                scan.announce(batch)
                wire.send(t, wire.IDS, {"scan": scan_id, "id": batch.id.hex(), "rows": batch.rows})
            elif scan.wire == "ipc":
                msg = batch.serialize()  # the baseline: one contiguous copy
                nbytes = msg.size
                wire.send(t, wire.BATCH_IPC, {"scan": scan_id}, [msg])
            else:  # buffers over a transport the native path does not drive
                desc, bufs = arrow_layout.flatten(batch)
                nbytes = sum(b.size for b in bufs)
                wire.send(
                    t, wire.BATCH, {"scan": scan_id, "rows": batch.num_rows, "desc": desc}, bufs
                )
            sent += 1
            sent_bytes += nbytes
        return sent, sent_bytes, more
