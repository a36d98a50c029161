"""The scan transport over UCX (Unified Communication X), through the
``ucxx`` binding: the second implementation of :class:`Transport`, selected
by a ``ucx://host:port`` address.

UCX picks the fastest path between two endpoints at run time: RDMA
(InfiniBand, RoCE) where the hardware exists, shared memory between
processes of one host, TCP otherwise. The scan protocol above it does not
change: frames, descriptors and the placed receive buffers are the same as
over TCP. Each buffer of a frame is one UCX stream send, posted without
waiting for the previous one; a receive posts one stream receive per placed
buffer, and UCX fills each in place.

``pip install ucxx-cu12`` (PyPI's wheels are built with CUDA support but run
without a GPU; they carry UCX's TCP and shared-memory transports, and its
InfiniBand and RoCE ones where the system has the drivers). One UCX context
and worker serve the whole process, progressed by ucxx's own thread.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import ScanServerUnavailable
from .transport import Transport, _byte_views, parse_address

__all__ = ["SCHEME", "UcxListener", "UcxTransport", "available", "ucx_connect"]

#: The address scheme that selects this transport.
SCHEME = "ucx://"

_lock = threading.Lock()
_workers: dict[str, Any] = {}


def available() -> bool:
    """True if the ``ucxx`` binding can be imported here."""
    try:
        _api()
    except ImportError:
        return False
    return True


def _api() -> Any:
    # ucxx tunes UCX for GPU memory when it is imported; these scans move
    # host memory only.
    os.environ.setdefault("UCX_RNDV_FRAG_MEM_TYPE", "host")
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    import ucxx._lib.libucxx as api

    return api


def _shared_worker(role: str) -> Any:
    """The process's UCX worker for ``role`` ("client" or "server"; apart,
    so that a process can be both), with its progress thread."""
    with _lock:
        if role not in _workers:
            api = _api()
            ctx = api.UCXContext(feature_flags=(api.Feature.WAKEUP, api.Feature.STREAM))
            # Requests posted from other threads than the progress thread are
            # handed to it (delayed submission): a UCX worker is not
            # thread-safe, and posting directly raced with it.
            worker = api.UCXWorker(ctx, enable_delayed_submission=True)
            worker.start_progress_thread()
            if not _workers:
                atexit.register(_stop_workers)
            _workers[role] = (ctx, worker)
        return _workers[role][1]


def _stop_workers() -> None:
    """Stops the progress threads before the interpreter goes (ucxx warns
    otherwise, and destructors could run on those threads)."""
    with _lock:
        for _ctx, worker in _workers.values():
            with contextlib.suppress(Exception):
                worker.stop_progress_thread()


def _wait(requests: list[Any], deadline: float | None = None) -> None:
    """Waits for UCX requests (ucxx's progress thread completes them): polls,
    sleeping a little longer each time, up to 1 ms while data flows and
    20 ms once a wait passed a second (an idle connection). Raises
    TimeoutError past ``deadline`` (a ``time.monotonic()`` value),
    ConnectionError if a request failed (the peer went away)."""
    pause = 0.0
    start = time.monotonic()
    while not all(r.completed for r in requests):
        now = time.monotonic()
        if deadline is not None and now > deadline:
            raise TimeoutError("no data from the UCX peer in time")
        time.sleep(pause)
        pause = min(0.001 if now - start < 1.0 else 0.02, pause * 2 or 0.00002)
    for r in requests:
        try:
            r.check_error()
        except Exception as e:  # ucxx raises its own UCXError family
            raise ConnectionError(f"the UCX connection failed: {e}") from None


class UcxTransport(Transport):
    """A :class:`Transport` over one UCX endpoint (stream API)."""

    def __init__(self, endpoint: Any, peer: str = "") -> None:
        self.ep = endpoint
        self.peer = peer
        self.deadline: float | None = None  # for the next receives (HELLO)
        from ucxx._lib.arr import Array

        self._array = Array

    def _endpoint(self) -> Any:
        ep = self.ep
        if ep is None:
            raise ConnectionError("the UCX connection is closed")
        return ep

    def send(self, parts: Sequence[Any]) -> None:
        ep = self._endpoint()
        _wait([ep.stream_send(self._array(v)) for v in _byte_views(parts)])

    def recv_into(self, views: Sequence[memoryview]) -> None:
        ep = self._endpoint()
        try:
            _wait([ep.stream_recv(self._array(v)) for v in _byte_views(views)], self.deadline)
        except TimeoutError:
            # The receives are still posted into ``views``: close (which
            # cancels them) while this frame keeps the memory alive.
            self.close()
            raise

    def close(self) -> None:
        ep, self.ep = self.ep, None
        if ep is None:
            return
        # With a progress thread, a close must go through it (and wait up to
        # a second); UCXEndpoint.close() from this thread crashed.
        with contextlib.suppress(Exception):  # already closed, or the peer is gone
            ep.close_blocking(period=10**9, max_attempts=1)
            ep.remove_close_callback()


def ucx_connect(address: str, timeout: float | None) -> UcxTransport:
    """Connects to ``ucx://host:port`` (or ``host:port``)."""
    if address.startswith(SCHEME):
        address = address[len(SCHEME) :]
    host, port = parse_address(address)
    try:
        worker = _shared_worker("client")
    except ImportError:
        raise ScanServerUnavailable(
            f"{SCHEME}{address} needs the UCX binding: pip install ucxx-cu12"
        ) from None
    api = _api()
    try:
        ep = api.UCXEndpoint.create(worker, host, port, True)
    except Exception as e:
        raise ConnectionError(f"cannot reach {SCHEME}{address}: {e}") from None
    t = UcxTransport(ep, f"{host}:{port}")
    if timeout is not None:
        t.deadline = time.monotonic() + timeout
    return t


class UcxListener:
    """Accepts UCX connections on ``port`` (every interface; 0 picks one, see
    :attr:`port`) and hands each one, as a :class:`UcxTransport`, to
    ``on_connect`` in a thread of its own."""

    def __init__(self, port: int, on_connect: Callable[[UcxTransport], None]) -> None:
        api = _api()
        self._on_connect = on_connect
        self._listener = api.UCXListener.create(_shared_worker("server"), port, self._arrived)
        self.port: int = self._listener.port
        self._closed = False

    def _arrived(self, conn_request: Any) -> None:
        # Runs in ucxx's progress thread: create the endpoint, hand it on.
        if self._closed:
            return
        try:
            ep = self._listener.create_endpoint_from_conn_request(conn_request, True)
        except Exception:
            return  # the peer went away while connecting
        t = UcxTransport(ep, "ucx peer")
        threading.Thread(target=self._on_connect, args=(t,), daemon=True, name="scan ucx").start()

    def close(self) -> None:
        """Accepts no more connections."""
        self._closed = True
        self._listener = None
