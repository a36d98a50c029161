"""Every Python block of README.md and docs/*.md runs as written.

Each ```python block runs in a fresh interpreter, in an empty working
directory, against a real store ($FERROPLASMA_SOCKET). A block that needs
more declares it on its first line, and this test provides it:

- ``# doc-test: cluster``: two stores in one cluster; the block reaches them
  as ``/tmp/a.sock`` and ``/tmp/b.sock`` (the names docs/cluster.md starts
  them with), which this test points at its own temporary sockets.
- ``# doc-test: scan-server``: a scan server at ``datahost:7700`` (pointed at
  a local one) whose root holds the datasets the docs query:
  ``events.parquet``, ``events/`` and ``tpch/lineitem.parquet``.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ferroplasma as fp
from conftest import eventually, member_address

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
DIRECTIVE = re.compile(r"#\s*doc-test:\s*([\w-]+)")


def _blocks() -> list:
    out = []
    for path in DOCS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            rel = path.relative_to(ROOT)
            out.append(pytest.param(m.group(1), id=f"{rel}:{line}"))
    return out


@pytest.fixture(scope="module")
def store():
    with fp.start_store("2GiB") as s:
        yield s


@pytest.fixture(scope="module")
def cluster():
    token = "doc-test"
    common = {"cluster_token": token, "heartbeat_interval": "100ms", "peer_timeout": "2s"}
    with fp.start_store("512MiB", cluster_listen="127.0.0.1:0", **common) as a:
        seed = member_address(a.connect())
        with fp.start_store("512MiB", cluster_listen="127.0.0.1:0", join=seed, **common) as b:
            client = b.connect()
            eventually(
                lambda: (
                    sum(
                        m["health"] in ("this", "alive") for m in client.cluster_status()["members"]
                    )
                    == 2
                ),
                what="the two members to see each other",
            )
            yield {"/tmp/a.sock": a.socket, "/tmp/b.sock": b.socket}


@pytest.fixture(scope="module")
def scan_server(store, tmp_path_factory):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("scan-root")
    rng = np.random.default_rng(0)
    n = 50_000
    events = pa.table({"a": np.arange(n), "b": rng.random(n), "c": rng.integers(0, 10, n)})
    pq.write_table(events, root / "events.parquet")
    (root / "events").mkdir()
    pq.write_table(events, root / "events" / "part-0.parquet")
    (root / "tpch").mkdir()
    lineitem = pa.table(
        {
            "l_orderkey": np.arange(n),
            "l_quantity": rng.integers(1, 51, n),
            "l_extendedprice": rng.random(n) * 1000,
        }
    )
    pq.write_table(lineitem, root / "tpch" / "lineitem.parquet")
    with fp.scan.ScanServer("127.0.0.1:0", root, store_socket=store.socket).start() as srv:
        yield {"datahost:7700": srv.address}


@pytest.fixture(scope="module")
def dask(store, tmp_path_factory):
    """A Dask scheduler and one worker using the doc tests' store, and
    record files to sort (for docs/jobs.md)."""
    from ferroplasma.jobs import records
    from ferroplasma.jobs.hosts import start_scheduler, start_worker

    with contextlib.ExitStack() as stack:
        address = start_scheduler(stack)
        start_worker(stack, address, store.socket, name="doc-worker", nthreads=2)
        root = tmp_path_factory.mktemp("dask-doc")
        records.gen_records(str(root / "in"), "2MB", files=2, seed=1, workers=1)
        from distributed import Client

        with Client(address, timeout=60) as c:
            c.wait_for_workers(1, timeout=60)
        yield {
            "tcp://SCHEDULER:8786": address,
            "/shared/in": str(root / "in"),
            "/shared/out": str(root / "out"),
        }


@pytest.mark.parametrize("code", _blocks())
def test_doc_block_runs_as_written(code, store, request, tmp_path):
    names: dict[str, str] = {}
    first = code.splitlines()[0] if code.strip() else ""
    m = DIRECTIVE.search(first)
    if m:
        need = m.group(1)
        assert need in ("cluster", "scan-server", "dask"), f"unknown doc-test directive {need!r}"
        names = request.getfixturevalue(need.replace("-", "_"))
    for doc_name, real in names.items():
        code = code.replace(doc_name, real)
    env = dict(os.environ, FERROPLASMA_SOCKET=store.socket, PYTHONUNBUFFERED="1")
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, f"the block failed:\n{code}\n--- stderr:\n{out.stderr[-3000:]}"


def test_every_doc_with_python_is_collected():
    ids = {p.id.split(":")[0] for p in _blocks()}
    assert "README.md" in ids and "docs/python.md" in ids and "docs/scan.md" in ids


def test_make_help_lines_up():
    """`make help`'s descriptions start in one column, however long a
    target's name."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(
        ["make", "-s", "help"], cwd=root, capture_output=True, text=True, timeout=60
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("  make ")]
    assert len(lines) > 10, out
    columns = {len(ln) - len(ln[len("  make ") :].split(None, 1)[1]) for ln in lines}
    assert len(columns) == 1, lines


def test_make_build_installs_quietly():
    """`make build` printed 17 lines of pip's `Ignoring numpy: markers
    'extra == …'` (maturin hands pip every optional dependency) on every
    build. The build's maturin runs with pip quiet; its own progress stays."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(
        ["make", "-n", "build"], cwd=root, capture_output=True, text=True, timeout=60
    )
    develop = [ln for ln in out.stdout.splitlines() if "maturin develop" in ln]
    assert len(develop) == 1, out.stdout
    assert "PIP_QUIET=1" in develop[0].split("maturin")[0]
    assert " -q" not in develop[0] and "--quiet" not in develop[0]
