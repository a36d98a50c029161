"""The query engine behind a scan: DuckDB, locked to one dataset.

Each scan gets its own in-memory DuckDB database with a view named
``dataset`` over the requested files, and nothing else: file access outside
that dataset is switched off (``enable_external_access = false`` with the
dataset as the only allowed path), the configuration is locked, and the SQL
must be exactly one SELECT statement (so no COPY, ATTACH, INSTALL or SET).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import AccessDenied, DatasetNotFound, QueryError

__all__ = ["Dataset", "open_query", "resolve"]

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
    its path pattern, and the path DuckDB may access."""

    def __init__(self, reader: str, pattern: str, allowed: Path, is_dir: bool) -> None:
        self.reader = reader
        self.pattern = pattern
        self.allowed = allowed
        self.is_dir = is_dir


def resolve(root: Path, name: str) -> Dataset:
    """The dataset ``name`` (relative to ``root``). Raises AccessDenied for
    paths that lead outside the root (``..``, absolute, symlinks) and
    DatasetNotFound for anything that is not there or not readable data."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise DatasetNotFound(f"dataset name {name!r} is not a path under the server's root")
    path = (root / name).resolve()
    if path != root and root not in path.parents:
        raise AccessDenied(f"dataset {name!r} is outside the server's root")
    if not path.exists():
        raise DatasetNotFound(f"no dataset {name!r} under the server's root")
    if path.is_dir():
        for ext in (".parquet", ".csv", ".json"):
            if next(path.rglob(f"*{ext}"), None) is not None:
                return Dataset(_READERS[ext], str(path / "**" / f"*{ext}"), path, True)
        raise DatasetNotFound(f"dataset {name!r} is a directory with no .parquet, .csv or .json")
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        known = ", ".join(sorted(_READERS))
        raise DatasetNotFound(f"dataset {name!r} is not a known format ({known})")
    return Dataset(reader, str(path), path, False)


def _quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def open_query(ds: Dataset, sql: str, threads: int | None = None) -> tuple[Any, Any]:
    """Runs ``sql`` over ``ds``: (DuckDB connection, relation). The caller
    keeps the connection for as long as it reads the relation."""
    import duckdb

    if not isinstance(sql, str) or not sql.strip():
        raise QueryError("the query is empty: send one SELECT statement")
    con = duckdb.connect(":memory:")
    try:
        if threads:
            con.execute(f"SET threads = {int(threads)}")
        con.execute(f"CREATE VIEW dataset AS SELECT * FROM {ds.reader}({_quote(ds.pattern)})")
        setting = "allowed_directories" if ds.is_dir else "allowed_paths"
        con.execute(f"SET {setting} = [{_quote(str(ds.allowed))}]")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
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
