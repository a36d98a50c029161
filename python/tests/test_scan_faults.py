"""Scans and faults: a client or a server killed or stopped midway leaves
nothing in the store and no process aborted (`ferroplasma scan-server`
processes, a real store)."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
import time

import pytest

duckdb = pytest.importorskip("duckdb")
pytest.importorskip("pyarrow")

import ferroplasma as fp  # noqa: E402
from conftest import eventually  # noqa: E402


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    d = tmp_path_factory.mktemp("scanfaults")
    duckdb.connect().execute(
        f"COPY (SELECT range AS k, range * 0.5 AS v, 'name ' || range AS s FROM range(300000))"
        f" TO '{d}/big.parquet'"
    )
    return d


def _scan_server_process(root, store_socket=None):
    """`ferroplasma scan-server` as a process: (process, address)."""
    cmd = [os.path.join(os.path.dirname(sys.executable), "ferroplasma"), "scan-server"]
    cmd += ["--listen", "127.0.0.1:0", "--root", str(root), "--threads", "2"]
    cmd += ["--store-socket", store_socket] if store_socket else ["--no-store"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert "serving" in line, line
    return proc, line.split(" on ")[-1].strip()


_KILLED_CLIENT = """
import os, sys, ferroplasma as fp
client = fp.connect(sys.argv[1])
scan = fp.scan.connect(sys.argv[2])
if sys.argv[3] == "query":  # lands the batches itself (a remote server), without end
    sql = "SELECT a.k, b.s FROM dataset a, dataset b"  # 9e10 rows: killed long before
    scan.query(sql, "big.parquet", into_store=client, batch_rows=2000)
else:  # the server places them (same store); stop after a few ids
    s = scan.open("SELECT * FROM dataset", "big.parquet", into_store=client, batch_rows=2000)
    it = iter(s)
    for _ in range(5):
        next(it)
    print("ids", flush=True)
    os.kill(os.getpid(), 9)
"""


@pytest.mark.parametrize("where", ["client lands them", "server places them"])
def test_a_client_killed_mid_scan_into_the_store_leaves_nothing_there(root, where):
    """A client killed while a scan fills its store leaves no batch behind:
    batches it lands itself stay unsealed until the whole result is in (the
    store discards them with the client), and a server that placed batches
    deletes them, sent or not, when the client goes away unfinalized."""
    with fp.start_store("512MiB") as store:
        client = store.connect()
        shared = where == "server places them"
        proc, address = _scan_server_process(root, store.socket if shared else None)
        try:
            mode = "open" if shared else "query"
            child = subprocess.Popen(
                [sys.executable, "-c", _KILLED_CLIENT, store.socket, address, mode],
                stdout=subprocess.PIPE,
                text=True,
            )
            if shared:
                assert child.stdout.readline() == "ids\n"
            else:  # kill it once some batches are in the store
                eventually(lambda: store_used(client) > 1 << 20, what="batches landing")
                child.kill()
            child.wait(timeout=30)
            eventually(lambda: client.list() == {}, what="nothing left in the store")
            eventually(lambda: store_used(client) == 0, what="no memory held")
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def test_a_server_stopped_mid_scan_exits_cleanly(root):
    """SIGTERM while scans run (one being read, one its client just
    dropped): the server ends their DuckDB queries and producer threads
    before the interpreter goes, and exits 0 (it aborted now and then when a
    producer thread was still inside DuckDB at exit)."""
    for _ in range(3):
        proc, address = _scan_server_process(root)
        try:
            scan = fp.scan.connect(address)
            sql = "SELECT * FROM dataset ORDER BY s DESC"
            reading = scan.open(sql, "big.parquet", batch_rows=1000)
            next(iter(reading))
            dropped = scan.open(sql, "big.parquet", batch_rows=1000)
            next(iter(dropped))
            dropped.close()
            # And one whose producer thread is busy inside DuckDB (a cross
            # product of 9e10 rows, read and dropped as it streams).
            endless = scan.open("SELECT a.k, b.k FROM dataset a, dataset b", "big.parquet")
            gone: list[str] = []

            def drain(s=endless, gone=gone):
                try:
                    collections.deque(s.reader(), maxlen=0)
                except OSError as e:  # the server went away: that is the point
                    gone.append(str(e))

            reading_endless = threading.Thread(target=drain, daemon=True)
            reading_endless.start()
            time.sleep(0.5)
            proc.terminate()
            assert proc.wait(timeout=30) == 0
            reading_endless.join(timeout=30)
            assert gone and "ScanServerUnavailable" in gone[0]
        finally:
            proc.kill()
            proc.wait(timeout=10)


def test_a_server_killed_mid_scan_leaves_nothing_in_the_store(root):
    """The server placed every batch of a materialized scan in the shared
    store, sent a few ids, and was killed: the batches it never sent were
    still unsealed (the store discards them with it), and the client deletes
    those it received when the scan fails."""
    with fp.start_store("512MiB") as store:
        client = store.connect()
        proc, address = _scan_server_process(root, store.socket)
        try:
            scan = fp.scan.connect(address)
            sql = "SELECT * FROM dataset"
            s = scan.open(sql, "big.parquet", into_store=client, batch_rows=2000, materialize=True)
            assert s.via_store and len(client.list()) >= 100
            it = iter(s)
            got = [next(it)]
            assert client.contains(got[0])
            proc.kill()
            proc.wait(timeout=10)
            with pytest.raises(fp.errors.ScanServerUnavailable):
                got.extend(it)  # the ids already on their way, then the failure
            client.delete(got)  # the caller's to delete: it had them
            eventually(lambda: client.list() == {}, what="nothing left in the store")
            eventually(lambda: store_used(client) == 0, what="no memory held")
        finally:
            proc.kill()
            proc.wait(timeout=10)


def store_used(client) -> int:
    return client.stats()["used"]
