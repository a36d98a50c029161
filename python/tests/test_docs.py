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
- ``# doc-test: scan-server-ucx``: the same server, also at
  ``ucx://datahost:7701`` (skipped without the UCX binding).
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
def scan_root(tmp_path_factory):
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
    return root


@pytest.fixture(scope="module")
def scan_server(store, scan_root):
    with fp.scan.ScanServer("127.0.0.1:0", scan_root, store_socket=store.socket).start() as srv:
        yield {"datahost:7700": srv.address}


@pytest.fixture(scope="module")
def scan_server_ucx(store, scan_root):
    from ferroplasma.scan import ucx

    if not ucx.available():
        pytest.skip("the UCX binding is not installed (pip install ucxx-cu12; make test-ucx)")
    token = "doc-test-ucx-token"  # the snippet reads it from $FERROPLASMA_SCAN_TOKEN
    with fp.scan.ScanServer(
        "127.0.0.1:0",
        scan_root,
        token=token,
        store_socket=store.socket,
        ucx_listen="127.0.0.1:0",
    ).start() as srv:
        old = os.environ.get("FERROPLASMA_SCAN_TOKEN")
        os.environ["FERROPLASMA_SCAN_TOKEN"] = token
        try:
            yield {"ucx://datahost:7701": srv.ucx_address}
        finally:
            if old is None:
                os.environ.pop("FERROPLASMA_SCAN_TOKEN", None)
            else:
                os.environ["FERROPLASMA_SCAN_TOKEN"] = old


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
        known = ("cluster", "scan-server", "scan-server-ucx", "dask")
        assert need in known, f"unknown doc-test directive {need!r}"
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


# ------------------------------------------------------------------ sources
# The background documents are cited by title, authors and year, listed in
# docs/references.md; never by the numbers of the files they came in.
SOURCE_TITLES = [
    "Plasma In-Memory Object Store",
    "Thallus: An RDMA-based Columnar Data Transport Protocol",
    "Memory-Disaggregated In-Memory Object Store Framework for Big Data Applications",
    "Fast Python Serialization with Ray and Apache Arrow",
    "Plasma Map/Reduce Slightly Faster Than Hadoop",
]
SOURCE_NUMBER = re.compile(r"seeds?[\s_-]*00[0-4](?!\d)", re.I)


def _tracked_text_files():
    """(path, text) of every file git tracks in this checkout, binaries
    (a NUL byte in the first 8 KiB) left out."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for raw in names:
        name = raw.decode()
        path = ROOT / name
        if not name or name.startswith("shared/") or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue
        yield name, data.decode("utf-8", "replace")


def test_no_file_names_a_source_by_its_seed_number():
    hits = [
        f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
        for name, text in _tracked_text_files()
        for m in SOURCE_NUMBER.finditer(text)
    ]
    assert not hits, "cite these by title, authors and year (docs/references.md):\n" + "\n".join(
        hits
    )


def test_references_name_every_source():
    path = ROOT / "docs" / "references.md"
    assert path.is_file()
    text = " ".join(path.read_text().split())
    missing = [t for t in SOURCE_TITLES if t not in text]
    assert not missing, missing


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6} +(.+?)\s*$", text, re.M):
        s = _slug(m.group(1))
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def test_links_to_sections_of_the_docs_resolve():
    """Renaming a heading (say, to drop a source's number from it) breaks
    the links to it; every `file.md#anchor` link must name a heading."""
    broken = []
    for path in DOCS:
        for m in re.finditer(r"\]\(([^)\s#]*)#([^)\s]+)\)", path.read_text()):
            target = (path.parent / m.group(1)) if m.group(1) else path
            if target.suffix != ".md":
                continue
            if not target.is_file() or m.group(2) not in _anchors(target):
                broken.append(f"{path.relative_to(ROOT)}: {m.group(0)}")
    assert not broken, broken


def test_generated_sections_sit_under_their_generators_titles():
    """Each generator (bench/*.py) writes between its markers and, for a file
    without them, under its TITLE: docs/benchmarks.md has both, in order."""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    found = 0
    for script in sorted((ROOT / "bench").glob("*.py")):
        src = script.read_text()
        consts = dict(re.findall(r'^(TITLE|BEGIN|END) = "(.*)"$', src, re.M))
        if "TITLE" not in consts:
            continue
        found += 1
        title, begin, end = consts["TITLE"], consts["BEGIN"], consts["END"]
        assert f"\n{title}\n" in text, f"{script.name}: {title!r} is not a heading"
        after = text.split(f"\n{title}\n", 1)[1]
        assert begin in after and end in after.split(begin, 1)[1], script.name
        assert "\n## " not in after.split(begin, 1)[0], (
            f"{script.name}: markers not under {title!r}"
        )
    assert found >= 4


# ------------------------------------------------- one figure, one source
# README.md and docs/cluster.md quote the remote 1000 × 1 kB get of the run
# whose generated section docs/benchmarks.md holds (`make bench-cluster`),
# in one sentence form: "1000 × 1 kB remote objects took R ms against L ms
# locally".
QUOTED_1000X1KB = re.compile(
    r"1000 × 1 kB remote objects took ([\d.]+) ms against ([\d.]+) ms locally"
)


def _cluster_row(label: str) -> dict:
    """A row of the table between the bench-cluster markers of
    docs/benchmarks.md, by column name."""
    src = (ROOT / "bench" / "cluster_report.py").read_text()
    consts = dict(re.findall(r'^(BEGIN|END) = "(.*)"$', src, re.M))
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    section = text.split(consts["BEGIN"], 1)[1].split(consts["END"], 1)[0]
    rows = [
        [c.strip() for c in ln.strip().strip("|").split("|")]
        for ln in section.splitlines()
        if ln.startswith("|")
    ]
    header = next(r for r in rows if "fetch, remote" in r)
    row = next(r for r in rows if r[0] == label)
    return dict(zip(header, row))


def test_docs_quote_the_remote_1000x1kb_get_of_the_generated_run():
    row = _cluster_row("1000×1 kB")
    want = (
        float(row["fetch, remote"].removesuffix(" ms")),
        float(row["fetch, local"].removesuffix(" ms")),
    )
    for name in ["README.md", "docs/cluster.md"]:
        text = " ".join((ROOT / name).read_text().split())
        quoted = [(float(r), float(loc)) for r, loc in QUOTED_1000X1KB.findall(text)]
        assert quoted, f"{name} does not quote the remote 1000 × 1 kB get"
        assert all(q == want for q in quoted), (
            f"{name} quotes {quoted} (remote, local ms); docs/benchmarks.md's run: {want}"
        )
