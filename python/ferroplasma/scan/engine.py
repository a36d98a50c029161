"""The query engine behind a scan: DuckDB, locked to one dataset.

Each scan gets its own in-memory DuckDB database with a view named
``dataset`` over the requested files, and nothing else: file access outside
that dataset is switched off (``enable_external_access = false`` with the
dataset as the only allowed path), the configuration is locked, and the SQL
must be exactly one SELECT statement (so no COPY, ATTACH, INSTALL or SET).
Every failure is a ScanError subclass (never a bare DuckDB or OS error); one
while opening the dataset names it as the client did, not by its path here.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

from ..errors import AccessDenied, DatasetNotFound, QueryError, ScanError

__all__ = ["MAX_THREADS", "Dataset", "Spares", "open_query", "resolve", "valid_threads"]

#: The most DuckDB threads one query may be given.
MAX_THREADS = 1024

_READERS = {
    ".parquet": "read_parquet",
    ".pq": "read_parquet",
    ".csv": "read_csv",
    ".tsv": "read_csv",
    ".json": "read_json",
    ".ndjson": "read_json",
    ".jsonl": "read_json",
}


class Dataset:
    """A dataset under the root: the DuckDB table function that reads it,
    its path pattern, the path DuckDB may access, and its name as the
    client gave it."""

    def __init__(
        self, reader: str, pattern: str, allowed: Path, is_dir: bool, name: str = ""
    ) -> None:
        self.reader = reader
        self.pattern = pattern
        self.allowed = allowed
        self.is_dir = is_dir
        self.name = name or allowed.name


def valid_threads(threads: object) -> bool:
    """True for a DuckDB thread count a query may run with: None (DuckDB's
    default, every core) or an int from 1 to :data:`MAX_THREADS`."""
    return threads is None or (type(threads) is int and 1 <= threads <= MAX_THREADS)


def resolve(root: Path, name: str) -> Dataset:
    """The dataset ``name`` (relative to ``root``). Raises AccessDenied for
    paths that lead outside the root (``..``, absolute, symlinks) and
    DatasetNotFound for anything that is not there or not readable data
    (a name too long for the file system and symlink loops included)."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise DatasetNotFound(f"dataset name {name!r} is not a path under the server's root")
    try:
        return _resolve(root, name)
    except ScanError:
        raise
    except (OSError, RuntimeError) as e:
        why = getattr(e, "strerror", None) or type(e).__name__
        raise DatasetNotFound(f"dataset {name!r} cannot be opened ({why})") from None


def _resolve(root: Path, name: str) -> Dataset:
    path = (root / name).resolve()
    if path != root and root not in path.parents:
        raise AccessDenied(f"dataset {name!r} is outside the server's root")
    if not path.exists():
        raise DatasetNotFound(f"no dataset {name!r} under the server's root")
    if path.is_dir():
        for ext in (".parquet", ".csv", ".json"):
            if next(path.rglob(f"*{ext}"), None) is not None:
                return Dataset(_READERS[ext], str(path / "**" / f"*{ext}"), path, True, name)
        raise DatasetNotFound(f"dataset {name!r} is a directory with no .parquet, .csv or .json")
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        known = ", ".join(sorted(_READERS))
        raise DatasetNotFound(f"dataset {name!r} is not a known format ({known})")
    return Dataset(reader, str(path), path, False, name)


def _quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


class Spares:
    """Fresh in-memory DuckDB databases made ahead of the scans that will
    use them. Opening one costs about 10 ms (DuckDB 2.0 on two cores:
    ``python -m timeit -s 'import duckdb' 'duckdb.connect().close()'``),
    half of what a small scan takes end to end (the one-row query of
    ``bench/scan_bench.py``); a server keeps one ready, made on a background
    thread whenever the last one is taken. Each database still serves one
    scan only and is closed with it: nothing a query leaves reaches the next.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._ready: Any = None
        self._making = False
        self._waiting = False  # a scan waits for the one being made
        self._maker: threading.Thread | None = None
        self._closed = False

    def take(self) -> Any:
        """A database no query ran on: the ready one, the one being made
        (one scan waits for it: it is part made; scans that come together
        beside it open their own rather than queue), or a new one; then
        another is made in the background."""
        import duckdb

        with self._cond:
            if self._ready is None and self._making and not self._waiting:
                self._waiting = True
                # At most a second: past that, opening its own is no slower.
                self._cond.wait_for(lambda: not self._making, 1.0)
                self._waiting = False
            con, self._ready = self._ready, None
        self.prime()
        return con if con is not None else duckdb.connect(":memory:")

    def prime(self) -> None:
        """Starts making a database in the background unless one is ready
        or being made."""
        with self._cond:
            if self._closed or self._making or self._ready is not None:
                return
            self._making = True
        try:
            # Not a daemon: an interpreter that exits while a thread is inside
            # DuckDB aborts, so exiting waits for it (some 10 ms).
            maker = threading.Thread(target=self._make, name="duckdb-spare")
            maker.start()
            with self._cond:
                self._maker = maker  # (one that never started is not joined)
        except RuntimeError:  # no thread to give: the next scan opens its own
            with self._cond:
                self._making = False
                self._cond.notify_all()

    @property
    def ready(self) -> bool:
        """True while a database waits for the next scan."""
        with self._cond:
            return self._ready is not None

    def wait(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds until none is being made; True
        if one is then ready."""
        with self._cond:
            self._cond.wait_for(lambda: not self._making, timeout)
            return self._ready is not None

    def _make(self) -> None:
        con: Any = None
        try:
            import duckdb

            con = duckdb.connect(":memory:")
        except Exception:  # e.g. out of memory: the next scan opens its own and says why
            con = None
        finally:
            with self._cond:
                kept = not self._closed and con is not None
                if kept:
                    # Ready and no longer making in one step, so that the
                    # scan that takes it starts the next one (whose making
                    # this thread must then leave alone).
                    self._ready, con = con, None
                    self._making = False
                    self._cond.notify_all()
            if not kept:
                if con is not None:  # made after close(): not kept
                    with contextlib.suppress(Exception):
                        con.close()
                # Only now, done with DuckDB: close() waits for this.
                with self._cond:
                    self._making = False
                    self._cond.notify_all()

    def close(self, timeout: float = 10.0) -> None:
        """Closes the ready database, after the one being made (waited for
        up to ``timeout`` seconds: an interpreter that exits while a thread
        is inside DuckDB aborts); none is made after this."""
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: not self._making, timeout)
            con, self._ready = self._ready, None
            maker = self._maker
        if maker is not None and maker is not threading.current_thread():
            maker.join(timeout)
        if con is not None:
            con.close()


def open_query(
    ds: Dataset, sql: str, threads: int | None = None, spares: Spares | None = None
) -> tuple[Any, Any]:
    """Runs ``sql`` over ``ds``: (DuckDB connection, relation). The caller
    keeps the connection for as long as it reads the relation. ``threads``
    is checked here too (ScanError), whoever set it. ``spares``: where the
    fresh database comes from (default: opened here)."""
    import duckdb

    if not isinstance(sql, str) or not sql.strip():
        raise QueryError("the query is empty: send one SELECT statement")
    if not valid_threads(threads):
        raise ScanError(
            f"the scan server's DuckDB threads setting ({threads!r}) is not a whole number "
            f"from 1 to {MAX_THREADS}: fix its --threads"
        )
    con = spares.take() if spares is not None else duckdb.connect(":memory:")
    try:
        try:
            if threads is not None:
                con.execute(f"SET threads = {threads:d}")
            con.execute(f"CREATE VIEW dataset AS SELECT * FROM {ds.reader}({_quote(ds.pattern)})")
            setting = "allowed_directories" if ds.is_dir else "allowed_paths"
            con.execute(f"SET {setting} = [{_quote(str(ds.allowed))}]")
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
        except duckdb.Error as e:  # e.g. a file that is not what its name says
            first = (str(e).splitlines() or [type(e).__name__])[0]
            first = first.replace(str(ds.allowed), ds.name)
            raise QueryError(f"dataset {ds.name!r} cannot be read: {first}") from None
        try:
            statements = con.extract_statements(sql)
        except duckdb.Error as e:
            raise QueryError(str(e)) from None
        if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
            raise QueryError("a scan runs exactly one SELECT statement (no COPY, SET, ...)")
        try:
            rel = con.sql(sql)
        except duckdb.Error as e:
            raise QueryError(str(e)) from None
        if rel is None:
            raise QueryError("the statement returns no rows to scan")
        return con, rel
    except BaseException:
        con.close()
        raise
