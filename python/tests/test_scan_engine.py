"""What a scan costs before and after its batches: the DuckDB database a
scan runs in is made ahead of it, and the server answers FINALIZE before it
tears DuckDB down. Both against a real ScanServer in this process (so that
DuckDB's calls can be watched)."""

from __future__ import annotations

import threading
import time

import pytest

duckdb = pytest.importorskip("duckdb")
pa = pytest.importorskip("pyarrow")

import ferroplasma as fp  # noqa: E402
from ferroplasma.scan import engine  # noqa: E402
from ferroplasma.scan import result as scan_result  # noqa: E402
from ferroplasma.scan.server import ScanServer  # noqa: E402


@pytest.fixture
def root(tmp_path):
    con = duckdb.connect()
    con.execute(f"COPY (SELECT range AS i FROM range(5000)) TO '{tmp_path}/rows.parquet'")
    con.close()
    return tmp_path


@pytest.fixture
def opened(monkeypatch):
    """The threads that open a DuckDB database, by name."""
    names: list[str] = []
    real = duckdb.connect

    def connect(*args, **kwargs):
        names.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(duckdb, "connect", connect)
    return names


def test_a_scan_runs_in_a_database_made_before_it_came(root, opened):
    with ScanServer("127.0.0.1:0", root, threads=1).start() as server:
        assert server._spares.wait(10), "no database made ahead of the first scan"
        with fp.scan.connect(server.address) as scan:
            for n in range(3):
                assert scan.to_table("SELECT i FROM dataset", "rows.parquet").num_rows == 5000
                assert server._spares.wait(10), f"none made ahead of scan {n + 2}"
    # The scans' own threads never waited for one to be opened.
    assert opened and set(opened) == {"duckdb-spare"}, opened


def test_each_scan_gets_a_database_of_its_own():
    spares = engine.Spares()
    spares.prime()
    assert spares.wait(10)
    first = spares.take()
    assert spares.wait(10) and spares.ready  # the next one, made meanwhile
    second = spares.take()
    first.execute("CREATE TABLE left_behind AS SELECT 1 AS x")
    assert second.execute("SELECT count(*) FROM duckdb_tables()").fetchone() == (0,)
    first.close()
    second.close()
    spares.close()
    assert not spares.ready
    # Closed, it still gives a database (opened there and then), none ahead.
    third = spares.take()
    assert third.execute("SELECT 42").fetchone() == (42,)
    third.close()
    assert not spares.wait(1)


def test_the_client_gets_its_answer_before_duckdb_is_torn_down(root, monkeypatch):
    """Closing a scan's DuckDB database takes milliseconds; the client's
    scan ends without waiting for it."""
    release = threading.Event()
    closing = threading.Event()
    real_close = scan_result.Scan.close

    def slow_close(self, finalized):
        closing.set()
        release.wait(20)
        real_close(self, finalized)

    monkeypatch.setattr(scan_result.Scan, "close", slow_close)
    with ScanServer("127.0.0.1:0", root, threads=1).start() as server:
        with fp.scan.connect(server.address, timeout=30) as scan:
            done = threading.Event()
            got: list = []

            def run():
                got.append(scan.to_table("SELECT i FROM dataset", "rows.parquet").num_rows)
                done.set()

            th = threading.Thread(target=run, daemon=True)
            th.start()
            try:
                assert closing.wait(20), "the server never closed the scan"
                assert done.wait(10), "the client waited for DuckDB's teardown"
                assert got == [5000]
            finally:
                release.set()
                th.join(20)


def test_a_scan_whose_finalized_cannot_be_sent_is_still_closed(root, monkeypatch):
    """A client that sends FINALIZE and hangs up at once: the server's
    answer fails, and the scan is closed all the same."""
    from ferroplasma.scan import server as scan_server

    closed = threading.Event()
    real_close = scan_result.Scan.close

    def close(self, finalized):
        real_close(self, finalized)
        closed.set()

    real_send = scan_server.wire.send

    def send(t, kind, fields, body=()):
        if kind == scan_server.wire.FINALIZED:
            raise ConnectionResetError("the client hung up")
        real_send(t, kind, fields, body)

    monkeypatch.setattr(scan_result.Scan, "close", close)
    monkeypatch.setattr(scan_server.wire, "send", send)
    with ScanServer("127.0.0.1:0", root, threads=1).start() as server:
        with fp.scan.connect(server.address, timeout=10) as scan:
            with pytest.raises(fp.errors.FerroplasmaError):
                scan.to_table("SELECT i FROM dataset", "rows.parquet")
        assert closed.wait(10), "the scan was never closed"
        assert server.status()["scans"] == 0


def test_a_server_stopped_as_it_starts_exits_cleanly(root):
    """SIGTERM while the first spare database is still being made: the
    server waits for it (an interpreter that exits while a thread is inside
    DuckDB aborts) and exits 0. The kernel may hand the signal to one of
    DuckDB's threads; the server notices all the same (it hung 1 time in
    about 40 when its main thread waited untimed)."""
    import os
    import subprocess
    import sys

    exe = os.path.join(os.path.dirname(sys.executable), "ferroplasma")
    for _ in range(8):
        proc = subprocess.Popen(
            [exe, "scan-server", "--listen", "127.0.0.1:0", "--root", str(root), "--no-store"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert "serving" in proc.stdout.readline()
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err


def test_closing_a_server_waits_until_no_thread_is_inside_duckdb(root):
    """close() returns only once the spare-making thread is done with
    DuckDB, even when it was still opening the first database."""
    for _ in range(3):
        spares = engine.Spares()
        spares.prime()  # the thread is opening a database now
        spares.close()
        assert spares._maker is not None and not spares._maker.is_alive()
        server = ScanServer("127.0.0.1:0", root).start()
        server.close()
        alive = [t.name for t in threading.enumerate() if t.name == "duckdb-spare"]
        assert not alive, "a thread is still inside DuckDB after close()"


def test_a_spare_taken_at_once_does_not_end_the_next_one_being_made(monkeypatch):
    """The thread that made a spare must not mark the next one as made:
    a scan that takes the spare the moment it is ready starts the next,
    and that one is still being made until its own thread says so."""
    spares = engine.Spares()
    gate = threading.Event()
    real = duckdb.connect
    calls: list[int] = []

    def connect(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            gate.wait(10)  # the second spare takes its time
        return real(*args, **kwargs)

    monkeypatch.setattr(duckdb, "connect", connect)
    spares.prime()
    assert spares.wait(10)
    first = spares.take()  # starts the second, held at the gate
    try:
        time.sleep(0.2)  # the first spare's thread has ended by now
        assert spares._making and not spares.ready, "the second spare counted as made"
    finally:
        gate.set()
    assert spares.wait(10) and spares.ready
    first.close()
    spares.close()
