"""The column-selectivity experiment of "Thallus: An RDMA-based Columnar Data
Transport Protocol" (Chakraborty et al., 2024; docs/references.md): TPC-H
lineitem through the ferroplasma scan transport, a serializing RPC baseline
and Arrow Flight, next to raw TCP measured in the same run.

    sudo .venv/bin/python bench/scan_bench.py run --sf 1 --json bench/results/scan.json
    .venv/bin/python bench/scan_report.py bench/results/scan.json --out docs

`make bench-scan` does both. Two setups:

* cross-host: the servers in one network namespace, the client in another,
  joined by a veth pair (needs root and iproute2);
* same host: everything on loopback, plus a store the server and client
  share (the server places batches in the store, only ids travel).

For each number of columns (1, 2, 4, 8, 16) and each method it times
*transport* (the server materialises the result first; the clock runs from
the first batch asked for to the last one received) and *end to end* (query
sent to table received). The methods:

* ``ferroplasma``: the scan transport (column buffers gathered into one
  send, received into 64-byte-aligned memory);
* ``rpc-ipc``: the same server and protocol, but each batch serialized into
  one contiguous Arrow IPC message first (the Thallus paper's Thallium-RPC
  baseline);
* ``flight``: Arrow Flight ``do_get`` from a pyarrow.flight server running
  the same DuckDB query;
* ``ferroplasma-store`` (same host): ``into_store=`` with the server sharing
  the store;
* ``ferroplasma-ucx``: the same scan over UCX (``ucx://``; the ucxx binding
  from PyPI, whose transports here are TCP and shared memory), where the
  binding is installed.

Beside them, end to end only, ``duckdb``: DuckDB alone running the same
query on the client's side, no transport (the floor under every method,
since server and client share the cores); and a one-row query's time
(what any query costs before its first row).

And, end to end against Flight, a sorted query over strings and nulls:
``SELECT * FROM dataset ORDER BY id`` over 3M rows of 8 columns (ids
shuffled; strings, a date, a boolean, integers and floats with 5-30 % nulls).

TPC-H data: generated once with DuckDB 1.5.5 and PyPI's
duckdb-extension-tpch (in a separate virtual environment, bench/.tpch-venv),
since the DuckDB 2.x wheel has no tpch extension.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from scan_data import SORTED_SQL, prepare, prepare_sorted

HERE = Path(__file__).resolve().parent
COLUMNS = [
    "l_orderkey",
    "l_partkey",
    "l_suppkey",
    "l_linenumber",
    "l_quantity",
    "l_extendedprice",
    "l_discount",
    "l_tax",
    "l_returnflag",
    "l_linestatus",
    "l_shipdate",
    "l_commitdate",
    "l_receiptdate",
    "l_shipinstruct",
    "l_shipmode",
    "l_comment",
]
WIDTHS = [1, 2, 4, 8, 16]
BATCH_ROWS = 1 << 20
NS = ["fps-a", "fps-b"]
IPS = ["10.232.0.1", "10.232.0.2"]
PORTS = {"scan": 7711, "flight": 7712, "tcp": 7713}
UCX_PORT = 7714
TCP_BYTES = 1 << 30
CHUNK = 64 << 20


# ---------------------------------------------------------------- helper roles


def flight_server(listen: str, root: str) -> None:
    """Arrow Flight: do_get runs the ticket's query with DuckDB and streams
    it; the "prepare" action materialises a result first (transport-only)."""
    import duckdb
    import pyarrow.flight as flight

    class Server(flight.FlightServerBase):
        def __init__(self) -> None:
            super().__init__(f"grpc://{listen}")
            self.prepared: dict[str, object] = {}
            self.lock = threading.Lock()

        def _reader(self, req: dict):
            con = duckdb.connect()
            path = os.path.join(root, req["dataset"])
            con.execute(f"CREATE VIEW dataset AS SELECT * FROM read_parquet('{path}')")
            return con, con.sql(req["sql"]).to_arrow_reader(req["batch_rows"])

        def do_action(self, context, action):
            req = json.loads(action.body.to_pybytes())
            con, reader = self._reader(req)
            table = reader.read_all()
            con.close()
            key = str(id(table))
            with self.lock:
                self.prepared[key] = table
            yield flight.Result(key.encode())

        def do_get(self, context, ticket):
            req = json.loads(ticket.ticket)
            if "prepared" in req:
                with self.lock:
                    table = self.prepared.pop(req["prepared"])
                return flight.RecordBatchStream(table)
            con, reader = self._reader(req)

            def batches():
                try:
                    yield from reader
                finally:
                    con.close()

            return flight.GeneratorStream(reader.schema, batches())

    Server().serve()


def tcp_source(listen: str) -> None:
    """Raw TCP: for each connection, read a byte count and send that many
    bytes from one buffer (what a perfect transport would do)."""
    host, port = listen.rsplit(":", 1)
    buf = bytearray(os.urandom(1024)) * (CHUNK // 1024)
    with socket.create_server((host, int(port))) as srv:
        while True:
            conn, _ = srv.accept()
            with conn:
                n = int.from_bytes(conn.recv(8), "little")
                mv = memoryview(buf)
                while n:
                    k = min(n, CHUNK)
                    conn.sendall(mv[:k])
                    n -= k


# ---------------------------------------------------------------- client


def raw_tcp(addr: str, nbytes: int, fresh: bool) -> float:
    """Seconds to receive ``nbytes`` over one TCP connection: into one
    reused buffer, or (``fresh``) into new 64-byte-aligned memory kept until
    the end, as a receiver that keeps the data must."""
    import pyarrow as pa

    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reuse = memoryview(bytearray(CHUNK))
        kept = []
        t0 = time.perf_counter()
        s.sendall(nbytes.to_bytes(8, "little"))
        left = nbytes
        while left:
            k = min(left, CHUNK)
            if fresh:
                b = pa.allocate_buffer(k)
                kept.append(b)
                view = memoryview(b).cast("B")
            else:
                view = reuse[:k]
            got = 0
            while got < k:
                r = s.recv_into(view[got:], k - got)
                if not r:
                    raise ConnectionError("raw TCP source hung up")
                got += r
            left -= k
        return time.perf_counter() - t0


#: What --methods may name (those not available in a setup are skipped).
METHODS = ["ferroplasma", "rpc-ipc", "flight", "ferroplasma-store", "ferroplasma-ucx", "duckdb"]
LATENCY_SQL = "SELECT l_orderkey FROM dataset LIMIT 1"
LATENCY_REPS = 21


def duckdb_alone(root: str, dataset: str, sql: str) -> tuple[float, int]:
    """Seconds for DuckDB to run ``sql`` here and hand over its batches,
    as the servers do, with no transport (the database opened before the
    clock starts); and the batches' bytes."""
    import duckdb

    con = duckdb.connect()
    path = os.path.join(root, dataset)
    con.execute(f"CREATE VIEW dataset AS SELECT * FROM read_parquet('{path}')")
    t0 = time.perf_counter()
    n = sum(_batch_bytes(b) for b in con.sql(sql).to_arrow_reader(BATCH_ROWS))
    dt = time.perf_counter() - t0
    con.close()
    return dt, n


def sql_for(k: int) -> str:
    return f"SELECT {', '.join(COLUMNS[:k])} FROM dataset"


def _batch_bytes(b) -> int:
    return sum(x.size for c in b.columns for x in c.buffers() if x is not None)


def measure_client(args: argparse.Namespace) -> dict:
    """Every measurement of one setup, as seen from the client."""
    import pyarrow.flight as flight

    import ferroplasma as fp

    token = os.environ.get("FERROPLASMA_SCAN_TOKEN")
    scan = fp.scan.connect(args.scan, token=token)
    fl = flight.connect(f"grpc://{args.flight}")
    store = fp.connect(args.store) if args.store else None
    ds = args.dataset
    out: dict = {"widths": [], "raw_tcp": [], "raw_tcp_fresh": []}

    # Every method consumes its batches as a stream (each one counted and
    # dropped, as a consumer that writes or aggregates them would), so the
    # client's memory is recycled rather than faulted in afresh each time.
    def consume(batches) -> int:
        return sum(_batch_bytes(b) for b in batches)

    def fp_run(k: int, materialize: bool, wire_format: str, over=scan) -> tuple[float, int]:
        t0 = time.perf_counter()
        s = over.open(sql_for(k), ds, batch_rows=BATCH_ROWS, materialize=materialize,
                      wire_format=wire_format)  # fmt: skip
        if materialize:
            t0 = time.perf_counter()
        n = consume(s)
        return time.perf_counter() - t0, n

    def store_run(k: int, materialize: bool) -> tuple[float, int]:
        t0 = time.perf_counter()
        s = scan.open(sql_for(k), ds, batch_rows=BATCH_ROWS, materialize=materialize,
                      into_store=store)  # fmt: skip
        if materialize:
            t0 = time.perf_counter()
        n = 0
        for oid in s:
            n += _batch_bytes(store.get(oid))
            store.delete(oid)
        dt = time.perf_counter() - t0
        assert s.via_store, "the server did not share the store"
        return dt, n

    def flight_run(k: int, materialize: bool) -> tuple[float, int]:
        req = {"sql": sql_for(k), "dataset": ds, "batch_rows": BATCH_ROWS}
        t0 = time.perf_counter()
        if materialize:
            key = next(iter(fl.do_action(flight.Action("prepare", json.dumps(req).encode()))))
            req = {"prepared": key.body.to_pybytes().decode()}
            t0 = time.perf_counter()
        reader = fl.do_get(flight.Ticket(json.dumps(req).encode())).to_reader()
        n = consume(reader)
        return time.perf_counter() - t0, n

    methods = {
        "ferroplasma": (
            lambda k: fp_run(k, True, "buffers"),
            lambda k: fp_run(k, False, "buffers"),
        ),
        "rpc-ipc": (lambda k: fp_run(k, True, "ipc"), lambda k: fp_run(k, False, "ipc")),
        "flight": (lambda k: flight_run(k, True), lambda k: flight_run(k, False)),
    }
    if store is not None:
        methods["ferroplasma-store"] = (lambda k: store_run(k, True), lambda k: store_run(k, False))
    if args.ucx:
        over_ucx = fp.scan.connect(args.ucx, token=token)
        methods["ferroplasma-ucx"] = (
            lambda k: fp_run(k, True, "buffers", over_ucx),
            lambda k: fp_run(k, False, "buffers", over_ucx),
        )
    if args.root:
        # The floor under every end-to-end time: the same query run by
        # DuckDB here, with no transport at all (its database opened first).
        methods["duckdb"] = (None, lambda k: duckdb_alone(args.root, ds, sql_for(k)))
    if args.methods:
        methods = {k: v for k, v in methods.items() if k in args.methods}
    for k in args.widths:
        entry: dict = {"columns": k}
        for rep in range(args.reps):
            out["raw_tcp"].append(TCP_BYTES / raw_tcp(args.tcp, TCP_BYTES, False))
            out["raw_tcp_fresh"].append(TCP_BYTES / raw_tcp(args.tcp, TCP_BYTES, True))
            for name, (transport, e2e) in methods.items():
                for mode, fn in (("transport", transport), ("e2e", e2e)):
                    if fn is None:
                        continue
                    dt, n = fn(k)
                    entry.setdefault(f"{name}/{mode}", []).append(dt)
                    entry["bytes"] = n
            print(f"  {k:2d} columns, rep {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
        for key in list(entry):
            if isinstance(entry[key], list):
                entry[key] = statistics.median(entry[key])
        out["widths"].append(entry)
    if args.sorted_dataset and args.sorted:
        # The sorted query over strings and nulls, end to end, alternating.
        sorted_times: dict = {"ferroplasma": [], "flight": [], "duckdb": []}
        req = {"sql": SORTED_SQL, "dataset": args.sorted_dataset, "batch_rows": BATCH_ROWS}
        for _ in range(args.reps):
            t0 = time.perf_counter()
            consume(scan.query(SORTED_SQL, args.sorted_dataset, batch_rows=BATCH_ROWS))
            sorted_times["ferroplasma"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            consume(fl.do_get(flight.Ticket(json.dumps(req).encode())).to_reader())
            sorted_times["flight"].append(time.perf_counter() - t0)
            if args.root:
                dt, _ = duckdb_alone(args.root, args.sorted_dataset, SORTED_SQL)
                sorted_times["duckdb"].append(dt)
        out["sorted"] = {f"{k}/e2e": statistics.median(v) for k, v in sorted_times.items() if v}
        print("  sorted query done", file=sys.stderr, flush=True)
    # What every query costs before its first row: a one-row query, end to
    # end (each scan opens a connection of its own; Flight reuses its channel).
    latency: dict = {"ferroplasma": [], "flight": []}
    tiny = {"sql": LATENCY_SQL, "dataset": ds, "batch_rows": BATCH_ROWS}
    for _ in range(LATENCY_REPS):
        t0 = time.perf_counter()
        consume(scan.query(LATENCY_SQL, ds))
        latency["ferroplasma"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        consume(fl.do_get(flight.Ticket(json.dumps(tiny).encode())).to_reader())
        latency["flight"].append(time.perf_counter() - t0)
    out["latency"] = {k: statistics.median(v) for k, v in latency.items()}
    out["raw_tcp_bytes_s"] = statistics.median(out.pop("raw_tcp"))
    out["raw_tcp_fresh_bytes_s"] = statistics.median(out.pop("raw_tcp_fresh"))
    return out


# ---------------------------------------------------------------- orchestration


class Net:
    """Two network namespaces joined by a veth pair (removed on exit)."""

    def __init__(self) -> None:
        self.down()
        a, b = NS
        script = (
            f"ip netns add {a} && ip netns add {b} && "
            "ip link add fps-veth0 type veth peer name fps-veth1 && "
            f"ip link set fps-veth0 netns {a} && ip link set fps-veth1 netns {b} && "
            f"ip -n {a} addr add {IPS[0]}/24 dev fps-veth0 && "
            f"ip -n {b} addr add {IPS[1]}/24 dev fps-veth1 && "
            f"ip -n {a} link set fps-veth0 up && ip -n {b} link set fps-veth1 up && "
            f"ip -n {a} link set lo up && ip -n {b} link set lo up"
        )
        subprocess.run(["sh", "-c", script], check=True)

    @staticmethod
    def down() -> None:
        for ns in NS:
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL, check=False)


def wait_port(host: str, port: int, prefix: list[str]) -> None:
    code = (
        "import socket, sys, time\n"
        "for _ in range(300):\n"
        "    try:\n"
        f"        socket.create_connection(({host!r}, {port}), timeout=1).close(); sys.exit(0)\n"
        "    except OSError: time.sleep(0.1)\n"
        "sys.exit(1)\n"
    )
    subprocess.run([*prefix, sys.executable, "-c", code], check=True)


def run_setup(name: str, data: Path, prefix_srv: list, prefix_cli: list, host: str,
              store_socket: str | None, args: argparse.Namespace) -> dict:  # fmt: skip
    exe = str(Path(sys.executable).parent / "ferroplasma")
    me = str(Path(__file__).resolve())
    procs = []
    # The scan server's token (a UCX listener needs one), for it and the client.
    os.environ["FERROPLASMA_SCAN_TOKEN"] = os.urandom(16).hex()
    try:
        scan_cmd = [exe, "scan-server", "--listen", f"{host}:{PORTS['scan']}",
                    "--root", str(data.parent), "--log-level", "warning"]  # fmt: skip
        scan_cmd += ["--store-socket", store_socket] if store_socket else ["--no-store"]
        from ferroplasma.scan import ucx

        with_ucx = ucx.available()
        if with_ucx:
            scan_cmd += ["--ucx-listen", f"{host}:{UCX_PORT}"]
        else:
            print("  the UCX transport is not measured: pip install ucxx-cu12", flush=True)
        procs.append(subprocess.Popen([*prefix_srv, *scan_cmd], stdout=subprocess.DEVNULL))
        procs.append(subprocess.Popen([*prefix_srv, sys.executable, me, "flight-server",
                                       "--listen", f"{host}:{PORTS['flight']}",
                                       "--root", str(data.parent)]))  # fmt: skip
        procs.append(subprocess.Popen([*prefix_srv, sys.executable, me, "tcp-source",
                                       "--listen", f"{host}:{PORTS['tcp']}"]))  # fmt: skip
        for port in PORTS.values():
            wait_port(host, port, prefix_cli)
        out = HERE / "results" / f".scan-{name}.json"
        cmd = [*prefix_cli, sys.executable, me, "client", "--dataset", data.name,
               "--scan", f"{host}:{PORTS['scan']}", "--flight", f"{host}:{PORTS['flight']}",
               "--tcp", f"{host}:{PORTS['tcp']}", "--reps", str(args.reps),
               "--widths", ",".join(map(str, args.widths)), "--json", str(out),
               "--sorted-dataset", "sorted-3m.parquet", "--root", str(data.parent),
               "--methods", ",".join(args.methods), "--sorted", str(int(args.sorted))]  # fmt: skip
        if store_socket:
            cmd += ["--store", store_socket]
        if with_ucx:
            cmd += ["--ucx", f"ucx://{host}:{UCX_PORT}"]
        print(f"{name}:", flush=True)
        subprocess.run(cmd, check=True)
        return json.loads(out.read_text())
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)


def run(args: argparse.Namespace) -> None:
    import numpy as np

    import ferroplasma as fp

    data = prepare(args.sf, Path(args.data))
    prepare_sorted(Path(args.data))
    result: dict = {
        "sf": args.sf,
        "rows": None,
        "reps": args.reps,
        "batch_rows": BATCH_ROWS,
        "cpus": os.cpu_count(),
        "setups": {},
    }
    can_netns = os.geteuid() == 0 and shutil.which("ip") and not args.loopback_only
    if can_netns:
        Net()
        try:
            ns = [["ip", "netns", "exec", n] for n in NS]
            result["setups"]["cross-host"] = run_setup(
                "cross-host", data, ns[0], ns[1], IPS[0], None, args
            )
        finally:
            Net.down()
    else:
        print("cross-host setup skipped (needs root and iproute2 for network namespaces)")
    if args.cross_host_only:
        if not result["setups"]:
            sys.exit("--cross-host-only needs root and iproute2 (and no --loopback-only)")
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
        return
    with fp.start_store(args.store_memory) as store:
        same = run_setup("same-host", data, [], [], "127.0.0.1", store.socket, args)
    src = np.ones(256 << 20, dtype=np.uint8)
    dst = np.empty_like(src)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    same["memcpy_bytes_s"] = src.nbytes / min(times)
    result["setups"]["same-host"] = same
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.json}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="the whole experiment (root for the cross-host setup)")
    r.add_argument("--sf", type=int, default=1, help="TPC-H scale factor (default 1)")
    r.add_argument("--data", default=str(HERE / "data"), help="where the Parquet goes")
    r.add_argument("--reps", type=int, default=5, help="repetitions (medians reported)")
    r.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    r.add_argument("--store-memory", default="4GiB", help="store size for the same-host setup")
    r.add_argument("--loopback-only", action="store_true", help="skip the cross-host setup")
    r.add_argument("--cross-host-only", action="store_true", help="skip the same-host setup")
    r.add_argument("--json", default=str(HERE / "results" / "scan.json"))
    r.add_argument("--methods", default="", help="only these methods (comma-separated)")
    r.add_argument("--no-sorted", dest="sorted", action="store_false",
                   help="skip the sorted query")  # fmt: skip
    c = sub.add_parser("client", help="internal: the client side of one setup")
    for flag in ("--scan", "--flight", "--tcp", "--dataset", "--json"):
        c.add_argument(flag, required=True)
    c.add_argument("--store")
    c.add_argument("--root", help="the datasets' directory: also time DuckDB alone here")
    c.add_argument("--ucx", help="also time the scan over UCX at this ucx:// address")
    c.add_argument("--sorted-dataset", help="also time SORTED_SQL over this dataset")
    c.add_argument("--reps", type=int, default=3)
    c.add_argument("--methods", default="")
    c.add_argument("--sorted", type=int, default=1)
    c.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    f = sub.add_parser("flight-server", help="internal: the Arrow Flight baseline")
    f.add_argument("--listen", required=True)
    f.add_argument("--root", required=True)
    t = sub.add_parser("tcp-source", help="internal: the raw TCP sender")
    t.add_argument("--listen", required=True)
    args = p.parse_args()
    if hasattr(args, "widths"):
        args.widths = [int(w) for w in str(args.widths).split(",")]
    if hasattr(args, "methods"):
        args.methods = [m for m in str(args.methods).split(",") if m]
        unknown = sorted(set(args.methods) - set(METHODS))
        if unknown:
            p.error(f"unknown --methods {', '.join(unknown)} (known: {', '.join(METHODS)})")
    if args.cmd == "run":
        run(args)
    elif args.cmd == "client":
        Path(args.json).write_text(json.dumps(measure_client(args)))
    elif args.cmd == "flight-server":
        flight_server(args.listen, args.root)
    else:
        tcp_source(args.listen)


if __name__ == "__main__":
    main()
