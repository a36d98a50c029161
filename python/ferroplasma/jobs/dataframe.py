"""Parallel sample sort of a DataFrame held in the store, as described in
"Plasma In-Memory Object Store" (Moritz and Nishihara, 2017).

The K input partitions are DataFrames in the store. Worker processes:

1. **sample** each partition (a few hundred rows each, with their weight);
   the driver sorts the samples and picks L-1 bucket boundaries;
2. **split**: sort each partition and cut it at the boundaries; each of the
   K×L sorted slices goes back into the store;
3. **merge**: for each bucket, get its K slices, merge them, and put the
   sorted bucket into the store (the slices are deleted).

Only object ids (and the small samples) pass between processes.

Order: rows are ordered by the ``by`` columns as ``DataFrame.sort_values``
orders them (NaN last), and equal keys keep their input order (partition
by partition, row by row) — so the concatenated buckets equal
``pd.concat(parts).sort_values(by, kind="stable")``. Because the input
position breaks ties inside the sort key, boundaries can fall inside a run
of equal keys: many duplicates still spread over all buckets.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from .._ids import ObjectID
from ..client import Client
from ..errors import JobError, ObjectExists, ObjectLost
from .dask_pool import DaskPool, is_dask_client, member_of, place, unique_ids
from .pool import Pool, worker_client

__all__ = ["sort_dataframe"]

# The tie-breaking position of row r of partition q: (q << 40) | r.
_POS = "__ferroplasma_pos"
_ROW_BITS = 40
# Sample rows per bucket and partition (the driver sorts K*L*_OVERSAMPLE rows).
_OVERSAMPLE = 64


def sort_dataframe(
    client: Client,
    parts: Sequence[ObjectID],
    by: str | Sequence[str],
    workers: int | Pool | None = None,
    buckets: int | None = None,
    *,
    ascending: bool | Sequence[bool] = True,
) -> list[ObjectID]:
    """Sorts the DataFrame made of the partitions ``parts`` (ids of
    DataFrames in the store, in order) by the column(s) ``by``, in
    ``workers`` processes (a number, default: the cores, or a :class:`Pool`;
    or a ``distributed.Client``: the tasks run on its Dask workers, each
    using the store of its host, see docs/jobs.md),
    ascending unless ``ascending=False`` (or one flag per column).

    Returns the ids of ``buckets`` sorted DataFrames in the store (default:
    as many as ``parts``); concatenated in order, they are the whole frame
    sorted, ties in input order. The inputs are left in the store.

    >>> parts = [client.put(df) for df in np.array_split(frame, 8)]  # doctest: +SKIP
    >>> out = fp.jobs.sort_dataframe(client, parts, "key", workers=4)  # doctest: +SKIP
    >>> sorted_frame = pd.concat(client.get(out))                       # doctest: +SKIP

    Raises JobError for bad arguments (an unknown column, no partitions
    to read) and whatever a worker raised.
    """
    cols = [by] if isinstance(by, str) else list(by)
    if not cols:
        raise JobError("by: name at least one column to sort by")
    asc = [bool(ascending)] * len(cols) if isinstance(ascending, bool) else list(ascending)
    if len(asc) != len(cols):
        raise JobError(f"ascending has {len(asc)} entries for {len(cols)} columns")
    ids = [ObjectID(bytes(p.binary() if isinstance(p, ObjectID) else p)) for p in parts]
    if not ids:
        return []
    n_buckets = buckets if buckets is not None else len(ids)
    if n_buckets < 1:
        raise JobError(f"buckets must be at least 1, not {n_buckets}")

    if is_dask_client(workers):
        return _sort_on_dask(client, DaskPool(workers), ids, cols, asc, n_buckets)
    if isinstance(workers, DaskPool):
        return _sort_on_dask(client, workers, ids, cols, asc, n_buckets)
    own = not isinstance(workers, Pool)
    pool = Pool(client.socket, workers) if own else workers
    slices: list[list[ObjectID]] = []
    out: list[Any] = []
    try:
        samples: list[Any] = [None] * len(ids)
        for q, res in pool.run_all(
            _sample_task, [(q, oid, cols, n_buckets) for q, oid in enumerate(ids)]
        ):
            samples[q] = res
        bounds = _choose_boundaries(samples, cols, asc, n_buckets)
        slices = [[] for _ in ids]
        for q, res in pool.run_all(
            _split_task,
            [(q, oid, cols, asc, bounds, n_buckets) for q, oid in enumerate(ids)],
            discard=lambda r: client.delete(r[0]),
        ):
            slices[q] = res[0]
        out = [None] * n_buckets
        merge_args = [([s[j] for s in slices], cols, asc) for j in range(n_buckets)]
        for j, res in pool.run_all(_merge_task, merge_args, discard=client.delete):
            out[j] = res
        return out
    except BaseException:
        leftovers = [oid for row in slices for oid in row]
        leftovers += [oid for oid in out if oid is not None]
        if leftovers:
            client.delete(leftovers)
        raise
    finally:
        if own:
            pool.close()


# Seconds a task waits for an object held on another host.
_FETCH_TIMEOUT = 120.0
# How many times the sort makes lost slices again before giving up.
_RECOVERIES = 3
# The key under which bucket j's output id is derived (slices use (q, j)).
_OUT = 1 << 40


def _sort_on_dask(
    client: Client, pool: DaskPool, ids: list[ObjectID], cols, asc, n_buckets: int
) -> list[ObjectID]:
    """The same three phases with Dask scheduling the tasks across hosts:
    each task runs where its input lies (the split of partition q where q
    is; a bucket's merge where most of its slices are, each host taking its
    share). Slices and outputs get ids derived from the job, so that a task
    Dask runs twice remakes the same object, and everything any execution
    made is deleted; slices lost with a host are made again."""
    job = os.urandom(16)
    held = client.list(cluster=True)
    members = list(pool.workers_of)
    at = place([{held[o]["members"][0]: 1} if o in held else {} for o in ids], members)
    t = _FETCH_TIMEOUT
    ok = False
    try:
        samples: list[Any] = [None] * len(ids)
        for q, res in pool.run_all(
            _sample_task,
            [(q, oid, cols, n_buckets, t) for q, oid in enumerate(ids)],
            where=at,
        ):
            samples[q] = res
        bounds = _choose_boundaries(samples, cols, asc, n_buckets)
        split: list[Any] = [None] * len(ids)
        split_args = [(q, oid, cols, asc, bounds, n_buckets, t, job) for q, oid in enumerate(ids)]

        def run_splits(which: list[int]) -> None:
            for k, res in pool.run_all(
                _split_task, [split_args[q] for q in which], where=[at[q] for q in which]
            ):
                split[which[k]] = res

        run_splits(list(range(len(ids))))
        out: list[Any] = [None] * n_buckets
        pending = list(range(n_buckets))
        for attempt in range(_RECOVERIES + 1):
            weights = [{} for _ in pending]
            for w, j in zip(weights, pending):
                for _, member, rows in split:
                    w[member] = w.get(member, 0) + rows[j]
            args = [([s[0][j] for s in split], cols, asc, t, job, j) for j in pending]
            try:
                for k, res in pool.run_all(_merge_task, args, where=place(weights, members)):
                    out[pending[k]] = res
                    pending[k] = -1
                break
            except ObjectLost:
                if attempt == _RECOVERIES:
                    raise
                pending = [j for j in pending if j >= 0]
                lost = [
                    q for q, s in enumerate(split) if not all(client.contains(s[0], cluster=True))
                ]
                if any(o not in held or not client.contains(o, cluster=True) for o in ids):
                    raise  # an input partition itself is gone: nothing to redo it from
                run_splits(lost)
        ok = True
        return out
    finally:
        # Every slice any execution made; on failure, the outputs too.
        doomed = {
            o for q in range(len(ids)) for j in range(n_buckets) for o in unique_ids(job, q, j)
        }
        if not ok:
            doomed |= {o for j in range(n_buckets) for o in unique_ids(job, _OUT, j)}
        client.delete(list(doomed))


# ---------------------------------------------------------------- ordering


def _fast_keys(frame: pd.DataFrame, cols: list[str], asc: list[bool]) -> np.ndarray | None:
    """A numpy array whose ascending numpy order is the requested order, when
    one column of a plain numeric/datetime dtype without NaN/NaT is sorted
    (the fast path); None otherwise (pandas sorts)."""
    if len(cols) != 1:
        return None
    col = frame[cols[0]]
    dtype = col.dtype
    if not isinstance(dtype, np.dtype) or dtype.kind not in "iubfmM":
        return None
    values = col.to_numpy()
    if dtype.kind == "f":
        if np.isnan(values).any():
            return None
        return values if asc[0] else -values
    if dtype.kind in "mM":
        values = values.view("i8")
        if (values == np.iinfo("i8").min).any():  # NaT
            return None
    elif dtype.kind == "b":
        values = values.view(np.uint8)
    # ~x reverses the order of any integer type without overflow.
    return values if asc[0] else ~values


def _stable_argsort(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A stable argsort and the sorted keys: the (SIMD) quicksort, then
    equal keys put back in input order; the merge sort when ties are many."""
    order = np.argsort(keys, kind="quicksort")
    sk = keys[order]
    if len(keys) < 2:
        return order, sk
    eq = sk[1:] == sk[:-1]
    n_eq = int(np.count_nonzero(eq))
    if n_eq == 0:
        return order, sk
    if n_eq > len(keys) // 20:
        order = np.argsort(keys, kind="stable")
        return order, keys[order]
    tied = np.zeros(len(keys), dtype=bool)
    tied[1:] |= eq
    tied[:-1] |= eq
    at = np.flatnonzero(tied)
    group = np.cumsum(np.concatenate(([True], ~eq)))[at]
    sub = order[at]
    order[at] = sub[np.lexsort((sub, group))]
    return order, sk  # ties moved only among equal keys: sk is unchanged


def _pandas_order(frame: pd.DataFrame, cols: list[str], asc: list[bool]) -> np.ndarray:
    """Positions of ``frame``'s rows in the requested order (ties: input order)."""
    if not len(frame):
        return np.zeros(0, dtype=np.intp)
    tagged = frame[cols].reset_index(drop=True)
    s = tagged.sort_values(cols, ascending=asc, kind="stable", na_position="last")
    return s.index.to_numpy()


def _check_columns(frame: Any, cols: list[str], what: str) -> None:
    if not isinstance(frame, pd.DataFrame):
        raise JobError(f"{what} is a {type(frame).__name__}, not a pandas DataFrame")
    missing = [c for c in cols if c not in frame.columns]
    if missing:
        raise JobError(f"{what} has no column {missing[0]!r} (columns: {list(frame.columns)})")


def _get(oid: ObjectID, what: str, timeout: float = 0) -> Any:
    from ..client import NotAvailable

    obj = worker_client().get(oid, timeout=timeout)
    if obj is NotAvailable:
        raise JobError(f"{what} {oid} is not in the store")
    return obj


# ---------------------------------------------------------------- tasks


def _sample_task(q: int, oid: ObjectID, cols: list[str], n_buckets: int, timeout: float = 0):
    """Phase 1: (row count, sampled key rows with their position, weight)."""
    frame = _get(oid, f"partition {q}", timeout)
    _check_columns(frame, cols, f"partition {q} ({oid})")
    n = len(frame)
    if n >= 1 << _ROW_BITS:
        raise JobError(f"partition {q} has {n} rows; at most 2**{_ROW_BITS} are supported")
    k = min(n, n_buckets * _OVERSAMPLE)
    rows = np.sort(np.random.default_rng(q).choice(n, size=k, replace=False)) if k else []
    sample = frame[cols].iloc[rows].reset_index(drop=True)
    sample[_POS] = (np.int64(q) << _ROW_BITS) | np.asarray(rows, dtype=np.int64)
    return n, sample, (n / k if k else 0.0)


def _choose_boundaries(samples: list, cols: list[str], asc: list[bool], n_buckets: int):
    """L-1 boundary rows (keys and position): quantiles of the weighted samples."""
    frames = [s for _, s, _ in samples if len(s)]
    if n_buckets == 1 or not frames:
        return None
    allrows = pd.concat(frames, ignore_index=True)
    weights = np.concatenate([np.full(len(s), w) for _, s, w in samples if len(s)])
    order = _pandas_order(allrows, [*cols, _POS], [*asc, True])
    cum = np.cumsum(weights[order])
    total = cum[-1]
    cut = np.searchsorted(cum, total * np.arange(1, n_buckets) / n_buckets, side="left")
    cut = np.minimum(cut, len(order) - 1)
    return allrows.iloc[order[cut]].reset_index(drop=True)


def _cut_points(
    frame: pd.DataFrame,
    sk: np.ndarray | None,
    q: int,
    order: np.ndarray,
    cols: list[str],
    asc: list[bool],
    bounds: pd.DataFrame,
) -> np.ndarray:
    """For each boundary, how many of the partition's rows (sorted by
    ``order``; ``sk``: their fast keys in that order, if any) come before it
    in (key, position) order."""
    n = len(frame)
    pos = (np.int64(q) << _ROW_BITS) | order.astype(np.int64)
    bkeys = _fast_keys(bounds, cols, asc) if sk is not None else None
    if sk is not None and bkeys is not None:
        lo = np.searchsorted(sk, bkeys, side="left")
        hi = np.searchsorted(sk, bkeys, side="right")
        bpos = bounds[_POS].to_numpy()
        return np.array(
            [a + np.searchsorted(pos[a:b], p) for a, b, p in zip(lo, hi, bpos)], dtype=np.int64
        )
    # Any dtypes: sort the partition's keys together with the boundaries
    # (pandas' own order, the position breaking ties) and count.
    mine = frame[cols].reset_index(drop=True)
    mine[_POS] = (np.int64(q) << _ROW_BITS) | np.arange(n, dtype=np.int64)
    both = pd.concat([mine, bounds[[*cols, _POS]]], ignore_index=True)
    merged = _pandas_order(both, [*cols, _POS], [*asc, True])
    data_before = np.cumsum(merged < n)
    return data_before[np.flatnonzero(merged >= n)]


def _put_once(client: Client, obj: Any, job: bytes, *key: int) -> ObjectID:
    """Puts ``obj`` under the first free id of ``unique_ids(job, *key)``
    (a random id when there is no job)."""
    if not job:
        return client.put(obj)
    for oid in unique_ids(job, *key):
        try:
            return client.put(obj, object_id=oid)
        except ObjectExists:
            continue  # an earlier execution of this task made it
    raise JobError(f"output {key} of the job was made {len(unique_ids(job, *key))} times")


def _split_task(
    q: int, oid: ObjectID, cols, asc, bounds, n_buckets: int, timeout: float = 0, job: bytes = b""
) -> tuple[list[ObjectID], str, list[int]]:
    """Phase 2: sort partition q, cut it at the boundaries, put each slice
    (``n_buckets`` of them; no boundaries when there is one bucket or no
    rows anywhere). Returns the slices' ids, the store member they are on
    and their row counts."""
    client = worker_client()
    frame = _get(oid, f"partition {q}", timeout)
    keys = _fast_keys(frame, cols, asc)
    if keys is not None:
        order, sk = _stable_argsort(keys)
    else:
        order, sk = _pandas_order(frame, cols, asc), None
    ordered = frame.take(order)
    if bounds is None or not len(frame):
        cuts = [len(frame)] * (n_buckets - 1)
    else:
        cuts = _cut_points(frame, sk, q, order, cols, asc, bounds).tolist()
    edges = [0, *cuts, len(frame)]
    del frame
    out = []
    try:
        for j, (a, b) in enumerate(zip(edges, edges[1:])):
            out.append(_put_once(client, ordered.iloc[a:b], job, q, j))
    except BaseException:
        client.delete(out)
        raise
    return out, member_of(client), [b - a for a, b in zip(edges, edges[1:])]


def _merge_task(
    slice_ids: list[ObjectID], cols, asc, timeout: float = 0, job: bytes = b"", j: int = 0
) -> ObjectID:
    """Phase 3: merge one bucket's slices (each sorted, in partition order).
    On one host the slices are deleted here; across hosts the driver
    deletes them at the end (Dask may run a merge again)."""
    client = worker_client()
    pieces = [_get(oid, "slice", timeout) for oid in slice_ids]
    whole = pd.concat(pieces) if len(pieces) > 1 else pieces[0]
    keys = _fast_keys(whole, cols, asc)
    # The slices are sorted runs: numpy's stable sort (timsort) merges them.
    order = np.argsort(keys, kind="stable") if keys is not None else _pandas_order(whole, cols, asc)
    result = _put_once(client, whole.take(order), job, _OUT, j)
    del pieces, whole
    if not job:
        client.delete(slice_ids)
    return result
