"""The map/reduce sort of text records (seed 004's workload) on the store.

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

import dataclasses
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .._ids import ObjectID
from ..client import Client
from ..errors import JobError, MalformedRecord, StoreFull
from .pool import Pool, default_socket, job_store, worker_client

__all__ = [
    "RECORD_SIZE",
    "SortSummary",
    "ValidationReport",
    "gen_records",
    "parse_size",
    "sort_records",
    "validate_records",
]

RECORD_SIZE = 100
KEY_SIZE = 8
TAB, LF = 9, 10
N_KEYS = 65536
DEFAULT_SPLIT = 128 * 2**20
_GEN_CHUNK = 64 * 2**20
_SAMPLES_PER_PARTITION = 256

ProgressFactory = Callable[[str, int], Any]


# ---------------------------------------------------------------- sizes


_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kb": 10**3,
    "kib": 2**10,
    "m": 2**20,
    "mb": 10**6,
    "mib": 2**20,
    "g": 2**30,
    "gb": 10**9,
    "gib": 2**30,
    "t": 2**40,
    "tb": 10**12,
    "tib": 2**40,
}


def parse_size(text: str | int) -> int:
    """Bytes in ``"10GiB"``, ``"500MB"``, ``"64k"`` or ``"12345"``."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise JobError(f"not a size: {text!r} (try 10GiB, 500MB or a number of bytes)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


# ---------------------------------------------------------------- records


def _keys_of(rec: np.ndarray) -> np.ndarray:
    """The keys of (n, 100) records as native uint64 in byte order."""
    return np.ascontiguousarray(rec[:, :KEY_SIZE]).view(">u8").ravel().astype(np.uint64)


def _key_text(key: int) -> str:
    return int(key).to_bytes(KEY_SIZE, "big").decode("latin-1")


def _line_of(path: str, offset: int) -> int:
    """1-based number of the line holding byte ``offset`` of ``path``."""
    lines = 1
    with open(path, "rb") as f:
        left = offset
        while left > 0:
            chunk = f.read(min(left, 1 << 24))
            if not chunk:
                break
            lines += chunk.count(b"\n")
            left -= len(chunk)
    return lines


def _check(data: np.ndarray, path: str, offset: int) -> np.ndarray:
    """``data`` (bytes of ``path`` from ``offset``) as (n, 100) records;
    MalformedRecord naming the first line that is not one."""
    n = len(data) // RECORD_SIZE
    rec = data[: n * RECORD_SIZE].reshape(n, RECORD_SIZE)
    # Fast path: a TAB and an LF in place on every record, and no other LF
    # (counted over the whole buffer), no TAB in any key.
    if (
        len(data) % RECORD_SIZE == 0
        and (rec[:, KEY_SIZE] == TAB).all()
        and (rec[:, RECORD_SIZE - 1] == LF).all()
        and np.count_nonzero(data == LF) == n
        and not (rec[:, :KEY_SIZE] == TAB).any()
    ):
        return rec
    bad = (rec[:, KEY_SIZE] != TAB) | (rec[:, RECORD_SIZE - 1] != LF)
    bad |= (rec[:, :KEY_SIZE] == TAB).any(axis=1)
    bad |= (rec[:, : RECORD_SIZE - 1] == LF).any(axis=1)
    where = np.flatnonzero(bad)
    if len(where) or len(data) % RECORD_SIZE:
        i = int(where[0]) if len(where) else n
        at = offset + i * RECORD_SIZE
        line = _line_of(path, at)
        raw = bytes(data[i * RECORD_SIZE : (i + 1) * RECORD_SIZE])
        nl = raw.find(b"\n")
        length = nl + 1 if nl >= 0 else len(raw)
        if length != RECORD_SIZE:
            why = f"is {length} bytes long" + ("" if nl >= 0 else " with no LF at its end")
        elif raw[KEY_SIZE] != TAB:
            why = "has no TAB after its 8-byte key"
        else:
            why = "has a TAB inside its key"
        raise MalformedRecord(
            f"{path}:{line}: line {why}; a record is an 8-byte key, TAB, 90 bytes and LF "
            f"(100 bytes)",
            path,
            line,
        )
    return rec


def _input_files(directory: str) -> list[str]:
    if not os.path.isdir(directory):
        what = "is not a directory" if os.path.exists(directory) else "does not exist"
        raise JobError(f"input {directory!r} {what}")
    files = sorted(
        os.path.join(directory, f)
        for f in os.listdir(directory)
        if not f.startswith(".") and os.path.isfile(os.path.join(directory, f))
    )
    if not files:
        raise JobError(f"input {directory!r} holds no files")
    return files


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _bar(progress: ProgressFactory | None, what: str, total: int) -> Any:
    return progress(what, total) if progress else _NoProgress()


# ---------------------------------------------------------------- gen


def _key_table(seed: int) -> np.ndarray:
    """65536 distinct printable 8-byte keys, the same for the same seed."""
    rng = np.random.default_rng([seed, 0])
    table = np.unique(rng.integers(33, 127, size=(N_KEYS * 2, KEY_SIZE), dtype=np.uint8), axis=0)
    pick = rng.choice(len(table), size=N_KEYS, replace=False)
    return table[np.sort(pick)]


def _gen_task(path: str, first: int, count: int, seed: int, file_index: int) -> int:
    """Writes records first .. first+count of one file (seeded by position)."""
    table = _key_table(seed)
    rng = np.random.default_rng([seed, 1, file_index, first])
    rec = np.empty((count, RECORD_SIZE), dtype=np.uint8)
    rec[:, :KEY_SIZE] = table[rng.integers(0, N_KEYS, size=count)]
    rec[:, KEY_SIZE] = TAB
    rec[:, KEY_SIZE + 1 : RECORD_SIZE - 1] = rng.integers(
        33, 127, size=(count, RECORD_SIZE - KEY_SIZE - 2), dtype=np.uint8
    )
    rec[:, RECORD_SIZE - 1] = LF
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, rec.data, first * RECORD_SIZE)
    finally:
        os.close(fd)
    return rec.nbytes


def gen_records(
    out: str,
    size: int | str,
    files: int = 10,
    seed: int = 0,
    workers: int | None = None,
    progress: ProgressFactory | None = None,
) -> list[str]:
    """Writes ``size`` bytes of records (rounded down to whole records)
    into ``files`` files ``records-00000.txt`` … in ``out``; the same seed
    gives the same bytes. Returns the paths. Needs no store."""
    total = parse_size(size) // RECORD_SIZE
    if files < 1:
        raise JobError(f"files must be at least 1, not {files}")
    if total < 1:
        raise JobError(f"size {size!r} is less than one {RECORD_SIZE}-byte record")
    os.makedirs(out, exist_ok=True)
    per_chunk = _GEN_CHUNK // RECORD_SIZE
    paths, tasks = [], []
    for i in range(files):
        count = total // files + (1 if i < total % files else 0)
        path = os.path.join(out, f"records-{i:05d}.txt")
        with open(path, "wb") as f:
            f.truncate(count * RECORD_SIZE)
        paths.append(path)
        for first in range(0, count, per_chunk):
            tasks.append((path, first, min(per_chunk, count - first), seed, i))
    bar = _bar(progress, "gen", total * RECORD_SIZE)
    try:
        if workers == 1 or len(tasks) == 1:
            for t in tasks:
                bar.update(_gen_task(*t))
        else:
            with Pool(workers=workers, connect=False) as pool:
                for _, written in pool.run_all(_gen_task, tasks):
                    bar.update(written)
    finally:
        bar.close()
    return paths


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
    total = sum(counts)
    want = min(total, partitions * _SAMPLES_PER_PARTITION)
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
    if not keys:
        return np.zeros(partitions - 1, dtype=np.uint64)
    ks = np.sort(np.array(keys, dtype=np.uint64))
    at = (np.arange(1, partitions) * len(ks)) // partitions
    return ks[np.minimum(at, len(ks) - 1)]


def _splits(files: list[str], split_bytes: int) -> list[tuple[str, int, int]]:
    per = max(1, split_bytes // RECORD_SIZE) * RECORD_SIZE
    out = []
    for path in files:
        size = os.path.getsize(path)
        for off in range(0, size, per):
            out.append((path, off, min(per, size - off)))
    return out


def _map_task(path, offset, length, bounds, spill_dir, reserve):
    """Reads, checks and sorts a split; places its P runs in the store (one
    object) or a spill file. Returns (where, ref, run offsets in bytes)."""
    data = np.fromfile(path, dtype=np.uint8, count=length, offset=offset)
    if len(data) != length:
        raise JobError(f"{path} changed size while being sorted")
    rec = _check(data, path, offset)
    keys = _keys_of(rec)
    order = np.argsort(keys, kind="quicksort")
    part = np.searchsorted(bounds, keys[order], side="right")
    counts = np.bincount(part, minlength=len(bounds) + 1)
    edges = np.concatenate(([0], np.cumsum(counts))) * RECORD_SIZE
    rows = rec.view(f"V{RECORD_SIZE}").ravel()
    client = worker_client()
    st = client.stats()
    if length and st["capacity"] - st["used"] >= length + reserve:
        oid = ObjectID.random()
        try:
            buf = client.create(oid, length)
        except StoreFull:
            buf = None
        if buf is not None:
            try:
                out = np.frombuffer(buf, dtype=f"V{RECORD_SIZE}")
                np.take(rows, order, out=out)
                del out
                client.seal(oid)
            except BaseException:
                client.abort(oid)
                raise
            client.release(oid)
            return "store", oid.binary(), edges.tolist()
    fd, spill = tempfile.mkstemp(dir=spill_dir, suffix=".run")
    with os.fdopen(fd, "wb") as f:
        rows[order].tofile(f)
    return "file", spill, edges.tolist()


def _reduce_task(p: int, sources: list, out_path: str) -> int:
    """Merges partition p's runs (store ranges and file ranges) into out_path."""
    client = worker_client()
    ids = [ObjectID(ref) for where, ref, a, b in sources if where == "store"]
    bufs = iter(client.get_buffers(ids, timeout=0)) if ids else iter(())
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
            order = np.argsort(_keys_of(whole), kind="stable")
            whole.view(f"V{RECORD_SIZE}").ravel()[order].tofile(f)
    return nbytes


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
) -> SortSummary:
    """Sorts the record files in ``input_dir`` into ``partitions`` files
    ``part-00000`` … in ``output_dir``, with ``workers`` processes (default:
    the cores) on the store at ``socket`` (default: $FERROPLASMA_SOCKET, else
    /tmp/ferroplasma.sock). When no store runs there, a private one is
    started for the job (and ``say`` says so). Runs that do not fit in the
    store go to files in ``spill_dir`` (default: a hidden directory in
    ``output_dir``). ``progress(what, total_bytes)`` makes a bar (an object
    with ``update(n)`` and ``close()``), e.g. ``tqdm``.

    Raises MalformedRecord (with the file and line) for a line that is not
    a record, JobError for a missing input.
    """
    if partitions < 1:
        raise JobError(f"partitions must be at least 1, not {partitions}")
    files = _input_files(input_dir)
    total = sum(os.path.getsize(f) for f in files)
    os.makedirs(output_dir, exist_ok=True)
    spill = tempfile.mkdtemp(prefix=".ferroplasma-spill-", dir=spill_dir or output_dir)
    started = time.perf_counter()
    try:
        with job_store(socket, _store_memory(total), say) as client:
            private = client.socket != (socket or default_socket())
            own_pool = not isinstance(workers, Pool)
            pool = Pool(client.socket, workers) if own_pool else workers
            try:
                summary = _run_sort(
                    client, pool, files, total, output_dir, partitions, split_size, spill, progress
                )
            finally:
                if own_pool:
                    pool.close()
        summary.private_store = private
        summary.seconds = time.perf_counter() - started
        return summary
    finally:
        shutil.rmtree(spill, ignore_errors=True)


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
) -> SortSummary:
    bounds = _sample_boundaries(files, partitions)
    splits = _splits(files, parse_size(split_size))
    # Room kept for the splits other workers may be placing at the same time.
    reserve = max((n for _, _, n in splits), default=0) * (pool.workers - 1)
    held: dict[int, Any] = {}  # map index -> buffer (keeps its object in the store)
    results: list[Any] = [None] * len(splits)
    store_bytes = spilled = 0
    t0 = time.perf_counter()
    bar = _bar(progress, "map", total)
    try:
        for i, res in pool.run_all(
            _map_task, [(p, off, n, bounds, spill, reserve) for p, off, n in splits]
        ):
            where, ref, _ = results[i] = res
            if where == "store":
                (buf,) = client.get_buffers([ObjectID(ref)], timeout=0)
                if buf is None:
                    raise JobError(f"split {i}: its runs left the store before the job held them")
                held[i] = buf
                store_bytes += splits[i][2]
            else:
                spilled += splits[i][2]
            bar.update(splits[i][2])
        bar.close()
        t1 = time.perf_counter()
        bar = _bar(progress, "reduce", total)
        outputs = [os.path.join(output_dir, f"part-{p:05d}") for p in range(partitions)]
        tasks = []
        for p in range(partitions):
            sources = [(w, ref, e[p], e[p + 1]) for w, ref, e in results]
            tasks.append((p, sources, outputs[p]))
        for _, written in pool.run_all(_reduce_task, tasks):
            bar.update(written)
        bar.close()
        t2 = time.perf_counter()
    finally:
        bar.close()
        ids = [ObjectID(r[1]) for r in results if r is not None and r[0] == "store"]
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
    )


# ---------------------------------------------------------------- validate


# Odd multipliers for the 12 eight-byte words and the 4-byte tail of a record.
_MULT = (
    np.random.default_rng(4004).integers(1, 2**63, size=13, dtype=np.uint64) * np.uint64(2) + 1
).astype(np.uint64)


def _digest(rec: np.ndarray) -> tuple[int, int]:
    """(count, sum of per-record 64-bit hashes mod 2**64): equal for equal
    multisets of records, whatever their order."""
    if not len(rec):
        return 0, 0
    words = np.ascontiguousarray(rec[:, :96]).view("<u8")
    tail = np.ascontiguousarray(rec[:, 96:]).view("<u4").ravel().astype(np.uint64)
    with np.errstate(over="ignore"):
        h = (words * _MULT[:12]).sum(axis=1, dtype=np.uint64) + tail * _MULT[12]
        h ^= h >> np.uint64(31)
        h *= np.uint64(0x9E3779B97F4A7C15)
        h ^= h >> np.uint64(29)
    return len(rec), int(h.sum(dtype=np.uint64))


def _scan_task(path: str, offset: int, length: int, output: bool):
    """(records, digest, first key, last key, problem or None) of a split;
    a malformed output line is a problem, a malformed input line an error."""
    data = np.fromfile(path, dtype=np.uint8, count=length, offset=offset)
    try:
        rec = _check(data, path, offset)
    except MalformedRecord as e:
        if not output:
            raise
        return 0, 0, None, None, str(e)
    n, h = _digest(rec)
    if not n:
        return 0, 0, None, None, None
    keys = _keys_of(rec)
    problem = None
    if output:
        down = np.flatnonzero(keys[1:] < keys[:-1])
        if len(down):
            line = offset // RECORD_SIZE + int(down[0]) + 2
            problem = f"{path}:{line}: line's key is less than the line before it"
    return n, h, int(keys[0]), int(keys[-1]), problem


@dataclasses.dataclass
class ValidationReport:
    """What :func:`validate_records` found; ``ok`` when ``problems`` is empty."""

    input_records: int
    output_records: int
    input_checksum: int
    output_checksum: int
    partitions: int
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        if self.ok:
            return (
                f"OK: {self.output_records:,} records in {self.partitions} partitions, each "
                f"sorted, key ranges ordered and disjoint, checksum {self.output_checksum:016x} "
                f"equals the input's"
            )
        return "INVALID:\n  " + "\n  ".join(self.problems)


def validate_records(
    input_dir: str,
    output_dir: str,
    workers: int | None = None,
    progress: ProgressFactory | None = None,
) -> ValidationReport:
    """Checks ``output_dir`` (partition files in name order) against
    ``input_dir``: every output line a record, each file sorted by key,
    the files' key ranges in order and disjoint (a key in one file only),
    and the multiset of records equal to the input's (count and checksum).
    Needs no store."""
    inputs = _input_files(input_dir)
    outputs = _input_files(output_dir)
    tasks = [(p, o, n, False) for p, o, n in _splits(inputs, DEFAULT_SPLIT)]
    n_in = len(tasks)
    tasks += [(p, o, n, True) for p, o, n in _splits(outputs, DEFAULT_SPLIT)]
    results: list[Any] = [None] * len(tasks)
    total = sum(t[2] for t in tasks)
    bar = _bar(progress, "validate", total)
    try:
        if workers == 1:
            for i, t in enumerate(tasks):
                results[i] = _scan_task(*t)
                bar.update(t[2])
        else:
            with Pool(workers=workers, connect=False) as pool:
                for i, res in pool.run_all(_scan_task, tasks):
                    results[i] = res
                    bar.update(tasks[i][2])
    finally:
        bar.close()
    problems = []
    in_n = sum(r[0] for r in results[:n_in])
    in_h = sum(r[1] for r in results[:n_in]) % 2**64
    out_n = sum(r[0] for r in results[n_in:])
    out_h = sum(r[1] for r in results[n_in:]) % 2**64
    # Sorted inside each split, across a file's splits, and across files.
    prev_path, prev_last = None, None
    for (path, offset, _, _), (n, _, first, last, problem) in zip(tasks[n_in:], results[n_in:]):
        if problem:
            problems.append(problem)
        if not n:
            continue
        if prev_last is not None:
            if path == prev_path and first < prev_last:
                line = offset // RECORD_SIZE + 1
                problems.append(f"{path}:{line}: line's key is less than the line before it")
            elif path != prev_path and first <= prev_last:
                problems.append(
                    f"{path} starts with key {_key_text(first)!r}, not after the last key "
                    f"{_key_text(prev_last)!r} of {prev_path}: partitions overlap or are out "
                    f"of order"
                )
        prev_path, prev_last = path, last
    if out_n != in_n:
        problems.append(f"the output has {out_n:,} records, the input {in_n:,}")
    elif out_h != in_h:
        problems.append(
            f"the output's records differ from the input's (checksum {out_h:016x}, "
            f"input {in_h:016x})"
        )
    return ValidationReport(in_n, out_n, in_h, out_h, len(outputs), problems)


def iter_records(path: str) -> Iterator[bytes]:
    """The records of one file, as bytes (for small files and tests)."""
    with open(path, "rb") as f:
        while rec := f.read(RECORD_SIZE):
            yield rec
