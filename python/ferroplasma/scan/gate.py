"""The scan server's front door: one thread accepts every connection and
reads its HELLO, with no thread per connection, so that a stranger who
connects and says nothing costs a socket for a few seconds and nothing more.

A connection must send its whole HELLO within ``hello_timeout`` seconds of
being accepted; at most ``max_pending`` connections may be waiting to send
it, and at most ``max_connections`` may be open in all (waiting or
authenticated). A connection beyond a cap is closed at once (after a
best-effort ERROR frame, code ``busy``). Only a connection whose HELLO was
accepted is handed on, to a thread of its own. Every refusal goes to a
:class:`RefusalLog`: at most one line per kind and interval, and that line
counts the refusals it left out.
"""

from __future__ import annotations

import collections
import errno
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import ProtocolError
from . import wire

__all__ = ["Gate", "RefusalLog", "peer_name"]

log = logging.getLogger("ferroplasma.scan")

# accept() failures that concern one connection only: go on with the next.
_TRANSIENT = {errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.EINTR}
# Connections accepted per wake-up, so that a flood cannot starve the HELLOs.
_ACCEPT_BATCH = 64
_BUSY = {"code": "busy", "message": "the scan server is busy (too many connections): try later"}

#: ``check_hello``'s answer: the reply's kind and fields, and for a refusal
#: its kind (for the log) and what to log.
HelloAnswer = tuple[int, dict[str, Any], "tuple[str, str] | None"]


def peer_name(peer: Any) -> str:
    """``host:port`` of an accepted connection's peer address."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


class RefusalLog:
    """Logs refused connections: at most one line per kind every
    ``interval`` seconds, counting the refusals of that kind it left out
    since the previous line. Each record carries the kind in its
    ``refusal`` attribute."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._left_out: collections.Counter[str] = collections.Counter()

    def __call__(self, kind: str, peer: str, why: str) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self.interval:
                self._left_out[kind] += 1
                return
            self._last[kind] = now
            left_out = self._left_out.pop(kind, 0)
        more = (
            f" ({left_out} more refused for this reason in the last {now - last:.0f} s, not logged)"
            if left_out and last is not None
            else ""
        )
        log.warning(
            "refused a scan connection from %s: %s%s", peer, why, more, extra={"refusal": kind}
        )

    def flush(self) -> None:
        """Logs the refusals no line has counted yet (at shutdown)."""
        with self._lock:
            left_out, self._left_out = dict(self._left_out), collections.Counter()
        for kind, n in left_out.items():
            log.warning(
                "refused %d more scan connections (%s), not logged",
                n,
                kind,
                extra={"refusal": kind},
            )


class _Pending:
    """A connection that has not sent its whole HELLO yet."""

    __slots__ = ("buf", "deadline", "fields_len", "peer", "sock")

    def __init__(self, sock: socket.socket, peer: str, deadline: float) -> None:
        self.sock, self.peer, self.deadline = sock, peer, deadline
        self.buf = bytearray()
        self.fields_len = -1  # unknown until the head is in

    def want(self) -> int:
        """How many more bytes the HELLO needs (its head first)."""
        if self.fields_len < 0:
            return wire.HEAD.size - len(self.buf)
        return wire.HEAD.size + self.fields_len - len(self.buf)


class Gate:
    """Accepts connections on the listening ``sock`` and reads their HELLOs,
    all in the thread that calls :meth:`run`.

    ``check_hello(fields)`` answers a complete HELLO (see :data:`HelloAnswer`);
    ``admit(sock, peer)`` takes over a connection whose HELLO was accepted
    (a blocking socket, READY already sent); ``active()`` counts the admitted
    connections still open.
    """

    def __init__(
        self,
        sock: socket.socket,
        *,
        check_hello: Callable[[dict[str, Any]], HelloAnswer],
        admit: Callable[[socket.socket, str], None],
        active: Callable[[], int],
        hello_timeout: float,
        max_pending: int,
        max_connections: int,
        refusals: RefusalLog,
    ) -> None:
        self.sock = sock
        self.check_hello, self.admit, self.active = check_hello, admit, active
        self.hello_timeout = hello_timeout
        self.max_pending = max_pending
        self.max_connections = max_connections
        self.refusals = refusals
        self._pending: dict[socket.socket, _Pending] = {}  # in deadline order
        self._wake_r, self._wake_w = socket.socketpair()
        self._lock = threading.Lock()
        self._state = "new"  # then "running" and "stopped", or "stopped" at once
        self._stopped = threading.Event()
        self._runner: threading.Thread | None = None

    @property
    def pending(self) -> int:
        """Connections waiting to send their HELLO."""
        return len(self._pending)

    def run(self) -> None:
        """Accepts and reads HELLOs until :meth:`stop`."""
        with self._lock:
            if self._state != "new":
                return
            self._state = "running"
            self._runner = threading.current_thread()
        sel = selectors.DefaultSelector()
        try:
            self.sock.setblocking(False)
            sel.register(self.sock, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while self._state == "running":
                timeout = None
                if self._pending:
                    first = next(iter(self._pending.values()))
                    timeout = max(0.0, first.deadline - time.monotonic())
                for key, _ in sel.select(timeout):
                    if key.fileobj is self.sock:
                        self._accept(sel)
                    elif key.fileobj is self._wake_r:
                        self._wake_r.recv(64)
                    else:
                        self._advance(sel, key.data)
                self._expire(sel)
        finally:
            for p in self._pending.values():
                _close(p.sock)
            self._pending.clear()
            sel.close()
            self._wake_r.close()
            self._wake_w.close()
            self._stopped.set()

    def stop(self, wait: float = 5.0) -> None:
        """Stops :meth:`run` (waiting up to ``wait`` seconds for it to end);
        connections still waiting for their HELLO are closed."""
        with self._lock:
            was, self._state = self._state, "stopped"
        if was == "new":  # run never started, and now never will
            self._wake_r.close()
            self._wake_w.close()
        elif was == "running":
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass  # run is ending already
            if threading.current_thread() is not self._runner:
                self._stopped.wait(wait)

    # ------------------------------------------------------------ the loop's steps

    def _accept(self, sel: selectors.BaseSelector) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                conn, peer = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in _TRANSIENT:
                    continue
                if self._state != "running":
                    return
                # Out of file descriptors or memory: say so, give it a moment.
                self.refusals("accept", "(unknown)", f"accept failed: {e.strerror or e}")
                time.sleep(0.1)
                return
            self._arrived(sel, conn, peer_name(peer))

    def _arrived(self, sel: selectors.BaseSelector, conn: socket.socket, peer: str) -> None:
        waiting = len(self._pending)
        if waiting >= self.max_pending:
            why = f"{waiting} connections are waiting to send their HELLO (the cap)"
            self._refuse(conn, peer, "unauthenticated cap", why, _BUSY)
        elif waiting + self.active() >= self.max_connections:
            why = f"{self.max_connections} connections are open (the cap)"
            self._refuse(conn, peer, "connection cap", why, _BUSY)
        else:
            conn.setblocking(False)
            p = _Pending(conn, peer, time.monotonic() + self.hello_timeout)
            self._pending[conn] = p
            sel.register(conn, selectors.EVENT_READ, p)

    def _advance(self, sel: selectors.BaseSelector, p: _Pending) -> None:
        """Reads what ``p`` sent (never beyond its HELLO) and, once the
        HELLO is complete, answers it."""
        try:
            data = p.sock.recv(p.want())
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # it went away before its HELLO: nothing to log
            self._forget(sel, p)
            _close(p.sock)
            return
        p.buf += data
        try:
            if p.fields_len < 0:
                if p.want():
                    return
                kind, flen, blen = wire.parse_head(p.buf)
                if kind != wire.HELLO or blen or flen > wire.MAX_HELLO_FIELDS:
                    raise ProtocolError(
                        "a scan connection starts with a HELLO frame (no body, fields of at "
                        f"most {wire.MAX_HELLO_FIELDS} bytes)"
                    )
                p.fields_len = flen
            if p.want():
                return
            fields = wire.parse_fields(p.buf[wire.HEAD.size :])
        except ProtocolError as e:
            self._forget(sel, p)
            reply = {"code": "protocol", "message": str(e)}
            self._refuse(p.sock, p.peer, "hello", f"not a scan client ({e})", reply)
            return
        self._forget(sel, p)
        kind, reply, refusal = self.check_hello(fields)
        if refusal is not None:
            self._refuse(p.sock, p.peer, refusal[0], refusal[1], reply)
        elif _send_now(p.sock, kind, reply):
            p.sock.setblocking(True)
            self.admit(p.sock, p.peer)
        else:
            _close(p.sock)

    def _expire(self, sel: selectors.BaseSelector) -> None:
        now = time.monotonic()
        while self._pending:
            p = next(iter(self._pending.values()))
            if p.deadline > now:
                return
            self._forget(sel, p)
            why = f"no HELLO within {self.hello_timeout:g} s"
            self._refuse(p.sock, p.peer, "deadline", why, {"code": "protocol", "message": why})

    def _forget(self, sel: selectors.BaseSelector, p: _Pending) -> None:
        sel.unregister(p.sock)
        del self._pending[p.sock]

    def _refuse(
        self, sock: socket.socket, peer: str, kind: str, why: str, reply: dict[str, Any]
    ) -> None:
        self.refusals(kind, peer, why)  # first: logged by the time the peer knows
        _send_now(sock, wire.ERROR, reply)
        _close(sock)


def _send_now(sock: socket.socket, kind: int, fields: dict[str, Any]) -> bool:
    """Sends a small frame without waiting: True if all of it went out (it
    does on a fresh connection, whose send buffer is empty)."""
    data = wire.frame(kind, fields)
    try:
        sock.setblocking(False)
        return sock.send(data) == len(data)
    except OSError:
        return False


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
