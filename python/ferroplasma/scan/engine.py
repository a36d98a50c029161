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

from pathlib import Path
from typing import Any

from ..errors import AccessDenied, DatasetNotFound, QueryError, ScanError

__all__ = ["MAX_THREADS", "Dataset", "open_query", "resolve", "valid_threads"]

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


def open_query(ds: Dataset, sql: str, threads: int | None = None) -> tuple[Any, Any]:
    """Runs ``sql`` over ``ds``: (DuckDB connection, relation). The caller
    keeps the connection for as long as it reads the relation. ``threads``
    is checked here too (ScanError), whoever set it."""
    import duckdb

    if not isinstance(sql, str) or not sql.strip():
        raise QueryError("the query is empty: send one SELECT statement")
    if not valid_threads(threads):
        raise ScanError(
            f"the scan server's DuckDB threads setting ({threads!r}) is not a whole number "
            f"from 1 to {MAX_THREADS}: fix its --threads"
        )
    con = duckdb.connect(":memory:")
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
