"""Jobs on a Dask cluster: Dask schedules the tasks, the store holds the data.

:class:`DaskPool` runs a job's tasks on the workers of a
``distributed.Client``, in place of the local :class:`~.pool.Pool`. Each
worker talks to the ferroplasma store of its own host (its
``$FERROPLASMA_SOCKET``, else the default socket); those stores form one
cluster (docs/cluster.md), so a task gets objects put on other hosts
through the cluster's remote get. Tasks pass object ids, never data,
through Dask. A task can be placed where its input bytes are: ``where``
names the store member that should run it, and the pool turns that into a
Dask ``workers=`` hint (the task may still run elsewhere, e.g. when that
host died).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..errors import JobError

__all__ = ["DaskPool", "is_dask_client", "member_of", "place", "unique_ids"]

# How many ids a task may try for one output (see unique_ids).
ATTEMPTS = 8


def unique_ids(job: bytes, *key: int) -> list[Any]:
    """The ids one output of a task may take: derived from the job and
    the output's key (e.g. split and bucket), ``ATTEMPTS`` of them. A task
    takes the first one free, so a task Dask runs twice makes its output
    again under the same or the next id, and the driver can delete every
    object any execution made without having heard of it."""
    import hashlib

    from .._ids import ObjectID

    base = job + b"".join(k.to_bytes(8, "little") for k in key)
    return [
        ObjectID(hashlib.blake2b(base + bytes([a]), digest_size=20).digest())
        for a in range(ATTEMPTS)
    ]


_MEMBER: dict[int, str] = {}


def member_of(client: Any) -> str:
    """The cluster address of the store ``client`` is connected to ("" for
    a store not in a cluster), asked once per client."""
    key = id(client)
    if key not in _MEMBER:
        status = client.cluster_status()
        here = [m["address"] for m in status.get("members", []) if m["health"] == "this"]
        _MEMBER[key] = here[0] if status.get("enabled") and here else ""
    return _MEMBER[key]


def place(weights: list[dict[str, int]], members: list[str]) -> list[str]:
    """The store member to run each task on, given for each task the bytes
    of its input on each member: where most of its input is (read locally;
    the rest crosses the network once), but no member gets more than its
    share of the tasks, so that every host works. Heaviest tasks choose
    first."""
    members = sorted(set(members) | {m for w in weights for m in w})
    if not members:
        return [""] * len(weights)
    share = -(-len(weights) // len(members))  # ceil
    load = dict.fromkeys(members, 0)
    chosen = [""] * len(weights)
    for t in sorted(range(len(weights)), key=lambda i: -sum(weights[i].values())):
        best = max((m for m in members if load[m] < share), key=lambda m: weights[t].get(m, 0))
        chosen[t] = best
        load[best] += 1
    return chosen


def is_dask_client(obj: Any) -> bool:
    """True for a ``distributed.Client`` (without importing Dask otherwise)."""
    return type(obj).__module__.startswith("distributed") and hasattr(obj, "scheduler_info")


def _member_here() -> str:
    """This worker's store member address ("" for a store not in a cluster)."""
    from .pool import worker_client

    return member_of(worker_client())


def _executing(dask_worker: Any = None) -> list[str]:
    """On a Dask worker: the keys of the tasks it is running now."""
    state = dask_worker.state
    return [str(ts.key) for ts in (*state.executing, *state.long_running)]


# Seconds between looks at whether a host that alone can run some tasks is gone.
_WATCH_S = 1.0
# Seconds a failed job waits for its tasks still running, to delete what
# they made.
_FETCH_S = 120.0


class DaskPool:
    """Runs tasks on the workers of ``client`` (a ``distributed.Client``),
    each connected to the store of its host.

    >>> from distributed import Client                  # doctest: +SKIP
    >>> fp.jobs.sort_records("in", "out", workers=Client("tcp://sched:8786"))  # doctest: +SKIP
    """

    # The driver must not hold the job's objects itself: getting them would
    # pull every one of them to the driver's host.
    holds_inputs = False

    def __init__(self, client: Any) -> None:
        self.client = client
        info = client.scheduler_info()
        workers = info.get("workers", {})
        if not workers:
            raise JobError(f"the Dask cluster at {client.scheduler.address} has no workers")
        self.workers = sum(w.get("nthreads", 1) for w in workers.values()) or 1
        try:
            members = client.run(_member_here)
        except Exception as e:
            raise JobError(
                f"a Dask worker cannot reach its ferroplasma store ({e}): start a store on "
                f"every worker's host and set FERROPLASMA_SOCKET for the workers"
            ) from e
        # store member address -> the Dask workers on that host
        self.workers_of: dict[str, list[str]] = {}
        for worker, member in members.items():
            self.workers_of.setdefault(member, []).append(worker)
        self.socket = None

    def submit(
        self, fn: Callable[..., Any], *args: Any, where: str | None = None, strict: bool = False
    ) -> Any:
        """Runs ``fn(*args)`` on a worker, preferably one on store member
        ``where`` (with ``strict``, only there: its inputs are on that host
        alone)."""
        hint = self.workers_of.get(where) if where else None
        if strict and not hint:
            raise JobError(f"no Dask worker runs on host {where}, which holds inputs of the job")
        return self.client.submit(
            fn,
            *args,
            pure=False,
            workers=hint,
            allow_other_workers=hint is not None and not strict,
            retries=2,
        )

    def _host_gone(self, member: str) -> bool:
        """Whether no Dask worker of store member ``member`` is left."""
        alive = set(self.client.scheduler_info().get("workers", {}))
        return not alive.intersection(self.workers_of.get(member, []))

    def _finished(self, futures: dict, strict_where: list[str] | None) -> Iterator[tuple[Any, Any]]:
        """Each future and its result, as they finish. Tasks bound to one
        host (``strict``) cannot run anywhere else: when every worker of
        such a host is gone (with the task, or with the result it held),
        the job cannot finish, and this says so instead of waiting."""
        from distributed import as_completed, wait

        if strict_where is None:
            for f in as_completed(futures):
                yield f, f.result()
            return
        pending = set(futures)
        while pending:
            try:
                wait(pending, timeout=_WATCH_S, return_when="FIRST_COMPLETED")
            except TimeoutError:
                pass
            for f in [f for f in pending if f.done()]:
                try:
                    # A result held by a worker that died meanwhile is
                    # computed again: on its host only.
                    result = f.result(timeout=_WATCH_S)
                except TimeoutError:
                    continue
                pending.discard(f)
                yield f, result
            hosts = {strict_where[futures[f]] for f in pending}
            gone = sorted(h for h in hosts if self._host_gone(h)) if hosts else []
            if gone:
                raise JobError(
                    f"host {', '.join(gone)} is gone, and with it the job's inputs that only it "
                    f"had (local inputs are read where they are): run the job again once its "
                    f"files are on a live host"
                )

    @staticmethod
    def result(future: Any) -> Any:
        return future.result()

    def run_all(
        self,
        fn: Callable[..., Any],
        args: Iterable[tuple],
        discard: Callable[[Any], None] | None = None,
        where: list[str] | None = None,
        strict: bool = False,
    ) -> Iterator[tuple[int, Any]]:
        """As :meth:`Pool.run_all`, with ``where[i]`` the store member
        that should run task ``i`` (with ``strict``: that must)."""
        from distributed import wait

        futures = {}
        for i, a in enumerate(args):
            futures[self.submit(fn, *a, where=where[i] if where else None, strict=strict)] = i
        taken: set[Any] = set()
        try:
            for f, result in self._finished(futures, where if strict else None):
                taken.add(f)
                yield futures[f], result
        finally:
            left = [f for f in futures if f not in taken]
            for f in left:
                f.cancel()
            with contextlib.suppress(Exception):
                wait([f for f in left if not f.cancelled()], timeout=_FETCH_S)
            # A cancelled task that a worker already runs goes on to the end
            # (Dask cannot stop it): wait for it, so that whatever it puts
            # in a store exists before the job deletes what it made.
            self._wait_idle({str(f.key) for f in left})
            for f in left:
                if discard is not None and f.status == "finished":
                    with contextlib.suppress(Exception):
                        discard(f.result())

    def _wait_idle(self, keys: set[str]) -> None:
        """Waits (up to two minutes) until no worker runs a task of ``keys``."""
        deadline = time.monotonic() + _FETCH_S
        while keys and time.monotonic() < deadline:
            try:
                running = self.client.run(_executing)
            except Exception:
                return  # nothing to ask: nothing left running either
            if not keys.intersection(k for ks in running.values() for k in ks):
                return
            time.sleep(0.05)

    def close(self) -> None:
        """Nothing: the Dask client belongs to the caller."""

    def __repr__(self) -> str:
        return f"<ferroplasma.jobs.DaskPool workers={self.workers} hosts={len(self.workers_of)}>"
