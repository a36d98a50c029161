"""The metrics endpoint (``ferroplasma store --metrics-listen``), scraped by
a real Prometheus server (Debian's ``prometheus`` package; ``make test``
installs it when root) while clients work on the store: what Prometheus
recorded matches what the test did."""

from __future__ import annotations

import gc
import json
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

import ferroplasma as fp


def _logged(path: str, pattern: str, timeout: float = 30.0) -> str:
    """The first match of ``pattern`` in the file at ``path``, waiting."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(path, errors="replace") as f:
            m = re.search(pattern, f.read())
        if m:
            return m.group(1)
        time.sleep(0.05)
    raise AssertionError(f"{pattern!r} never appeared in {path}")


@pytest.fixture
def store():
    with fp.start_store("64MiB", metrics_listen="127.0.0.1:0") as s:
        s.metrics = _logged(s.log_path, r"metrics at http://([0-9.]+:[0-9]+)/metrics")
        yield s


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_the_endpoint_serves_only_get_of_metrics(store):
    status, body = _get(f"http://{store.metrics}/metrics")
    assert status == 200
    assert "ferroplasma_capacity_bytes 67108864" in body
    assert body.rstrip().endswith("# EOF")
    assert _get(f"http://{store.metrics}/")[0] == 404
    post = urllib.request.Request(f"http://{store.metrics}/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(post, timeout=10)
    assert e.value.code == 405


def _counter(body: str, name: str, op: str) -> float:
    m = re.search(rf'^ferroplasma_{name}_total{{op="{op}"}} (\S+)$', body, re.M)
    return float(m.group(1)) if m else 0.0


def test_gets_and_contains_answered_from_the_shared_table_are_counted(store):
    """Gets, contains and releases a client serves from the shared table
    send no request; they read 0 in requests_total before. Each client
    counts them in its holds region and the store adds them up at the
    scrape, including those of clients that have gone."""
    c = store.connect()
    oid = c.put(b"x" * 100)
    # A small put needs no round trip: the store takes it into the table
    # within milliseconds (docs/protocol.md, "Writes without a round trip").
    time.sleep(0.1)
    for _ in range(300):
        assert c.get_buffers([oid], timeout=0)[0] is not None  # released at once
    for _ in range(200):
        assert c.contains(oid)
    gone = store.connect()
    for _ in range(50):
        gone.get_buffers([oid], timeout=0)
    del gone
    gc.collect()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the store notices the disconnect
        _, body = _get(f"http://{store.metrics}/metrics")
        if "ferroplasma_clients 1\n" in body:
            break
        time.sleep(0.05)
    _, body = _get(f"http://{store.metrics}/metrics")
    assert _counter(body, "requests", "get") == 350
    assert _counter(body, "requests", "contains") == 200
    assert _counter(body, "table_requests", "get") == 350
    assert _counter(body, "table_requests", "contains") == 200
    assert _counter(body, "table_requests", "release") == 350
    # A get the table cannot serve (absent) is a request, counted once.
    c.get_buffers([fp.ObjectID.from_random()], timeout=0)
    _, body = _get(f"http://{store.metrics}/metrics")
    assert _counter(body, "requests", "get") == 351
    assert _counter(body, "table_requests", "get") == 350


def test_a_taken_port_is_a_clear_start_up_error(store):
    with pytest.raises(fp.StoreUnavailable, match=r"metrics-listen .*pick another port"):
        with fp.start_store("16MiB", metrics_listen=store.metrics):
            pass


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs prometheus (apt)")
def test_prometheus_records_what_the_clients_did(store, tmp_path):
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 200ms\n"
        "scrape_configs:\n  - job_name: ferroplasma\n"
        f"    static_configs:\n      - targets: ['{store.metrics}']\n"
    )
    log = tmp_path / "prometheus.log"
    with open(log, "wb") as out:
        prom = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                "--web.listen-address=127.0.0.1:0",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        api = _logged(str(log), r'msg="Listening on" address=([0-9.]+:[0-9]+)')

        def query(q: str) -> float | None:
            url = f"http://{api}/api/v1/query?" + urllib.parse.urlencode({"query": q})
            status, body = _get(url)
            if status != 200:
                return None
            result = json.loads(body)["data"]["result"]
            return float(result[0]["value"][1]) if result else None

        # Load: a reader getting and releasing objects all along.
        c = store.connect()
        stop = threading.Event()
        seed = [c.put(b"x" * 1000) for _ in range(20)]

        def read() -> None:
            r = store.connect()
            while not stop.is_set():
                r.get_buffers(seed, timeout=0)

        reader = threading.Thread(target=read)
        reader.start()
        try:
            puts = [c.put(b"y" * 1000) for _ in range(480)]
            c.delete(seed[:10])
            for oid in puts[:300]:
                c.delete([oid])
            for _ in range(37):
                c.stats()
        finally:
            stop.set()
            reader.join()

        # Puts of 1000 bytes go through the client's ring (writes without
        # a round trip), or ask the store now and then (a bucket claimed).
        want = {"delete": 301, "stats": 37}
        deadline = time.monotonic() + 60
        got: dict[str, float | None] = {}
        while time.monotonic() < deadline:
            got = {op: query(f'ferroplasma_requests_total{{op="{op}"}}') for op in want}
            if got == {op: float(n) for op, n in want.items()}:
                break
            time.sleep(0.2)
        assert got == {op: float(n) for op, n in want.items()}
        assert query("ferroplasma_objects{state='sealed'}") == 190.0  # 500 put, 310 deleted
        assert query("ferroplasma_capacity_bytes") == float(64 << 20)
        rings = query('ferroplasma_ring_requests_total{op="seal"}') or 0.0
        asked = query('ferroplasma_requests_total{op="create_and_seal"}') or 0.0
        assert rings + asked == 500.0 and rings >= 450, (rings, asked)
        assert query('ferroplasma_requests_total{op="seal"}') == rings
    finally:
        prom.terminate()
        prom.wait(10)


def test_the_grafana_dashboard_asks_for_metrics_the_store_serves(tmp_path):
    """Every metric docs/grafana-dashboard.json queries is one a store (a
    cluster member, for the cluster panels) serves."""
    from pathlib import Path

    dash = json.loads((Path(__file__).parents[2] / "docs" / "grafana-dashboard.json").read_text())
    wanted = {
        re.sub(r"_(bucket|count|sum)$", "", name)
        for p in dash["panels"]
        for t in p["targets"]
        for name in re.findall(r"\bferroplasma_[a-z_]+", t["expr"])
    }
    assert len(wanted) >= 10
    common = {"cluster_token": "t", "heartbeat_interval": "100ms", "peer_timeout": "2s"}
    member = {"cluster_listen": "127.0.0.1:0", **common}
    served: set[str] = set()
    # A lone store whose gets are requests (no shared table), and a member.
    for flags in ({"table_slots": 0}, member):
        with fp.start_store("16MiB", metrics_listen="127.0.0.1:0", **flags) as s:
            addr = _logged(s.log_path, r"metrics at http://([0-9.]+:[0-9]+)/metrics")
            c = s.connect()
            c.get_buffers([c.put(b"x")], timeout=0)  # a create, a get: their histograms
            _, body = _get(f"http://{addr}/metrics")
        served |= {
            re.sub(r"_(bucket|count|sum|created)$", "", line.split("{")[0].split(" ")[0])
            for line in body.splitlines()
            if line.startswith("ferroplasma_")
        }
    assert wanted <= served, wanted - served


def test_a_silent_member_shows_missed_heartbeats():
    from conftest import eventually, member_address

    common = {"cluster_token": "t", "heartbeat_interval": "100ms", "peer_timeout": "2s"}
    with fp.start_store(
        "16MiB", metrics_listen="127.0.0.1:0", cluster_listen="127.0.0.1:0", **common
    ) as a:
        addr = _logged(a.log_path, r"metrics at http://([0-9.]+:[0-9]+)/metrics")
        seed = member_address(a.connect())

        def missed() -> list[float]:
            body = _get(f"http://{addr}/metrics")[1]
            return [
                float(line.rsplit(" ", 1)[1])
                for line in body.splitlines()
                if line.startswith("ferroplasma_cluster_peer_heartbeats_missed{")
            ]

        with fp.start_store("16MiB", cluster_listen="127.0.0.1:0", join=seed, **common) as b:
            eventually(lambda: missed() and missed()[0] <= 1, what="b heard")
            b.process.kill()
            b.process.wait()
            eventually(lambda: missed()[0] >= 10, what="b's heartbeats missed")


def test_every_object_is_read_through_the_table_after_it_grows_and_shrinks():
    """A store that holds more objects than its table first has slots
    (1,024 here) rebuilds the table larger, so that every sealed object is
    still read without a round trip, by a client that connected before
    (it asks for the new table once) as by one that connected after; after
    the objects are deleted the table shrinks back, and still serves.
    Counted: table_requests_total{op="get"} is every get. (Before, objects
    beyond the table's slots were read through the socket.)"""
    with fp.start_store("64MiB", metrics_listen="127.0.0.1:0", table_slots=1024) as s:
        metrics = _logged(s.log_path, r"metrics at http://([0-9.]+:[0-9]+)/metrics")
        early = s.connect()
        ids = [fp.ObjectID.from_random() for _ in range(5000)]
        for oid in ids:
            early.create_and_seal(oid, b"x" * 10)
        _logged(s.log_path, r"object table was rebuilt.* to=(\d+)")
        late = s.connect()
        for c in (early, late):
            for oid in ids:
                assert c.get_buffers([oid], timeout=0)[0] is not None
            assert all(c.contains(oid) for oid in ids)
        _, body = _get(f"http://{metrics}/metrics")
        assert _counter(body, "table_requests", "get") == 10000
        assert _counter(body, "requests", "get") == 10000
        assert _counter(body, "table_requests", "contains") == 10000

        early.delete(ids)
        # Shrunk within about a second (to the 1,024 slots it started with).
        _logged(s.log_path, r"from=\d+ to=(1024) ")
        kept = fp.ObjectID.from_random()
        early.create_and_seal(kept, b"y" * 10)
        for c in (early, late):
            assert bytes(c.get_buffers([kept], timeout=0)[0]) == b"y" * 10
        _, body = _get(f"http://{metrics}/metrics")
        assert _counter(body, "table_requests", "get") == 10002
        assert _counter(body, "requests", "get") == 10002


def test_an_object_held_through_the_table_outlives_its_rebuild_and_delete():
    """Holds a client took in the table before it was rebuilt become store
    references (as when an object is freed under a reader): the object,
    deleted meanwhile, stays, its bytes intact, until the buffer goes."""
    with fp.start_store("64MiB", table_slots=1024) as s:
        c = s.connect()
        held = fp.ObjectID.from_random()
        c.create_and_seal(held, b"h" * 1000)
        buf = c.get_buffers([held], timeout=0)[0]
        for _ in range(3000):  # the table is rebuilt larger
            c.create_and_seal(fp.ObjectID.from_random(), b"x" * 10)
        _logged(s.log_path, r"object table was rebuilt.* to=(\d+)")
        assert c.delete([held]) == ["deferred"]
        assert not c.contains(held)
        assert held in c.list(), "still in the store while held"
        for _ in range(200):  # would reuse its memory, were it freed
            c.create_and_seal(fp.ObjectID.from_random(), b"z" * 1000)
        assert bytes(buf) == b"h" * 1000
        del buf
        gc.collect()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and held in c.list():
            time.sleep(0.05)
        assert held not in c.list()
