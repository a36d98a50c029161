"""The datasets of ``bench/scan_bench.py``: TPC-H lineitem as Parquet
(generated once with DuckDB 1.5.5 and PyPI's duckdb-extension-tpch, in a
separate virtual environment, bench/.tpch-venv, since the DuckDB 2.x wheel
has no tpch extension), and the sorted query's 3M rows of strings and
nulls."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def prepare(sf: int, data: Path) -> Path:
    """lineitem at scale factor ``sf`` as Parquet (generated once)."""
    out = data / f"lineitem-sf{sf}.parquet"
    if out.exists():
        return out
    data.mkdir(parents=True, exist_ok=True)
    venv = HERE / ".tpch-venv"
    py = venv / "bin" / "python"
    if not py.exists():
        print("creating bench/.tpch-venv (duckdb 1.5.5 + duckdb-extension-tpch)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [
                str(py),
                "-m",
                "pip",
                "install",
                "-q",
                "duckdb==1.5.5",
                "duckdb-extension-tpch==1.5.5",
            ],
            check=True,
        )
    code = (
        "import duckdb, glob, sys\n"
        "ext = glob.glob(sys.prefix + '/lib/python*/site-packages/duckdb_extension_tpch/"
        "**/tpch.duckdb_extension', recursive=True)[0]\n"
        "c = duckdb.connect()\n"
        "c.execute(f\"LOAD '{ext}'\")\n"
        f"c.execute('CALL dbgen(sf={sf})')\n"
        f"c.execute(\"COPY lineitem TO '{out}.tmp' (FORMAT parquet)\")\n"
    )
    print(f"generating TPC-H lineitem sf={sf} into {out}", flush=True)
    subprocess.run([str(py), "-c", code], check=True)
    os.rename(f"{out}.tmp", out)
    return out


SORTED_ROWS = 3_000_000
SORTED_SQL = "SELECT * FROM dataset ORDER BY id"


def prepare_sorted(data: Path) -> Path:
    """3M rows, 8 columns with strings and nulls, ids shuffled (generated
    once): the dataset of the sorted query."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = data / "sorted-3m.parquet"
    if out.exists():
        return out
    data.mkdir(parents=True, exist_ok=True)
    n = SORTED_ROWS
    rng = np.random.default_rng(1)
    words = np.array(["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"])

    def nulls(p: float):
        return rng.random(n) < p

    names = [f"name-{i:08d}" for i in rng.integers(0, 10**8, n)]
    notes = ["x" * int(k) for k in rng.integers(0, 40, n)]
    table = pa.table(
        {
            "id": rng.permutation(n).astype(np.int64),
            "name": pa.array(names, mask=nulls(0.1)),
            "category": pa.array(words[rng.integers(0, 8, n)], mask=nulls(0.05)),
            "value": pa.array(rng.random(n), mask=nulls(0.2)),
            "qty": pa.array(rng.integers(0, 1000, n).astype(np.int32), mask=nulls(0.15)),
            "day": pa.array(rng.integers(0, 20000, n).astype("datetime64[D]")),
            "flag": pa.array(rng.random(n) < 0.5, mask=nulls(0.1)),
            "note": pa.array(notes, mask=nulls(0.3)),
        }
    )
    pq.write_table(table, f"{out}.tmp")
    os.rename(f"{out}.tmp", out)
    return out
