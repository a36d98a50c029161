"""``ferroplasma records validate``: checks a record sort's output."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..errors import MalformedRecord
from .pool import Pool
from .record_format import (
    DEFAULT_SPLIT,
    RECORD_SIZE,
    ProgressFactory,
    check,
    input_files,
    key_text,
    keys_of,
    progress_bar,
    split_files,
)

__all__ = ["ValidationReport", "validate_records"]


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
        rec = check(data, path, offset)
    except MalformedRecord as e:
        if not output:
            raise
        return 0, 0, None, None, str(e)
    n, h = _digest(rec)
    if not n:
        return 0, 0, None, None, None
    keys = keys_of(rec)
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
    inputs = input_files(input_dir)
    outputs = input_files(output_dir)
    tasks = [(p, o, n, False) for p, o, n in split_files(inputs, DEFAULT_SPLIT)]
    n_in = len(tasks)
    tasks += [(p, o, n, True) for p, o, n in split_files(outputs, DEFAULT_SPLIT)]
    results: list[Any] = [None] * len(tasks)
    total = sum(t[2] for t in tasks)
    bar = progress_bar(progress, "validate", total)
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
                    f"{path} starts with key {key_text(first)!r}, not after the last key "
                    f"{key_text(prev_last)!r} of {prev_path}: partitions overlap or are out "
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
