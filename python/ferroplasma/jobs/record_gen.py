"""``ferroplasma records gen``: seeded, reproducible record files."""

from __future__ import annotations

import contextlib
import os

import numpy as np

from ..errors import JobError
from .pool import Pool
from .record_format import (
    KEY_SIZE,
    LF,
    N_KEYS,
    RECORD_SIZE,
    TAB,
    ProgressFactory,
    parse_size,
    progress_bar,
)

__all__ = ["gen_records"]

_GEN_CHUNK = 64 * 2**20


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
    gives the same bytes. Returns the paths. Needs no store.

    The files are written under temporary names and renamed once all are
    complete: an interrupted run (Ctrl-C, an error) leaves no partial file,
    and files of an earlier run stay as they were."""
    total = parse_size(size) // RECORD_SIZE
    if files < 1:
        raise JobError(f"files must be at least 1, not {files}")
    if total < 1:
        raise JobError(f"size {size!r} is less than one {RECORD_SIZE}-byte record")
    os.makedirs(out, exist_ok=True)
    per_chunk = _GEN_CHUNK // RECORD_SIZE
    paths, partial, tasks = [], [], []
    bar = progress_bar(progress, "gen", total * RECORD_SIZE)
    done = False
    try:
        for i in range(files):
            count = total // files + (1 if i < total % files else 0)
            paths.append(os.path.join(out, f"records-{i:05d}.txt"))
            part = os.path.join(out, f".records-{i:05d}.txt.partial-{os.getpid()}")
            partial.append(part)
            with open(part, "wb") as f:
                f.truncate(count * RECORD_SIZE)
            for first in range(0, count, per_chunk):
                tasks.append((part, first, min(per_chunk, count - first), seed, i))
        if workers == 1 or len(tasks) == 1:
            for t in tasks:
                bar.update(_gen_task(*t))
        else:
            with Pool(workers=workers, connect=False) as pool:
                for _, written in pool.run_all(_gen_task, tasks):
                    bar.update(written)
        for part, path in zip(partial, paths):
            os.replace(part, path)
        done = True
    finally:
        bar.close()
        if not done:
            for part in partial:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(part)
    return paths
