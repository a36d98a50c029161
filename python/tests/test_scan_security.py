"""The scan server against strangers on the network and bad values: idle and
unauthenticated connections hold no threads and are dropped at the HELLO
deadline, the caps on connections hold, refusals are logged at a bounded
rate, wrongly typed request fields get typed ERROR replies (never a
traceback), and bad command-line values are one-line errors with exit
status 2. Servers run in this process (to count their threads and read
their log) or as `ferroplasma scan-server` processes; every connection goes
to 127.0.0.1 and every socket has a timeout."""

from __future__ import annotations

import faulthandler
import logging
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

duckdb = pytest.importorskip("duckdb")
pytest.importorskip("pyarrow")

import ferroplasma as fp  # noqa: E402
from conftest import eventually  # noqa: E402
from ferroplasma.scan import wire  # noqa: E402
from ferroplasma.scan.transport import TcpTransport  # noqa: E402

EXE = os.path.join(os.path.dirname(sys.executable), "ferroplasma")
ROWS = 1000


@pytest.fixture(autouse=True)
def _watchdog():
    """A test that hangs (say, on a server that never answers a client with
    no read timeout) ends the run, with every thread's traceback."""
    faulthandler.dump_traceback_later(90, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    d = tmp_path_factory.mktemp("scan-security")
    duckdb.connect().execute(f"COPY (SELECT range AS i FROM range({ROWS})) TO '{d}/rows.parquet'")
    (d / "bad.parquet").write_bytes(b"not parquet at all" * 8)
    return d


def _serve(root, **kw) -> fp.scan.ScanServer:
    """A scan server in this process on a port the system picks."""
    return fp.scan.ScanServer("127.0.0.1:0", root, **kw).start()


def _open(address: str) -> TcpTransport:
    """A raw connection whose every send and receive gives up after 10 s."""
    host, port = address.rsplit(":", 1)
    return TcpTransport(socket.create_connection((host, int(port)), timeout=10))


def _ready(address: str, token: str = "") -> TcpTransport:
    """A raw connection past its HELLO."""
    t = _open(address)
    wire.send(t, wire.HELLO, {"version": wire.VERSION, "token": token})
    kind, fields, _ = wire.recv(t)
    assert kind == wire.READY, fields
    return t


def _idle(address: str, n: int) -> list[socket.socket]:
    """``n`` connections that never send a byte."""
    host, port = address.rsplit(":", 1)
    return [socket.create_connection((host, int(port)), timeout=10) for _ in range(n)]


def _hung_up(s: socket.socket, wait: float) -> bool:
    """True if the server closed ``s`` within ``wait`` seconds (an ERROR
    frame may come first)."""
    s.settimeout(wait)
    try:
        while s.recv(4096):
            pass
    except socket.timeout:  # (TimeoutError from Python 3.10 on)
        return False
    except OSError:
        return True  # reset: it hung up with our bytes unread
    return True


def _works(address: str, token: str | None = None) -> None:
    """A real client connects and runs a query."""
    with fp.scan.connect(address, token=token, timeout=10) as c:
        n = c.to_table("SELECT count(*) AS n FROM dataset", "rows.parquet")["n"][0].as_py()
        assert n == ROWS


def _refusals(caplog, kind: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "refusal", None) == kind]


def _no_traceback(caplog) -> None:
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    assert "Traceback" not in caplog.text


# ---------------------------------------------------------------- connections


def test_idle_strangers_hold_no_threads_and_are_dropped_at_the_hello_deadline(root):
    before = threading.active_count()
    with _serve(root, hello_timeout=3.0, max_pending=400, max_connections=400) as srv:
        start = time.monotonic()
        idle = _idle(srv.address, 300)
        try:
            _works(srv.address)  # served after all 300 were accepted
            assert threading.active_count() <= before + 4
            if time.monotonic() - start < 2.5:  # (a slow machine may be past the deadline)
                assert srv.status()["unauthenticated"] == 300
            deadline = start + 3.0 + 4
            assert all(_hung_up(s, max(0.1, deadline - time.monotonic())) for s in idle)
            eventually(lambda: srv.status()["unauthenticated"] == 0, what="idle ones dropped")
            _works(srv.address)
        finally:
            for s in idle:
                s.close()
    eventually(lambda: threading.active_count() <= before, what="the server's threads gone")


def test_connections_beyond_the_unauthenticated_cap_are_closed_at_once(root, caplog):
    caplog.set_level(logging.INFO, logger="ferroplasma.scan")
    before = threading.active_count()
    with _serve(root, hello_timeout=5.0, max_pending=8) as srv:
        idle = _idle(srv.address, 20)
        try:
            start = time.monotonic()
            closed = [s for s in idle if _hung_up(s, max(0.1, start + 1.5 - time.monotonic()))]
            assert len(closed) == 12  # long before the 5 s deadline
            assert threading.active_count() <= before + 2
            assert srv.status()["unauthenticated"] == 8
        finally:
            for s in idle:
                s.close()  # the 8 held ones go away: room again
        eventually(lambda: srv.status()["unauthenticated"] == 0, what="the held ones gone")
        _works(srv.address)
        assert len(_refusals(caplog, "unauthenticated cap")) == 1  # 12 refusals, one line


def test_the_overall_connection_cap_holds(root):
    with _serve(root, max_connections=3) as srv:
        held = [_ready(srv.address) for _ in range(3)]
        try:
            with pytest.raises(fp.errors.ScanServerUnavailable, match=r"busy|hung up"):
                fp.scan.connect(srv.address, timeout=10)
            [s] = _idle(srv.address, 1)
            assert _hung_up(s, 2)
            s.close()
            held.pop().close()
            eventually(lambda: srv.status()["connections"] <= 2, what="a slot freed")
            held.append(_ready(srv.address))  # (a whole client may need two slots)
        finally:
            for t in held:
                t.close()


def test_refusals_are_logged_once_per_kind_and_interval(root, caplog):
    caplog.set_level(logging.INFO, logger="ferroplasma.scan")
    with _serve(root, token="s3cret", hello_timeout=0.5) as srv:
        for _ in range(30):
            with pytest.raises(fp.errors.AccessDenied, match="wrong scan token"):
                fp.scan.connect(srv.address, token="wrong", timeout=10)
        for _ in range(30):
            [s] = _idle(srv.address, 1)
            s.sendall(b"GET / HTTP/1.1\r\n\r\n")
            assert _hung_up(s, 5)
            s.close()
        # (The gate logs a refusal before it answers, so the lines are in.)
        lines = [r for r in caplog.records if r.name == "ferroplasma.scan"]
        assert len(lines) == 2, caplog.text  # 60 refusals
        assert [len(_refusals(caplog, k)) for k in ("token", "hello")] == [1, 1]
        idle = _idle(srv.address, 10)
        assert all(_hung_up(s, 5) for s in idle)  # the 0.5 s deadline
        for s in idle:
            s.close()
        _works(srv.address, token="s3cret")
        assert len([r for r in caplog.records if r.name == "ferroplasma.scan"]) == 3
        assert len(_refusals(caplog, "deadline")) == 1
    # Closing the server reports what no line counted yet.
    assert "29 more" in _refusals(caplog, "token")[1].getMessage()
    assert "9 more" in _refusals(caplog, "deadline")[1].getMessage()
    _no_traceback(caplog)


def test_a_refusal_line_counts_the_refusals_it_left_out(root, caplog):
    caplog.set_level(logging.INFO, logger="ferroplasma.scan")
    with _serve(root, token="s3cret", refusal_log_interval=2.0) as srv:
        for _ in range(5):
            with pytest.raises(fp.errors.AccessDenied):
                fp.scan.connect(srv.address, token="wrong", timeout=10)
        assert len(_refusals(caplog, "token")) == 1
        time.sleep(2.1)
        with pytest.raises(fp.errors.AccessDenied):
            fp.scan.connect(srv.address, timeout=10)
        _, second = _refusals(caplog, "token")
        assert "4 more" in second.getMessage(), second.getMessage()


# ---------------------------------------------------------------- bad values


@pytest.mark.parametrize(
    "listen, kw",
    [
        ("127.0.0.1:99999", {}),
        ("127.0.0.1", {}),
        ("127.0.0.1:0", {"threads": 0}),
        ("127.0.0.1:0", {"threads": -3}),
        ("127.0.0.1:0", {"threads": True}),
        ("127.0.0.1:0", {"threads": "2"}),
        ("127.0.0.1:0", {"hello_timeout": 0}),
        ("127.0.0.1:0", {"hello_timeout": float("nan")}),
        ("127.0.0.1:0", {"max_pending": 0}),
        ("127.0.0.1:0", {"max_connections": -1}),
    ],
)
def test_bad_constructor_values_are_value_errors(root, listen, kw):
    with pytest.raises(ValueError):
        fp.scan.ScanServer(listen, root, **kw)


def test_a_bad_thread_count_in_the_request_path_is_a_typed_error(root, caplog):
    caplog.set_level(logging.INFO, logger="ferroplasma.scan")
    with _serve(root, threads=2) as srv:
        srv.threads = -3  # as if changed after the constructor checked it
        with fp.scan.connect(srv.address, timeout=10) as c:
            with pytest.raises(fp.errors.ScanError, match="threads"):
                c.to_table("SELECT 1 AS x", "rows.parquet")
            assert c.status()["scans"] == 0
    _no_traceback(caplog)


BAD_REQUESTS = [
    (wire.ITERATE, {"scan": [1]}, "scan"),
    (wire.ITERATE, {"scan": {"id": 1}}, "scan"),
    (wire.ITERATE, {"scan": "1"}, "scan"),
    (wire.ITERATE, {"scan": 1.5}, "scan"),
    (wire.ITERATE, {"scan": True}, "scan"),
    (wire.ITERATE, {"scan": "OPEN", "batches": [1]}, "batches"),
    (wire.ITERATE, {"scan": "OPEN", "batches": True}, "batches"),
    (wire.ITERATE, {"scan": "OPEN", "bytes": "many"}, "bytes"),
    (wire.FINALIZE, {"scan": [1]}, "scan"),
    (wire.FINALIZE, {"scan": {}}, "scan"),
    (wire.INIT_SCAN, {"sql": ["SELECT 1"], "dataset": "rows.parquet"}, "sql"),
    (wire.INIT_SCAN, {"sql": "SELECT 1", "dataset": ["rows.parquet"]}, "dataset"),
    (wire.INIT_SCAN, {"sql": "SELECT 1", "dataset": "rows.parquet", "batch_rows": "9"}, "batch"),
    (wire.INIT_SCAN, {"sql": "SELECT 1", "dataset": "rows.parquet", "batch_rows": True}, "batch"),
    (wire.INIT_SCAN, {"sql": "SELECT 1", "dataset": "rows.parquet", "materialize": "y"}, "mat"),
    (wire.INIT_SCAN, {"sql": "SELECT 1", "dataset": "rows.parquet", "wire": ["ipc"]}, "wire"),
    (wire.INIT_SCAN, {"sql": "SELECT 1", "dataset": "rows.parquet", "store_probe": 7}, "probe"),
    (wire.INIT_SCAN, {"sql": "SELECT 1", "dataset": "rows.parquet", "store_probe": [1]}, "probe"),
    (wire.INIT_SCAN, {"sql": "SELECT 1", "dataset": "bad.parquet"}, "bad.parquet"),
]


def test_wrongly_typed_request_fields_get_typed_errors_and_no_traceback(root, store, caplog):
    caplog.set_level(logging.INFO, logger="ferroplasma.scan")
    with _serve(root, store_socket=store.socket) as srv:
        t = _ready(srv.address)
        try:
            wire.send(
                t, wire.INIT_SCAN, {"sql": "SELECT i FROM dataset", "dataset": "rows.parquet"}
            )
            kind, f, body_len = wire.recv(t)
            assert kind == wire.SCAN
            wire.skip(t, body_len)
            for kind, fields, words in BAD_REQUESTS:
                fields = {k: f["scan"] if v == "OPEN" else v for k, v in fields.items()}
                wire.send(t, kind, fields)
                got, err, _ = wire.recv(t)
                assert got == wire.ERROR, (fields, err)
                assert err["code"] in ("protocol", "query") and words in err["message"], err
                wire.send(t, wire.STATUS, {})  # the connection carries on
                assert wire.recv(t)[0] == wire.STATUS_REPLY
            wire.send(t, wire.ITERATE, {"scan": f["scan"], "batches": 1})
            assert wire.recv(t)[0] == wire.BATCH  # and so does the scan
        finally:
            t.close()
    _no_traceback(caplog)


def test_bad_hello_values_get_an_error_reply_and_no_traceback(root, caplog):
    caplog.set_level(logging.INFO, logger="ferroplasma.scan")
    with _serve(root, token="s3cret") as srv:
        for fields in (
            {"version": wire.VERSION, "token": "\ud800"},  # a lone surrogate: not UTF-8
            {"version": wire.VERSION, "token": ["s3cret"]},
            {"version": wire.VERSION, "token": {"t": 1}},
            {"version": [1], "token": "s3cret"},
            {"version": "1", "token": "s3cret"},
            {},
        ):
            t = _open(srv.address)
            wire.send(t, wire.HELLO, fields)
            kind, f, _ = wire.recv(t)
            assert kind == wire.ERROR and f["code"] in ("auth", "protocol"), (fields, f)
            t.close()
        raw = b"[" * 50_000  # nested deeper than the JSON parser recurses
        t = _open(srv.address)
        t.send([wire.HEAD.pack(wire.HELLO, len(raw), 0), raw])
        kind, f, _ = wire.recv(t)
        assert (kind, f["code"]) == (wire.ERROR, "protocol"), f
        t.close()
        _works(srv.address, token="s3cret")
    _no_traceback(caplog)


def test_listening_beyond_loopback_without_a_token_warns(root, caplog):
    caplog.set_level(logging.INFO, logger="ferroplasma.scan")
    with fp.scan.ScanServer("127.0.0.1:0", root):
        pass
    with fp.scan.ScanServer("0.0.0.0:0", root, token="s3cret"):
        pass
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    with fp.scan.ScanServer("0.0.0.0:0", root):
        pass
    [warning] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "0.0.0.0" in warning.getMessage() and "token" in warning.getMessage()


# ---------------------------------------------------------------- command line


def _cli(*args: str, timeout: float = 20, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [EXE, "scan-server", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=env,
    )


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--listen", "127.0.0.1:99999"], "port"),
        (["--listen", "127.0.0.1"], "HOST:PORT"),
        (["--listen", "127.0.0.1:"], "HOST:PORT"),
        (["--listen", "127.0.0.1:\u00b2"], "HOST:PORT"),
        (["--listen", "no-such-host.invalid:0"], "no-such-host.invalid"),
        (["--listen", "bad\nhost:0"], "listen"),
        (["--root", ""], "root"),
        (["--token", ""], "--token"),
        (["--token-file", ""], "--token-file"),
        (["--token-file", "{tmp}/missing"], "--token-file"),
        (["--token-file", "{tmp}/empty"], "--token-file"),
        (["--token-file", "{tmp}/blank"], "--token-file"),
        (["--token-file", "{tmp}"], "--token-file"),
    ],
)
def test_bad_values_are_one_line_on_stderr_and_exit_2(tmp_path, flags, words):
    (tmp_path / "empty").write_text("")
    (tmp_path / "blank").write_text("\n")
    flags = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    out = _cli("--listen", "127.0.0.1:0", "--root", str(tmp_path), "--no-store", *flags)
    assert out.returncode == 2, out
    assert "Traceback" not in out.stderr and out.stdout == ""
    [line] = out.stderr.splitlines()
    assert line.startswith("ferroplasma scan-server: ") and words in line, line


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--threads", "-3"], "--threads"),
        (["--threads", "0"], "--threads"),
        (["--threads", "many"], "--threads"),
        (["--threads", "100000"], "--threads"),
        (["--max-connections", "0"], "--max-connections"),
        (["--token", "a", "--token-file", "f"], "not allowed with"),
    ],
)
def test_bad_flag_values_are_usage_errors(tmp_path, flags, words):
    out = _cli("--listen", "127.0.0.1:0", "--root", str(tmp_path), "--no-store", *flags, timeout=15)
    assert out.returncode == 2, out
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert out.stderr.startswith("usage:") and words in out.stderr.splitlines()[-1], out.stderr


def _start(root, *flags: str, env: dict | None = None) -> tuple[subprocess.Popen, str, str]:
    """`ferroplasma scan-server` as a process: (process, its address, the
    line it printed)."""
    proc = subprocess.Popen(
        [EXE, "scan-server", "--listen", "127.0.0.1:0", "--root", str(root), "--no-store", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    watchdog = threading.Timer(30, proc.kill)  # a server that never prints ends anyway
    watchdog.start()
    line = proc.stdout.readline()
    watchdog.cancel()
    assert "serving" in line, (line, proc.poll())
    return proc, line.split(" on ")[-1].strip(), line


def _stop(proc: subprocess.Popen) -> tuple[str, str]:
    proc.terminate()
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    return out, err


def test_a_ucx_listener_needs_a_token(root):
    """The UCX binding listens on every interface whatever host it is given:
    without a token, anyone who can reach the machine could query the root."""
    with pytest.raises(ValueError, match="needs a token"):
        fp.scan.ScanServer("127.0.0.1:0", root, ucx_listen="127.0.0.1:0")
    env = {k: v for k, v in os.environ.items() if k != "FERROPLASMA_SCAN_TOKEN"}
    cmd = [EXE, "scan-server", "--listen", "127.0.0.1:0", "--root", str(root)]
    r = subprocess.run(
        [*cmd, "--ucx-listen", "127.0.0.1:0"], capture_output=True, text=True, env=env, timeout=60
    )
    assert r.returncode == 2, r.stderr
    assert "needs a token" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_the_serving_line_is_printed_once(root):
    env = {k: v for k, v in os.environ.items() if k != "FERROPLASMA_SCAN_TOKEN"}
    proc, address, line = _start(root, env={**env, "FERROPLASMA_SCAN_TOKEN": "from-env"})
    try:
        _works(address, token="from-env")
    finally:
        out, err = _stop(proc)
    assert (line + out + err).count("serving") == 1, line + out + err
    assert "Traceback" not in err


def test_the_token_can_come_from_a_file(root, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k != "FERROPLASMA_SCAN_TOKEN"}
    proc, address, _ = _start(root, "--token-file", str(token), env=env)
    try:
        for wrong in (None, "wrong", "s3cret\n"):
            with pytest.raises(fp.errors.AccessDenied):
                fp.scan.connect(address, token=wrong, timeout=10)
        _works(address, token="s3cret")
    finally:
        _, err = _stop(proc)
    assert "Traceback" not in err
    refused = [x for x in err.splitlines() if "refused" in x]  # 3 refusals: a line,
    assert len(refused) == 2 and "2 more" in refused[1], err  # and the count at exit


def test_help_steers_the_token_off_the_command_line():
    out = subprocess.run([EXE, "scan-server", "--help"], capture_output=True, text=True, timeout=60)
    text = " ".join(out.stdout.split())
    assert out.returncode == 0
    assert "--token-file" in text and "$FERROPLASMA_SCAN_TOKEN" in text and "/proc" in text


# ---------------------------------------------------------------- a lying server


def _lying_server(batches: list) -> tuple[str, threading.Thread]:
    """A fake scan server on 127.0.0.1 that answers one client's HELLO and
    INIT_SCAN, then sends ``batches`` ((rows, descriptor, buffers) each)
    for its first ITERATE, and DONE. Returns its address."""
    import pyarrow as pa

    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(30)
    schema = pa.schema([("s", pa.string())])

    def serve() -> None:
        with srv:
            while True:  # the client's connection check comes first
                c, _ = srv.accept()
                c.settimeout(30)
                t = TcpTransport(c)
                try:
                    wire.recv(t)  # HELLO
                    wire.send(t, wire.READY, {"version": wire.VERSION})
                    if wire.recv(t)[0] == wire.INIT_SCAN:
                        break
                except OSError:
                    pass
                t.close()
        try:
            wire.send(t, wire.SCAN, {"scan": 1, "via_store": False}, [schema.serialize()])
            pending = list(batches)
            while (kind := wire.recv(t)[0]) == wire.ITERATE:
                for rows, desc, bufs in pending:  # all for the first one
                    wire.send(t, wire.BATCH, {"scan": 1, "rows": rows, "desc": desc}, bufs)
                pending = []
                wire.send(t, wire.DONE, {"scan": 1, "more": False})
            if kind == wire.FINALIZE:
                wire.send(t, wire.FINALIZED, {"scan": 1})
        except OSError:
            pass  # the client hung up on what it was sent
        finally:
            t.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    return f"127.0.0.1:{srv.getsockname()[1]}", th


def _strings(offsets: list[int], values: bytes) -> tuple[int, list, list]:
    """A one-column string batch as it goes on the wire (the descriptor of
    ``ferroplasma.arrow_layout``: rows, nulls, offset, buffers, children,
    dictionary, then each buffer's size, -1 for no validity bitmap), with
    the offsets and values given, not checked."""
    import numpy as np

    raw = np.array(offsets, dtype=np.int32).tobytes()
    rows = len(offsets) - 1
    return rows, [rows, 0, 0, 3, 0, 0, -1, len(raw), len(values)], [raw, values]


@pytest.mark.parametrize(
    "offsets, values, why",
    [
        ([0, 3, 2, 5], b"abcde", "backwards"),
        ([0, 2, 99], b"abcde", "past the values"),
        ([-8, 2, 5], b"abcde", "negative"),
        ([0, 2, 4], b"ab\xff\xfe", "not UTF-8"),
        ([0, 2, 6], "héllo".encode(), "inside a character"),
    ],
)
def test_a_lying_server_costs_the_client_only_its_scan(offsets, values, why):
    """Offsets and strings a server made up never reach a reader: the scan
    fails with a typed error, and the client carries on."""
    from ferroplasma.errors import FerroplasmaError

    good_offsets, good_values = [0, 2, 2, 5], b"abcde"
    rows, desc, bufs = _strings(good_offsets, good_values)
    address, th = _lying_server([(rows, desc, bufs), _strings(offsets, values)])
    with fp.scan.connect(address, timeout=10) as c:
        with pytest.raises(FerroplasmaError, match="not make a valid"):
            c.to_table("SELECT s FROM dataset", "x.parquet")
    th.join(30)
    # The same fake server telling the truth: the client reads it.
    address, th = _lying_server([(rows, desc, bufs)])
    with fp.scan.connect(address, timeout=10) as c:
        got = c.to_table("SELECT s FROM dataset", "x.parquet")
    assert got.column("s").to_pylist() == ["ab", "", "cde"], why
    th.join(30)
