"""The map/reduce sort of text records on the store: the workload of "Plasma
Map/Reduce Slightly Faster Than Hadoop" (Stolpmann, 2012).

A record is one 100-byte line: an 8-byte key (no TAB or LF), TAB, 90
bytes of value (no LF), LF. Keys compare as bytes (as ``LC_ALL=C sort``).

- :func:`gen_records` writes seeded, reproducible input files;
- :func:`sort_records` sorts a directory of them into P partition files
  ``part-00000`` … (partition p holds the keys of one key range; all
  records of a key in one partition; ranges in file order);
- :func:`validate_records` checks an output against its input.

The sort: the driver samples keys and picks P-1 boundary keys. **Map**
tasks (one per split of ~128 MiB) read the split, check every line, sort
it by key and cut it into P runs; the runs go into one store object per
split (partition by partition) — or, when the store has no room, into a
spill file. The driver holds a reference to each map object so the store
neither evicts nor spills it. **Reduce** tasks get partition p's run out
of every map object (zero-copy views), merge them and write
``part-p``. Workers pass object ids and offsets, never records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .._ids import ObjectID
from ..client import Client
from ..errors import JobError, ObjectExists, ObjectLost, StoreFull
from .dask_pool import DaskPool, is_dask_client, member_of, place, unique_ids
from .pool import Pool, default_socket, job_store, worker_client
from .record_format import (
    DEFAULT_SPLIT,
    KEY_SIZE,
    RECORD_SIZE,
    ProgressFactory,
    check,
    input_files,
    iter_records,
    keys_of,
    parse_size,
    progress_bar,
    split_files,
)
from .record_gen import gen_records
from .record_validate import ValidationReport, validate_records

__all__ = [
    "RECORD_SIZE",
    "SortSummary",
    "ValidationReport",
    "gen_records",
    "iter_records",
    "parse_size",
    "sort_records",
    "validate_records",
]

_SAMPLES_PER_PARTITION = 256


# ---------------------------------------------------------------- sort


@dataclasses.dataclass
class SortSummary:
    """What :func:`sort_records` did."""

    input_bytes: int  #: bytes of records read
    records: int  #: records sorted
    partitions: int  #: output files
    outputs: list[str]  #: their paths, in key order
    seconds: float  #: wall time of the sort (sampling, map, reduce)
    map_seconds: float
    reduce_seconds: float
    store_bytes: int  #: bytes of runs placed in the store (and read back by reducers)
    spilled_bytes: int  #: bytes of runs that went to spill files instead
    workers: int
    private_store: bool  #: True when the job started its own store
    #: the store member (host) that wrote each output ("" on one host)
    hosts: list[str] = dataclasses.field(default_factory=list)
    #: map tasks made again because their host died with their output
    recomputed_maps: int = 0

    @property
    def mb_per_s(self) -> float:
        """Input MB (10**6 bytes) sorted per second."""
        return self.input_bytes / 1e6 / self.seconds if self.seconds else 0.0

    def __str__(self) -> str:
        gb = self.input_bytes / 1e9
        return (
            f"sorted {self.records:,} records ({gb:.2f} GB) into {self.partitions} partitions "
            f"in {self.seconds:.1f} s ({self.mb_per_s:.0f} MB/s, "
            f"{self.mb_per_s / self.workers:.0f} MB/s per worker; map {self.map_seconds:.1f} s, "
            f"reduce {self.reduce_seconds:.1f} s) with {self.workers} workers; "
            f"{self.store_bytes / 1e9:.2f} GB through the store, "
            f"{self.spilled_bytes / 1e9:.2f} GB spilled to disk"
        )


def _sample_boundaries(files: list[str], partitions: int, seed: int = 0) -> np.ndarray:
    """P-1 boundary keys: quantiles of keys read at random record positions."""
    counts = [os.path.getsize(f) // RECORD_SIZE for f in files]
    want = min(sum(counts), partitions * _SAMPLES_PER_PARTITION)
    return _quantiles(_sample_keys(files, counts, want, sum(counts), seed), partitions)


def _sample_keys(files: list[str], counts: list[int], want: int, total: int, seed: int) -> list:
    """Keys read at random record positions of ``files`` (``counts``
    records each): ``want`` in all, if the files held ``total`` records."""
    rng = np.random.default_rng(seed)
    keys = []
    for path, n in zip(files, counts):
        k = round(want * n / total) if total else 0
        if not k:
            continue
        with open(path, "rb") as f:
            fd = f.fileno()
            for i in rng.choice(n, size=min(k, n), replace=False):
                raw = os.pread(fd, KEY_SIZE, int(i) * RECORD_SIZE)
                keys.append(int.from_bytes(raw.ljust(KEY_SIZE, b"\0"), "big"))
    return keys


def _quantiles(keys: list, partitions: int) -> np.ndarray:
    if not keys:
        return np.zeros(partitions - 1, dtype=np.uint64)
    ks = np.sort(np.array(keys, dtype=np.uint64))
    at = (np.arange(1, partitions) * len(ks)) // partitions
    return ks[np.minimum(at, len(ks) - 1)]


def _sample_local(
    pool: DaskPool, files: list[str], sizes: list[int], homes: list[str], partitions: int
) -> np.ndarray:
    """:func:`_sample_boundaries` of files on several hosts: each host
    samples its own files, in proportion to their share of the records."""
    counts = [s // RECORD_SIZE for s in sizes]
    total = sum(counts)
    want = min(total, partitions * _SAMPLES_PER_PARTITION)
    members = sorted(set(homes))
    args = []
    for seed, m in enumerate(members):
        mine = [k for k, h in enumerate(homes) if h == m]
        args.append(([files[k] for k in mine], [counts[k] for k in mine], want, total, seed))
    keys: list = []
    for _, got in pool.run_all(_sample_keys, args, where=members, strict=True):
        keys += got
    return _quantiles(keys, partitions)


def _list_local(directory: str) -> tuple[str, list[tuple[str, int]] | str]:
    """On a Dask worker: its host's store member, and the record files in
    ``directory`` there with their sizes (or why there are none)."""
    from .dask_pool import _member_here

    try:
        files = input_files(directory)
    except JobError as e:
        return _member_here(), str(e)
    return _member_here(), [(f, os.path.getsize(f)) for f in files]


def _local_inputs(pool: DaskPool, directory: str) -> tuple[list[str], list[int], list[str]]:
    """The files of ``directory`` on every host (each read there only):
    paths, sizes, and the store member (host) each is on."""
    listed: dict[str, Any] = {}
    for member, found in pool.client.run(_list_local, directory).values():
        listed.setdefault(member, found)
    problems = [f"host {m}: {v}" for m, v in listed.items() if isinstance(v, str)]
    if len(problems) == len(listed):
        raise JobError(f"no host has inputs in {directory!r}: " + "; ".join(problems))
    files, sizes, homes = [], [], []
    for member, found in sorted(listed.items()):
        if isinstance(found, str):
            continue  # a host without inputs: it only maps and reduces
        for path, size in found:
            files.append(path)
            sizes.append(size)
            homes.append(member)
    return files, sizes, homes


def _create_once(client: Client, job: bytes, size: int, *key: int) -> tuple[ObjectID, Any]:
    """Creates an object under the first free id of ``unique_ids(job, *key)``
    (a random id without a job)."""
    for oid in unique_ids(job, *key) if job else [ObjectID.random()]:
        try:
            return oid, client.create(oid, size)
        except ObjectExists:
            continue  # an earlier execution of this task made it
    raise JobError(f"output {key} of the job was made {len(unique_ids(job, *key))} times")


def _write_sorted(client: Client, oid: ObjectID, buf: Any, rows, order) -> bytes:
    """Writes ``rows[order]`` into the object being created, seals it and
    gives the creator's reference back (aborts it on failure)."""
    try:
        out = np.frombuffer(buf, dtype=f"V{RECORD_SIZE}")
        np.take(rows, order, out=out)
        del out
        client.seal(oid)
    except BaseException:
        client.abort(oid)
        raise
    client.release(oid)
    return oid.binary()


def _put_runs(client: Client, rows, order, edges, job: bytes, split: int) -> list:
    """Each of the P runs as an object of its own (for reducers on other
    hosts, which then pull only their partition's bytes); None for an empty
    run. Raises StoreFull with nothing left behind when they do not fit."""
    refs: list[Any] = []
    try:
        for p in range(len(edges) - 1):
            a, b = edges[p] // RECORD_SIZE, edges[p + 1] // RECORD_SIZE
            if a == b:
                refs.append(None)
                continue
            oid, buf = _create_once(client, job, (b - a) * RECORD_SIZE, split, p)
            refs.append(_write_sorted(client, oid, buf, rows, order[a:b]))
    except BaseException:
        client.delete([ObjectID(r) for r in refs if r is not None])
        raise
    return refs


def _map_task(path, offset, length, bounds, spill_dir, reserve, job=b"", split=0, per_run=False):
    """Reads, checks and sorts a split; places its P runs in the store (one
    object under the first free id of ``unique_ids(job, split)``, or with
    ``per_run`` one object per run) or a spill file. Returns (where, ref or
    refs, run offsets in bytes, store member)."""
    data = np.fromfile(path, dtype=np.uint8, count=length, offset=offset)
    if len(data) != length:
        raise JobError(f"{path} changed size while being sorted")
    rec = check(data, path, offset)
    keys = keys_of(rec)
    order = np.argsort(keys, kind="quicksort")
    part = np.searchsorted(bounds, keys[order], side="right")
    counts = np.bincount(part, minlength=len(bounds) + 1)
    edges = np.concatenate(([0], np.cumsum(counts))) * RECORD_SIZE
    rows = rec.view(f"V{RECORD_SIZE}").ravel()
    client = worker_client()
    st = client.stats()
    if per_run and length and st["capacity"] - st["used"] >= length + reserve:
        try:
            refs = _put_runs(client, rows, order, edges.tolist(), job, split)
            return "runs", refs, edges.tolist(), member_of(client)
        except StoreFull:
            pass  # to a spill file, below
    elif length and st["capacity"] - st["used"] >= length + reserve:
        try:
            oid, buf = _create_once(client, job, length, split)
        except StoreFull:
            pass  # to a spill file, below
        else:
            ref = _write_sorted(client, oid, buf, rows, order)
            return "store", ref, edges.tolist(), member_of(client)
    fd, spill = tempfile.mkstemp(dir=spill_dir, suffix=".run")
    with os.fdopen(fd, "wb") as f:
        rows[order].tofile(f)
    return "file", spill, edges.tolist(), ""


def _reduce_task(p: int, sources: list, out_path: str) -> tuple[int, str]:
    """Merges partition p's runs (store ranges and file ranges) into
    out_path; returns the bytes written and the store member it ran by.
    Runs put on other hosts come through the cluster's remote get (raising
    ObjectLost for one lost with its host: the driver makes it again)."""
    client = worker_client()
    ids = [ObjectID(ref) for where, ref, a, b in sources if where == "store"]
    # Sealed before the reduce started: a local one comes at once; one on
    # another host is pulled (the timeout bounds a stalled transfer; a run
    # lost with its host raises ObjectLost at once).
    bufs = iter(client.get_buffers(ids, timeout=_FETCH_TIMEOUT)) if ids else iter(())
    pieces = []
    for where, ref, a, b in sources:
        if where == "store":
            buf = next(bufs)
            if buf is None:
                raise JobError(f"partition {p}: a map's runs ({ref.hex()}) left the store")
            if b > a:
                pieces.append(np.frombuffer(buf, dtype=np.uint8, count=b - a, offset=a))
        elif b > a:
            pieces.append(np.fromfile(ref, dtype=np.uint8, count=b - a, offset=a))
    nbytes = sum(len(x) for x in pieces)
    with open(out_path, "wb") as f:
        if nbytes:
            whole = np.concatenate(pieces).reshape(-1, RECORD_SIZE)
            del pieces
            # Each run is sorted: the stable sort (timsort) merges the runs.
            order = np.argsort(keys_of(whole), kind="stable")
            whole.view(f"V{RECORD_SIZE}").ravel()[order].tofile(f)
    return nbytes, member_of(client)


@contextlib.contextmanager
def _uninterrupted():
    """Ignores Ctrl-C (SIGINT) for the block: renaming the finished outputs
    is all or nothing, and an interrupt that comes this late lets the sort
    complete. Only the main thread can do this; from other threads the
    block runs as it is."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _discard_run(client: Client, result: tuple) -> None:
    """Deletes what a map task placed that the job did not take (it failed);
    spill files go with the spill directory."""
    where, ref = result[0], result[1]
    if where == "runs":
        client.delete([ObjectID(r) for r in ref if r is not None])
    elif where == "store":
        client.delete(ObjectID(ref))


def _store_memory(total: int) -> int:
    """A private store's size: the input plus a margin, within what the
    machine's /dev/shm and free memory allow (the rest spills)."""
    limits = []
    try:
        st = os.statvfs("/dev/shm")
        limits.append(st.f_bavail * st.f_frsize)
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    limits.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    cap = int(min(limits) * 0.5) if limits else 4 * 2**30
    return max(64 * 2**20, min(total + total // 16 + 64 * 2**20, cap))


def sort_records(
    input_dir: str,
    output_dir: str,
    partitions: int = 80,
    workers: int | Pool | None = None,
    socket: str | None = None,
    split_size: int | str = DEFAULT_SPLIT,
    spill_dir: str | None = None,
    progress: ProgressFactory | None = None,
    say: Callable[[str], None] = print,
    overwrite: bool = False,
    local_inputs: bool = False,
) -> SortSummary:
    """Sorts the record files in ``input_dir`` into ``partitions`` files
    ``part-00000`` … in ``output_dir``, with ``workers`` processes (default:
    the cores) on the store at ``socket`` (default: $FERROPLASMA_SOCKET, else
    /tmp/ferroplasma.sock). When no store runs there, a private one is
    started for the job (and ``say`` says so). Runs that do not fit in the
    store go to files in ``spill_dir`` (default: a hidden directory in
    ``output_dir``). ``progress(what, total_bytes)`` makes a bar (an object
    with ``update(n)`` and ``close()``), e.g. ``tqdm``.

    With ``workers=`` a ``distributed.Client`` and ``local_inputs``, each
    host has files of its own in ``input_dir`` (the same path everywhere,
    other files on each host, as on a cluster's local disks): the driver
    asks every worker what its host has, samples keys and runs each map
    task on the host of its split, so every input byte is read where it
    lies. Such a split cannot be made again elsewhere: a host that dies
    with inputs nobody else has fails the job (JobError, naming the host).

    Raises MalformedRecord (with the file and line) for a line that is not
    a record, JobError for a missing input, or for ``part-*`` files already
    in ``output_dir`` unless ``overwrite`` (then they are removed first).
    """
    if partitions < 1:
        raise JobError(f"partitions must be at least 1, not {partitions}")
    if local_inputs and not is_dask_client(workers):
        raise JobError(
            "local_inputs: each host's files are read by the Dask workers of that host; "
            "pass workers=distributed.Client(...) (or --scheduler)"
        )
    files = [] if local_inputs else input_files(input_dir)
    total = sum(os.path.getsize(f) for f in files)
    os.makedirs(output_dir, exist_ok=True)
    old = sorted(f for f in os.listdir(output_dir) if f.startswith("part-"))
    if old and not overwrite:
        raise JobError(
            f"output {output_dir!r} already holds {len(old)} part files ({old[0]} …) from "
            f"an earlier sort: remove them, choose another output, or overwrite them "
            f"(--overwrite)"
        )
    for f in old:
        os.remove(os.path.join(output_dir, f))
    for f in os.listdir(output_dir):  # left by a sort that was killed
        if f.startswith(".part-") and f.endswith(".tmp"):
            os.remove(os.path.join(output_dir, f))
    spill = tempfile.mkdtemp(prefix=".ferroplasma-spill-", dir=spill_dir or output_dir)
    started = time.perf_counter()
    try:
        sizes: list[int] | None = None
        homes: list[str] | None = None
        if is_dask_client(workers):
            # Across hosts: every worker's host runs a store of one cluster;
            # the driver talks to the one at `socket`.
            workers = DaskPool(workers)
            if local_inputs:
                files, sizes, homes = _local_inputs(workers, input_dir)
                total = sum(sizes)
        with job_store(socket, _store_memory(total), say) as client:
            private = client.socket != (socket or default_socket())
            own_pool = not isinstance(workers, (Pool, DaskPool))
            pool = Pool(client.socket, workers) if own_pool else workers
            try:
                summary = _run_sort(
                    client,
                    pool,
                    files,
                    total,
                    output_dir,
                    partitions,
                    split_size,
                    spill,
                    progress,
                    sizes,
                    homes,
                )
            finally:
                if own_pool:
                    pool.close()
        summary.private_store = private
        summary.seconds = time.perf_counter() - started
        return summary
    finally:
        shutil.rmtree(spill, ignore_errors=True)


# Seconds a reducer waits for a run held on another host.
_FETCH_TIMEOUT = 120.0
# How many times a sort makes lost map outputs again before giving up.
_RECOVERIES = 3


def _place(results: list, partitions: list[int], members: list[str]) -> list[str]:
    """Where each partition's reduce runs: :func:`place` over the bytes of
    its runs on each store member."""
    weights: list[dict[str, int]] = []
    for p in partitions:
        w: dict[str, int] = {}
        for kind, _, e, member in results:
            if kind in ("store", "runs"):
                w[member] = w.get(member, 0) + e[p + 1] - e[p]
        weights.append(w)
    return place(weights, members)


def _refs(result: tuple) -> list[bytes]:
    """The object ids (raw) a map task's result names."""
    if result[0] == "store":
        return [result[1]]
    if result[0] == "runs":
        return [r for r in result[1] if r is not None]
    return []


def _lost_maps(client: Client, results: list) -> list[int]:
    """The map tasks some of whose objects are no longer in any live store."""
    lost = []
    for i, r in enumerate(results):
        refs = _refs(r)
        if refs and not all(client.contains([ObjectID(x) for x in refs], cluster=True)):
            lost.append(i)
    return lost


def _run_sort(
    client: Client,
    pool: Pool,
    files: list[str],
    total: int,
    output_dir: str,
    partitions: int,
    split_size: int | str,
    spill: str,
    progress: ProgressFactory | None,
    sizes: list[int] | None = None,
    homes: list[str] | None = None,
) -> SortSummary:
    if homes is None or sizes is None:
        bounds = _sample_boundaries(files, partitions)
        splits = split_files(files, parse_size(split_size))
        split_homes = None
    else:
        # Inputs local to their hosts: each host samples its own files, and
        # each split is mapped on its host only.
        bounds = _sample_local(pool, files, sizes, homes, partitions)
        splits, split_homes = [], []
        for path, size, home in zip(files, sizes, homes):
            mine = split_files([path], parse_size(split_size), [size])
            splits += mine
            split_homes += [home] * len(mine)

    # Room kept for the splits other workers may be placing at the same time.
    reserve = max((n for _, _, n in splits), default=0) * (pool.workers - 1)
    held: dict[int, Any] = {}  # map index -> buffer (keeps its object in the store)
    superseded: list[bytes] = []  # map objects made again after their host died
    redone: list[int] = []  # the maps made again
    job = os.urandom(16)  # names the ids map tasks may use (unique_ids)
    temps: list[str] = []  # reduce outputs not renamed yet
    results: list[Any] = [None] * len(splits)
    store_bytes = spilled = 0
    t0 = time.perf_counter()
    bar = progress_bar(progress, "map", total)
    try:
        per_run = not pool.holds_inputs  # across hosts: reducers pull only their runs
        map_args = [
            (p, off, n, bounds, spill, reserve, job, i, per_run)
            for i, (p, off, n) in enumerate(splits)
        ]

        def run_maps(which: list[int]) -> None:
            nonlocal store_bytes, spilled
            placed = (
                {"where": [split_homes[i] for i in which], "strict": True} if split_homes else {}
            )
            for k, res in pool.run_all(
                _map_task,
                [map_args[i] for i in which],
                discard=lambda r: _discard_run(client, r),
                **placed,
            ):
                i = which[k]
                if results[i] is not None:
                    superseded.extend(_refs(results[i]))  # lost with its host
                    redone.append(i)
                results[i] = res
                if res[0] == "store":
                    if pool.holds_inputs:
                        (buf,) = client.get_buffers([ObjectID(res[1])], timeout=0)
                        if buf is None:
                            raise JobError(
                                f"split {i}: its runs left the store before the job held them"
                            )
                        held[i] = buf
                    store_bytes += splits[i][2]
                elif res[0] == "runs":
                    store_bytes += splits[i][2]
                else:
                    spilled += splits[i][2]
                bar.update(splits[i][2])

        run_maps(list(range(len(splits))))
        bar.close()
        t1 = time.perf_counter()
        bar = progress_bar(progress, "reduce", total)
        # Reducers write hidden temporary files; they take their names only
        # once every partition is complete, so an interrupted or failed sort
        # leaves no part files behind.
        outputs = [os.path.join(output_dir, f"part-{p:05d}") for p in range(partitions)]
        temps = [os.path.join(output_dir, f".part-{p:05d}.tmp") for p in range(partitions)]
        hosts = [""] * partitions
        pending = list(range(partitions))
        for attempt in range(_RECOVERIES + 1):
            tasks = []
            for p in pending:
                sources = []
                for w, ref, e, _ in results:
                    if w != "runs":
                        sources.append((w, ref, e[p], e[p + 1]))
                    elif ref[p] is not None:
                        sources.append(("store", ref[p], 0, e[p + 1] - e[p]))
                tasks.append((p, sources, temps[p]))
            where = _place(results, pending, list(getattr(pool, "workers_of", {})))
            try:
                for k, (written, host) in pool.run_all(
                    _reduce_task, tasks, **({"where": where} if not pool.holds_inputs else {})
                ):
                    bar.update(written)
                    hosts[pending[k]] = host
                    pending[k] = -1
                break
            except ObjectLost:
                # A host died with map outputs: make them again from their
                # splits, then run the partitions not written yet.
                if attempt == _RECOVERIES:
                    raise
                pending = [p for p in pending if p >= 0]
                lost = _lost_maps(client, results)
                bar.close()
                bar = progress_bar(progress, f"redo {len(lost)} maps", len(lost))
                run_maps(lost)
                bar = progress_bar(progress, "reduce", total)
        with _uninterrupted():
            for temp, out in zip(temps, outputs):
                os.replace(temp, out)
            temps = []
        bar.close()
        t2 = time.perf_counter()
    finally:
        bar.close()
        for temp in temps:
            with contextlib.suppress(FileNotFoundError):
                os.remove(temp)
        ids = {ObjectID(x) for r in results if r is not None for x in _refs(r)}
        ids |= {ObjectID(r) for r in superseded}
        if not pool.holds_inputs:
            # Across hosts: also whatever an execution of a map task made
            # that the driver never heard of.
            ids |= {
                oid
                for i in range(len(splits))
                for p in range(partitions)
                for oid in unique_ids(job, i, p)
            }
        ids = list(ids)
        held.clear()
        if ids:
            client.delete(ids)
    return SortSummary(
        input_bytes=total,
        records=total // RECORD_SIZE,
        partitions=partitions,
        outputs=outputs,
        seconds=0.0,
        map_seconds=t1 - t0,
        reduce_seconds=t2 - t1,
        store_bytes=store_bytes,
        spilled_bytes=spilled,
        workers=pool.workers,
        private_store=False,
        hosts=hosts,
        recomputed_maps=len(redone),
    )
