"""The record format of the record sort, and what its phases share. The
records are those of "Plasma Map/Reduce Slightly Faster Than Hadoop"
(Stolpmann, 2012).

A record is one 100-byte line: an 8-byte key (no TAB or LF), TAB, 90 bytes
of value (no LF), LF. Keys compare as bytes (as ``LC_ALL=C sort``); as
numbers, they are the 8 bytes read big-endian.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..errors import JobError, MalformedRecord

RECORD_SIZE = 100
KEY_SIZE = 8
TAB, LF = 9, 10
N_KEYS = 65536
DEFAULT_SPLIT = 128 * 2**20

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


def keys_of(rec: np.ndarray) -> np.ndarray:
    """The keys of (n, 100) records as native uint64 in byte order."""
    return np.ascontiguousarray(rec[:, :KEY_SIZE]).view(">u8").ravel().astype(np.uint64)


def key_text(key: int) -> str:
    return int(key).to_bytes(KEY_SIZE, "big").decode("latin-1")


def line_of(path: str, offset: int) -> int:
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


def check(data: np.ndarray, path: str, offset: int) -> np.ndarray:
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
        line = line_of(path, at)
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


def input_files(directory: str) -> list[str]:
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


class NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(progress: ProgressFactory | None, what: str, total: int) -> Any:
    return progress(what, total) if progress else NoProgress()


def split_files(
    files: list[str], split_bytes: int, sizes: list[int] | None = None
) -> list[tuple[str, int, int]]:
    """(path, offset, length) pieces of whole records, at most split_bytes
    each, in file order (``sizes``: the files' sizes, when they are files of
    other hosts)."""
    per = max(1, split_bytes // RECORD_SIZE) * RECORD_SIZE
    out = []
    for k, path in enumerate(files):
        size = sizes[k] if sizes is not None else os.path.getsize(path)
        for off in range(0, size, per):
            out.append((path, off, min(per, size - off)))
    return out


def iter_records(path: str) -> Iterator[bytes]:
    """The records of one file, as bytes (for small files and tests)."""
    with open(path, "rb") as f:
        while rec := f.read(RECORD_SIZE):
            yield rec
