"""Worker processes for jobs, and the store a job runs on.

A :class:`Pool` is a set of processes, each connected to the same store,
that run a job's tasks. Tasks take and return object ids (and small plain
values); the data stays in the store.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from ..client import Client, default_socket
from ..errors import JobError, StoreUnavailable

__all__ = ["Pool", "default_socket", "job_store", "worker_client"]

_CLIENT: Client | None = None
_CLIENT_ERROR: Exception | None = None


def _init_worker(socket: str | None) -> None:
    global _CLIENT, _CLIENT_ERROR
    # Ctrl-C in a terminal reaches every process of the foreground group:
    # the driver handles it (finishing or discarding what runs), not workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if socket is not None:
        try:
            _CLIENT = Client(socket)
        except Exception as e:  # reported by the first task that needs the store
            _CLIENT_ERROR = e


_CONNECTING = threading.Lock()


def _in_dask_worker() -> bool:
    dist = sys.modules.get("distributed")
    if dist is None:
        return False
    try:
        dist.get_worker()
    except ValueError:
        # client.run() calls run outside a task: is this a worker process?
        return bool(getattr(getattr(dist, "Worker", None), "_instances", ()))
    return True


def worker_client() -> Client:
    """The store client of the worker process running the current task: a
    :class:`Pool`'s, or in a Dask worker (:class:`~.dask_pool.DaskPool`)
    one connected on first use to the store of the worker's host
    (``$FERROPLASMA_SOCKET``, else the default socket)."""
    global _CLIENT
    if _CLIENT_ERROR is not None:
        raise _CLIENT_ERROR
    if _CLIENT is None:
        if not _in_dask_worker():
            raise JobError("worker_client() is only available inside a Pool's task")
        with _CONNECTING:
            if _CLIENT is None:
                _CLIENT = Client(default_socket())
    return _CLIENT


def _default_start() -> str:
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


def _ready(connect: bool) -> int:
    if connect:
        worker_client()
    return os.getpid()


class Pool:
    """``workers`` processes (default: the cores) connected to the store at
    ``socket`` (default: :func:`default_socket`; ``connect=False`` for
    tasks that need no store).

    Processes are forked (``start_method="fork"``, the default where there
    is fork: no ``if __name__ == "__main__"`` guard needed, numpy and pandas
    already imported); each opens its own store connection, as a client
    must not cross a fork. ``"spawn"`` or ``"forkserver"`` start fresh
    interpreters (about half a second each). Workers live until
    :meth:`close`; reuse one pool for several jobs::

        with fp.jobs.Pool(client.socket, workers=4) as pool:
            out = fp.jobs.sort_dataframe(client, parts, "key", workers=pool)
    """

    # The driver holds a reference to each map object so that the store
    # neither evicts nor spills it (all on one host, so that costs nothing).
    holds_inputs = True

    def __init__(
        self,
        socket: str | None = None,
        workers: int | None = None,
        start_method: str | None = None,
        connect: bool = True,
    ) -> None:
        if workers is not None and workers < 1:
            raise JobError(f"workers must be at least 1, not {workers}")
        self.socket = socket or default_socket()
        self.workers = workers or os.cpu_count() or 1
        self._connect = connect
        self._executor = ProcessPoolExecutor(
            self.workers,
            mp_context=multiprocessing.get_context(start_method or _default_start()),
            initializer=_init_worker,
            initargs=(self.socket if connect else None,),
        )

    def start(self) -> Pool:
        """Starts every worker now instead of on the first task (a worker
        that cannot reach the store fails here)."""
        futures = [self._executor.submit(_ready, self._connect) for _ in range(self.workers)]
        for f in futures:
            self.result(f)
        return self

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Runs ``fn(*args)`` in a worker; ``fn`` must be a module-level function."""
        try:
            return self._executor.submit(fn, *args)
        except BrokenProcessPool as e:
            raise JobError("a worker process died; the pool cannot run tasks") from e

    @staticmethod
    def result(future: Future) -> Any:
        """The task's result; its exception re-raised, a dead worker as JobError."""
        try:
            return future.result()
        except BrokenProcessPool as e:
            raise JobError(
                "a worker process died (killed, or out of memory); the job is abandoned"
            ) from e

    def run_all(
        self,
        fn: Callable[..., Any],
        args: Iterable[tuple],
        discard: Callable[[Any], None] | None = None,
    ) -> Iterator[tuple[int, Any]]:
        """Submits ``fn(*a)`` for each ``a`` and yields ``(index, result)`` as
        tasks finish. When the caller stops early (an error), the tasks not
        started are cancelled, those running are waited for, and each
        result nobody took is passed to ``discard`` (to delete what the task
        put in the store)."""
        from concurrent.futures import as_completed, wait

        futures = {self.submit(fn, *a): i for i, a in enumerate(args)}
        taken: set[Future] = set()
        try:
            for f in as_completed(futures):
                taken.add(f)
                yield futures[f], self.result(f)
        finally:
            left = [f for f in futures if f not in taken and not f.cancel()]
            if left:
                wait(left)
            for f in left:
                if discard is not None and not f.cancelled() and f.exception() is None:
                    with contextlib.suppress(Exception):
                        discard(f.result())

    def close(self) -> None:
        """Stops the workers (after the tasks already running)."""
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ferroplasma.jobs.Pool workers={self.workers} socket={self.socket!r}>"


@contextlib.contextmanager
def job_store(
    socket: str | None, memory: int, say: Callable[[str], None] = print
) -> Iterator[Client]:
    """A client of the store at ``socket`` (default: :func:`default_socket`);
    if none answers there, a private store of ``memory`` bytes (spilling to
    a temporary directory) is started for the block's duration, and ``say``
    is told so."""
    from ..store import start_store

    path = socket or default_socket()
    try:
        client = Client(path)
    except StoreUnavailable:
        client = None
    if client is not None:
        yield client
        return
    spill = tempfile.mkdtemp(prefix="ferroplasma-job-spill-")
    try:
        with start_store(memory=str(memory), spill_dir=spill) as store:
            say(
                f"no store at {path}: started a private store of {memory / 2**30:.1f} GiB "
                f"(socket {store.socket}, spilling to {spill}) for this job"
            )
            yield store.connect()
    finally:
        shutil.rmtree(spill, ignore_errors=True)
