"""The columnar scan transport against a real `ferroplasma scan-server`
process (and DuckDB run locally for the expected answers)."""

from __future__ import annotations

import collections
import contextlib
import os
import socket
import subprocess
import sys
import threading

import pytest

duckdb = pytest.importorskip("duckdb")
pa = pytest.importorskip("pyarrow")

import ferroplasma as fp  # noqa: E402
from conftest import eventually  # noqa: E402
from ferroplasma import arrow_layout  # noqa: E402
from ferroplasma.scan import wire  # noqa: E402

ROWS = 3000
UCX_TOKEN = "ucx-scan-test-token"  # a UCX listener needs one (every interface)

# One expression per kind of Arrow array DuckDB produces; every third row NULL.
TYPES = {
    "i8": "(i % 128)::TINYINT",
    "i16": "(i * 7)::SMALLINT",
    "i32": "i::INTEGER",
    "i64": "i::BIGINT * 1000003",
    "u8": "(i % 200)::UTINYINT",
    "u64": "i::UBIGINT",
    "hugeint": "i::HUGEINT * 17014118346046923173168730371588",
    "f32": "i::FLOAT / 7",
    "f64": "i::DOUBLE / 7",
    "dec_small": "(i / 8)::DECIMAL(4, 1)",
    "dec_big": "(i * 12345.678)::DECIMAL(38, 3)",
    "bool": "i % 2 = 0",
    "str": "'row ' || i || repeat('x', i % 17)",
    "blob": "('b' || i)::BLOB",
    "date": "DATE '2000-01-01' + i::INTEGER",
    "ts": "TIMESTAMP '2000-01-01' + to_seconds(i)",
    "ts_tz": "TIMESTAMPTZ '2000-01-01 00:00:00+00' + to_seconds(i)",
    "ts_ns": "(TIMESTAMP '2000-01-01' + to_seconds(i))::TIMESTAMP_NS",
    "time": "TIME '00:00:00' + to_seconds(i % 86400)",
    "interval": "to_days(i::INTEGER)",
    "uuid": "md5(i::VARCHAR)::UUID",
    "enum": "(['a', 'b', 'c'])[1 + i % 3]::ENUM('a', 'b', 'c')",
    "list": "[i, i + 1, NULL][1 : 1 + i % 3]",
    "list_of_lists": "[[i], [], [i, i]]",
    "list_of_str": "['s' || i, NULL]",
    "fixed_array": "[i, i * 2]::BIGINT[2]",
    "struct": "{'a': i, 'b': 'v' || i, 'c': [i]}",
    "struct_of_struct": "{'x': {'y': i::DOUBLE}}",
    "map": "MAP {'k' || (i % 5): i}",
    "union": "union_value(num := i::INTEGER)::UNION(num INTEGER, s VARCHAR)",
    "null": "NULL",
}


def _select(types: dict[str, str]) -> str:
    cols = ", ".join(
        f"CASE WHEN i % 3 = 0 THEN NULL ELSE {expr} END AS {name}" for name, expr in types.items()
    )
    return f"SELECT {cols} FROM dataset ORDER BY i"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    d = tmp_path_factory.mktemp("scanroot")
    con = duckdb.connect()
    con.execute(f"COPY (SELECT range AS i FROM range({ROWS})) TO '{d}/rows.parquet'")
    con.execute(
        f"COPY (SELECT range AS k, range * 0.5 AS v, 'name ' || range AS s FROM range(300000))"
        f" TO '{d}/big.parquet'"
    )
    (d / "parts").mkdir()
    for p in range(3):
        con.execute(
            f"COPY (SELECT {p} AS part, range AS i FROM range(100)) TO '{d}/parts/p{p}.parquet'"
        )
    (d / "t.csv").write_text("a,b\n1,x\n2,y\n")
    (d / "notes.txt").write_text("not data")
    outside = d.parent / "secret.parquet"
    con.execute(f"COPY (SELECT 42 AS secret) TO '{outside}'")
    os.symlink(outside, d / "link.parquet")
    return d


def _local(root, dataset: str, sql: str):
    """The expected answer: DuckDB run here, on the same file."""
    con = duckdb.connect()
    con.execute(f"CREATE VIEW dataset AS SELECT * FROM read_parquet('{root / dataset}')")
    return con.sql(sql).to_arrow_table()


@pytest.fixture(scope="module")
def server(root):
    """`ferroplasma scan-server` as a process, on a port the system picks
    (it prints the address it serves on)."""
    proc = subprocess.Popen(
        [
            os.path.join(os.path.dirname(sys.executable), "ferroplasma"),
            "scan-server",
            "--listen",
            "127.0.0.1:0",
            "--root",
            str(root),
            "--no-store",
            "--threads",
            "2",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert "serving" in line, line
    yield line.split(" on ")[-1].strip()
    proc.terminate()
    assert proc.wait(timeout=10) == 0


@pytest.fixture
def scan(server):
    with fp.scan.connect(server) as c:
        yield c


@pytest.fixture(scope="module")
def ucx_server(root):
    """The same server with UCX too (`--ucx-listen`): its ucx:// address.
    Skipped where the UCX binding is not installed (`make test-ucx` installs
    it and runs these)."""
    from ferroplasma.scan import ucx

    if not ucx.available():
        pytest.skip("the UCX binding is not installed (pip install ucxx-cu12; make test-ucx)")
    cmd = [os.path.join(os.path.dirname(sys.executable), "ferroplasma"), "scan-server"]
    cmd += ["--listen", "127.0.0.1:0", "--ucx-listen", "127.0.0.1:0", "--root", str(root)]
    cmd += ["--no-store", "--threads", "2", "--log-level", "error"]
    env = {**os.environ, "FERROPLASMA_SCAN_TOKEN": UCX_TOKEN}  # UCX needs one
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    assert " and ucx://" in line, line
    yield line.split(" and ")[-1].strip()
    proc.terminate()
    assert proc.wait(timeout=10) == 0


@pytest.fixture(params=["tcp", "ucx"])
def any_scan(request, server):
    """A client over each transport: TCP (the native data path) and UCX."""
    ucx = request.param == "ucx"
    address = request.getfixturevalue("ucx_server") if ucx else server
    with fp.scan.connect(address, token=UCX_TOKEN if ucx else None) as c:
        yield c


def _assert_bit_exact(got, expected):
    """Same schema, values and null positions, and every buffer of every
    column holds the same bytes where Arrow defines them."""
    assert got.schema.equals(expected.schema)
    got.validate(full=True)
    for name in expected.column_names:
        a = got.column(name).combine_chunks()
        b = expected.column(name).combine_chunks()
        assert a.equals(b), name
        assert a.is_null().equals(b.is_null()), name


@pytest.mark.parametrize("batch_rows", [None, 256])
def test_every_duckdb_type_round_trips_bit_exact(any_scan, root, batch_rows):
    sql = _select(TYPES)
    got = any_scan.query(sql, "rows.parquet", batch_rows=batch_rows).read_all()
    expected = _local(root, "rows.parquet", sql)
    assert got.num_rows == ROWS
    _assert_bit_exact(got, expected)
    if batch_rows:
        assert got.num_columns and len(got.column(0).chunks) == -(-ROWS // batch_rows)


def test_the_received_buffers_are_64_byte_aligned_and_the_wire_carries_them_all(any_scan, root):
    batch = any_scan.query(_select(TYPES), "rows.parquet").read_next_batch()
    _, bufs = arrow_layout.flatten(batch)
    assert all(b.address % 64 == 0 for b in bufs)
    # Validity bitmaps travel: every column with nulls kept them.
    for col in batch.columns:
        if not pa.types.is_null(col.type) and not pa.types.is_union(col.type):
            assert col.null_count == ROWS // 3 and col.buffers()[0] is not None


def test_the_serializing_baseline_gives_the_same_answer(scan, root):
    sql = _select({k: TYPES[k] for k in ("i64", "str", "list", "struct")})
    got = scan.query(sql, "rows.parquet", wire_format="ipc", batch_rows=500).read_all()
    _assert_bit_exact(got, _local(root, "rows.parquet", sql))


def test_an_empty_result_keeps_its_schema(any_scan, root):
    sql = "SELECT k, s FROM dataset WHERE k < 0"
    got = any_scan.to_table(sql, "big.parquet")
    assert got.num_rows == 0
    assert got.schema.equals(_local(root, "big.parquet", sql).schema)


def test_a_huge_single_batch(any_scan, root):
    # 2M rows, ~70 MB in one batch (DuckDB makes one batch of a range scan).
    sql = "SELECT range AS k, range * 0.5 AS v, 'name ' || range AS s FROM range(2000000)"
    batches = list(any_scan.query(sql, "rows.parquet", batch_rows=1 << 22, materialize=True))
    assert [b.num_rows for b in batches] == [2_000_000]
    _assert_bit_exact(pa.Table.from_batches(batches), _local(root, "rows.parquet", sql))


def test_over_ucx_errors_are_typed_and_batches_land_in_the_store(ucx_server, root):
    with fp.scan.connect(ucx_server, token=UCX_TOKEN) as scan:
        with pytest.raises(fp.errors.QueryError, match="convert"):
            scan.to_table("SELECT CAST(s AS INT) FROM dataset", "big.parquet")
        with pytest.raises(fp.errors.DatasetNotFound):
            scan.to_table("SELECT 1", "missing.parquet")
        with fp.start_store("256MiB") as store:
            client = store.connect()
            sql = _select(TYPES)
            ids = scan.query(sql, "rows.parquet", into_store=client, batch_rows=1000)
            assert len(ids) == 3
            got = pa.Table.from_batches(client.get(ids))
            _assert_bit_exact(got, _local(root, "rows.parquet", sql))
        # The failed scan's connection was dropped: the server frees it.
        eventually(lambda: scan.status()["scans"] == 0, what="no scan left open")


def test_directories_and_csv_are_datasets(scan):
    t = scan.to_table(
        "SELECT part, count(*) AS n FROM dataset GROUP BY part ORDER BY part", "parts"
    )
    assert t.to_pydict() == {"part": [0, 1, 2], "n": [100, 100, 100]}
    assert scan.to_table("SELECT b FROM dataset ORDER BY a", "t.csv").column(0).to_pylist() == [
        "x",
        "y",
    ]


def test_concurrent_scans_from_many_clients(server, root):
    expected = _local(root, "big.parquet", "SELECT k, s FROM dataset WHERE k % 7 = 3 ORDER BY k")
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            with fp.scan.connect(server) as c:
                for _ in range(2):
                    t = c.to_table(
                        "SELECT k, s FROM dataset WHERE k % 7 = 3 ORDER BY k",
                        "big.parquet",
                        batch_rows=4096 * (1 + i),
                    )
                    assert t.equals(expected)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with fp.scan.connect(server) as c:
        eventually(lambda: c.status()["scans"] == 0, what="every scan finalized")


def test_a_client_that_dies_mid_scan_frees_its_scan(server, scan):
    code = (
        "import os, ferroplasma as fp\n"
        f"r = fp.scan.connect({server!r}).query('SELECT * FROM dataset', 'big.parquet',"
        " batch_rows=1000)\n"
        "r.read_next_batch()\n"
        "print('started', flush=True)\n"
        "os._exit(0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "started" in out.stdout, out.stderr
    eventually(lambda: scan.status()["scans"] == 0, what="the dead client's scan freed")
    # A reader dropped half-way frees its scan too, and the server carries on.
    r = scan.query("SELECT * FROM dataset", "big.parquet", batch_rows=1000)
    r.read_next_batch()
    del r
    eventually(lambda: scan.status()["scans"] == 0, what="the dropped reader's scan freed")
    assert scan.to_table("SELECT count(*) AS n FROM dataset", "big.parquet")["n"][0].as_py() == (
        300_000
    )


def test_reading_a_scan_runs_no_python_per_batch(scan):
    """The batches reach pyarrow through the Arrow C stream of a native
    receiver: reading 300 of them calls no Python function at all (the
    receiver of old yielded each batch from a Python generator and built it
    with arrow_layout.rebuild, several calls per buffer)."""
    reader = scan.query("SELECT * FROM dataset", "big.parquet", batch_rows=1000)
    calls = collections.Counter()

    def profile(frame, event, arg):
        if event == "call":
            calls[frame.f_code.co_name] += 1

    sys.setprofile(profile)
    try:
        table = reader.read_all()
    finally:
        sys.setprofile(None)
    assert table.num_rows == 300_000 and len(table.to_batches()) >= 300
    assert table.column("k").to_pylist()[::50_000] == list(range(0, 300_000, 50_000))
    # Nothing per batch (a stray finalizer the garbage collector runs meanwhile
    # may count): on main it was thousands.
    assert sum(calls.values()) < 20, calls


def test_closing_a_scan_ends_it_even_when_read_through_the_c_stream(scan):
    s = scan.open("SELECT * FROM dataset", "big.parquet", batch_rows=1000)
    reader = s.reader()
    assert reader.read_next_batch().num_rows == 1000
    s.close()
    eventually(lambda: scan.status()["scans"] == 0, what="the scan freed")
    with pytest.raises(StopIteration):  # what was queued, then the end
        while True:
            reader.read_next_batch()


def test_closing_a_scan_early_frees_it_on_the_server(scan):
    sql = "SELECT * FROM dataset"
    with scan.open(sql, "big.parquet", batch_rows=1000) as s:
        assert s.schema.names == ["k", "v", "s"]
    assert scan.status()["scans"] == 0
    s = scan.open(sql, "big.parquet", batch_rows=1000)
    first = next(iter(s))
    s.close()
    eventually(lambda: scan.status()["scans"] == 0, what="the scan freed")
    assert first.num_rows == 1000 and first.column(0)[999].as_py() == 999


def test_a_materialized_scan_via_the_store_deletes_what_it_never_sent(root):
    with fp.start_store("256MiB") as store:
        client = store.connect()
        with fp.scan.ScanServer("127.0.0.1:0", root, store_socket=store.socket).start() as srv:
            with fp.scan.connect(srv.address) as scan:
                sql = "SELECT k, s FROM dataset"
                s = scan.open(
                    sql, "big.parquet", into_store=client, batch_rows=10_000, materialize=True
                )
                assert s.via_store
                assert len(client.list()) >= 30  # all placed before the first id moved
                first = next(iter(s))
                s.close()
                eventually(lambda: set(client.list()) == {first}, what="unsent batches deleted")
                assert client.get(first).num_rows == 10_000


@pytest.mark.parametrize(
    "sql, dataset, error, words",
    [
        ("SELEC k FROM dataset", "big.parquet", fp.errors.QueryError, "syntax error"),
        ("SELECT nope FROM dataset", "big.parquet", fp.errors.QueryError, "nope"),
        ("SELECT 1; SELECT 2", "big.parquet", fp.errors.QueryError, "exactly one SELECT"),
        ("COPY (SELECT 1) TO 'x.csv'", "big.parquet", fp.errors.QueryError, "exactly one SELECT"),
        ("SET threads = 1", "big.parquet", fp.errors.QueryError, "exactly one SELECT"),
        ("SELECT * FROM read_csv('/etc/passwd')", "big.parquet", fp.errors.QueryError, "/etc"),
        ("SELECT CAST(s AS INT) FROM dataset", "big.parquet", fp.errors.QueryError, "convert"),
        ("SELECT 1", "missing.parquet", fp.errors.DatasetNotFound, "no dataset"),
        ("SELECT 1", "notes.txt", fp.errors.DatasetNotFound, "not a known format"),
        ("SELECT 1", "../secret.parquet", fp.errors.AccessDenied, "outside"),
        ("SELECT 1", "/etc/passwd", fp.errors.AccessDenied, "outside"),
        ("SELECT * FROM dataset", "link.parquet", fp.errors.AccessDenied, "outside"),
    ],
)
def test_bad_requests_get_a_clear_error_and_the_server_carries_on(scan, sql, dataset, error, words):
    with pytest.raises(error, match=words):
        scan.to_table(sql, dataset)
    assert scan.to_table("SELECT count(*) AS n FROM dataset", "rows.parquet")["n"][0].as_py() == (
        ROWS
    )
    # An earlier test's dropped connection may still be being freed.
    eventually(lambda: scan.status()["scans"] == 0, what="no scan left open")


def test_garbage_from_a_client_costs_only_its_connection(server, scan):
    host, port = server.rsplit(":", 1)
    for junk in (b"\xff" * 64, wire.HEAD.pack(wire.HELLO, 1 << 30, 0), b"GET / HTTP/1.1\r\n\r\n"):
        with socket.create_connection((host, int(port))) as s:
            s.settimeout(10)
            # The server may hang up as soon as it sees the junk: then the
            # send, the shutdown or the read fail, which is the point.
            with contextlib.suppress(OSError):
                s.sendall(junk)
                s.shutdown(socket.SHUT_WR)
                while s.recv(4096):
                    pass  # the server answers (or not) and hangs up
    assert scan.to_table("SELECT count(*) AS n FROM dataset", "rows.parquet")["n"][0].as_py() == (
        ROWS
    )


def test_bad_options_and_bad_frames_get_typed_answers(server, scan):
    with pytest.raises(fp.errors.QueryError, match="batch_rows"):
        scan.query("SELECT 1", "rows.parquet", batch_rows=0)
    with pytest.raises(fp.errors.QueryError, match="wire format"):
        scan.query("SELECT 1", "rows.parquet", wire_format="xml")
    from ferroplasma.scan.transport import tcp_connect

    t = tcp_connect(server, 10)
    wire.send(t, wire.HELLO, {"version": 99, "token": ""})
    kind, f, _ = wire.recv(t)
    assert (kind, f["code"]) == (wire.ERROR, "protocol") and "version" in f["message"]
    t.close()
    t = tcp_connect(server, 10)
    wire.send(t, wire.HELLO, {"version": wire.VERSION, "token": ""})
    assert wire.recv(t)[0] == wire.READY
    for fields, code in (
        ({"scan": 12345, "batches": 1}, "scan"),  # no such scan
        ({"scan": None}, "scan"),
    ):
        wire.send(t, wire.ITERATE, fields)
        kind, f, _ = wire.recv(t)
        assert (kind, f["code"]) == (wire.ERROR, code), f
    wire.send(t, wire.INIT_SCAN, {"sql": "SELECT 1 AS x", "dataset": "rows.parquet"})
    kind, f, body_len = wire.recv(t)
    assert kind == wire.SCAN
    wire.skip(t, body_len)
    for bad in ({"batches": 0}, {"batches": 1, "bytes": -5}, {"batches": "many"}):
        wire.send(t, wire.ITERATE, {"scan": f["scan"], **bad})
        kind, err, _ = wire.recv(t)
        assert (kind, err["code"]) == (wire.ERROR, "protocol"), bad
    wire.send(t, wire.ITERATE, {"scan": f["scan"], "batches": 5})  # still usable
    assert wire.recv(t)[0] == wire.BATCH
    t.close()
    eventually(lambda: scan.status()["scans"] == 0, what="the scan of the dropped connection freed")


def test_no_server_and_a_wrong_token_are_clear_errors(root):
    with pytest.raises(fp.errors.ScanServerUnavailable, match="scan-server"):
        fp.scan.connect(f"127.0.0.1:{free_port()}")
    with pytest.raises(ValueError, match="HOST:PORT"):
        fp.scan.connect("no-port")
    with fp.scan.ScanServer("127.0.0.1:0", root, token="s3cret").start() as srv:
        with pytest.raises(fp.errors.AccessDenied, match="needs a token"):
            fp.scan.connect(srv.address)
        with pytest.raises(fp.errors.AccessDenied, match="wrong scan token"):
            fp.scan.connect(srv.address, token="wrong")
        with fp.scan.connect(srv.address, token="s3cret") as c:
            assert c.to_table("SELECT 7 AS x", "rows.parquet")["x"][0].as_py() == 7
    with fp.scan.ScanServer("127.0.0.1:0", root).start() as srv:
        with pytest.raises(fp.errors.AccessDenied, match="takes no token"):
            fp.scan.connect(srv.address, token="s3cret")


def test_into_store_lands_each_batch_in_the_store_over_tcp(scan, root):
    with fp.start_store("256MiB") as store:
        client = store.connect()
        sql = _select(TYPES)
        ids = scan.query(sql, "rows.parquet", into_store=client, batch_rows=1000)
        assert len(ids) == 3 and all(isinstance(i, fp.ObjectID) for i in ids)
        batches = client.get(ids)
        _assert_bit_exact(pa.Table.from_batches(batches), _local(root, "rows.parquet", sql))
        # Views of shared memory, each buffer 64-byte aligned.
        _, bufs = arrow_layout.flatten(batches[0])
        assert all(b.address % 64 == 0 for b in bufs)
        assert set(client.list()) == set(ids)  # the probe object is gone


def test_iterating_a_scan_into_the_store_hands_out_sealed_batches(scan, root):
    """Iterated (not `query`), each batch the receiver lands is sealed before
    its id comes out, so it can be read at once; closing early keeps those
    and leaves nothing half received."""
    with fp.start_store("256MiB") as store:
        client = store.connect()
        s = scan.open("SELECT k, s FROM dataset", "big.parquet", into_store=client, batch_rows=1000)
        it = iter(s)
        got = [next(it) for _ in range(3)]
        assert [client.get(i).num_rows for i in got] == [1000, 1000, 1000]
        assert client.get(got[2]).column(0)[0].as_py() == 2000
        s.close()
        eventually(lambda: set(client.list()) == set(got), what="only the batches handed out")
        eventually(lambda: scan.status()["scans"] == 0, what="the scan freed")


def test_a_same_host_server_puts_batches_in_the_store_and_sends_ids(root):
    with fp.start_store("256MiB") as store:
        client = store.connect()
        with fp.scan.ScanServer("127.0.0.1:0", root, store_socket=store.socket).start() as srv:
            with fp.scan.connect(srv.address) as scan:
                sql = "SELECT k, v, s FROM dataset ORDER BY k"
                ids = scan.query(sql, "big.parquet", into_store=client, batch_rows=100_000)
                assert srv.status()["store_batches"] == len(ids) >= 3
                got = pa.Table.from_batches(client.get(ids))
                _assert_bit_exact(got, _local(root, "big.parquet", sql))
                # Another client of a different store is served over TCP.
                with fp.start_store("64MiB") as other:
                    c2 = other.connect()
                    ids2 = scan.query("SELECT k FROM dataset", "big.parquet", into_store=c2)
                    assert srv.status()["store_batches"] == len(ids)
                    assert sum(b.num_rows for b in c2.get(ids2)) == 300_000


def test_scan_server_command_line_errors(tmp_path):
    exe = os.path.join(os.path.dirname(sys.executable), "ferroplasma")
    out = subprocess.run(
        [exe, "scan-server", "--root", str(tmp_path / "nope"), "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "not a directory" in out.stderr
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert "scan-server" in out.stdout


def test_layout_of_sliced_and_nested_arrays_round_trips():
    struct = pa.StructArray.from_arrays(
        [pa.array([1, 2, None, 4]), pa.array(["a", None, "c", "d"])], names=["x", "y"]
    )
    batch = pa.record_batch(
        {
            "s": struct,
            "d": pa.array(["p", "q", "p", None]).dictionary_encode(),
            "l": pa.array([[1], None, [2, 3], []], pa.large_list(pa.int16())),
            "v": pa.array(["x" * 20, "y", None, "z"], pa.string_view()),
        }
    )
    for b in (batch, batch.slice(1, 3), batch.slice(4, 0)):
        desc, bufs = arrow_layout.flatten(b)
        assert arrow_layout.sizes(desc) == [x.size for x in bufs]
        back = arrow_layout.rebuild(b.schema, b.num_rows, desc, bufs)
        back.validate(full=True)
        assert back.equals(b)
    with pytest.raises(fp.errors.SerializationError):
        arrow_layout.rebuild(batch.schema, 4, desc[:-3], bufs)
