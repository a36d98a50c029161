"""The jobs on Dask across hosts, against Dask's own sort, in one run.

    .venv/bin/python bench/jobs_dask_bench.py --size 2GiB --rows 50000000 \
        --json bench/results/jobs-dask.json

`make bench-jobs` runs it (QUICK=1: 256 MiB and 5 M rows). Same hosts for
both, started once (``ferroplasma.jobs.hosts.Hosts``): 3 hosts, each a
network namespace (root; loopback otherwise, where bytes are not counted)
with its store and one single-threaded Dask worker; the scheduler in a
fourth namespace; the driver (this process) outside.

**records** (the workload of "Plasma Map/Reduce Slightly Faster Than
Hadoop", Stolpmann, 2012; docs/references.md): the input is written once
into a directory every worker sees. Per repetition, interleaved:
``records.sort_records(..., workers=dask_client, partitions=80)``; and Dask
alone: the files read in 128 MiB pieces into a Dask DataFrame (the 8-byte
key as an unsigned integer, the other 92 bytes as 12 integer columns, so
that Dask shuffles arrays, not Python objects), ``sort_values("key",
npartitions=80, shuffle_method="p2p")``, each partition written back as
records into ``part-NNNNN``. Both outputs are checked with ``records
validate`` (once per method).

**dataframe** (the parallel sample sort of "Plasma In-Memory Object Store",
Moritz and Nishihara, 2017): an int64 key and a float64 value, generated on
the workers, a third of the rows on each host: kept in the host's store
(ferroplasma) or persisted in the worker's memory (Dask). Timed:
``sort_dataframe(client, parts, "key", workers=dask_client)`` against
``ddf.sort_values("key", shuffle_method="p2p").persist()``; both results
are checked (row count, sorted keys, and the sum of the values).

Bytes crossing hosts: what the hosts' links carried during each run
(``Hosts.bytes_sent``), next to the minimum for a sort that moves each
byte at most once: (hosts - 1) / hosts of the data (for the DataFrame, 24
bytes a row: key, value, and the index label a sorted frame keeps).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from jobs_bench import _machine  # the same description of the machine

HERE = Path(__file__).resolve().parent
HOSTS = 3


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------ Dask alone


def _read_piece(path: str, start: int, count: int):
    """Records ``start`` … ``start + count`` of ``path`` as a DataFrame of
    integer columns: ``key`` (the 8 key bytes, big-endian) and r0 … r11
    (the other 92 bytes)."""
    import pandas as pd

    with open(path, "rb") as f:
        f.seek(start * 100)
        recs = np.frombuffer(f.read(count * 100), dtype=np.uint8).reshape(-1, 100)
    cols = {"key": recs[:, :8].copy().view(">u8")[:, 0].astype(np.uint64)}
    rest = np.ascontiguousarray(recs[:, 8:96]).view("<u8")
    for i in range(11):
        cols[f"r{i}"] = rest[:, i]
    cols["r11"] = np.ascontiguousarray(recs[:, 96:]).view("<u4")[:, 0]
    return pd.DataFrame(cols)


def _write_part(frame, path: str) -> int:
    """Writes a partition of records back in their text form."""
    n = len(frame)
    recs = np.empty((n, 100), dtype=np.uint8)
    recs[:, :8] = frame["key"].to_numpy(np.uint64).astype(">u8").view(np.uint8).reshape(n, 8)
    rest = np.empty((n, 11), dtype="<u8")
    for i in range(11):
        rest[:, i] = frame[f"r{i}"].to_numpy()
    recs[:, 8:96] = rest.view(np.uint8).reshape(n, 88)
    recs[:, 96:] = frame["r11"].to_numpy("<u4").view(np.uint8).reshape(n, 4)
    with open(path, "wb") as f:
        f.write(recs.tobytes())
    return n


def dask_sort_records(dask, files: list[str], out: str, partitions: int) -> None:
    import dask.dataframe as dd
    from dask import delayed

    piece = (128 << 20) // 100
    pieces = []
    for path in files:
        n = os.path.getsize(path) // 100
        for start in range(0, n, piece):
            pieces.append(delayed(_read_piece)(path, start, min(piece, n - start)))
    meta = _read_piece(files[0], 0, 0)
    ddf = dd.from_delayed(pieces, meta=meta, verify_meta=False)
    ordered = ddf.sort_values("key", npartitions=partitions, shuffle_method="p2p")
    parts = ordered.to_delayed()
    writes = [
        delayed(_write_part)(p, os.path.join(out, f"part-{i:05d}")) for i, p in enumerate(parts)
    ]
    dask.gather(dask.compute(writes))


# ---------------------------------------------------------------- records


def bench_records(hosts, args, result: dict) -> None:
    from ferroplasma.jobs import records as R

    work = Path(tempfile.mkdtemp(prefix="fp-jobs-dask-", dir=args.data))
    try:
        src = work / "in"
        _say(f"records: writing {args.size} of input")
        R.gen_records(str(src), args.size, files=8, seed=4, workers=os.cpu_count() or 1)
        files = sorted(str(p) for p in src.iterdir())
        total = sum(os.path.getsize(f) for f in files)
        rows: dict[str, list] = {"ferroplasma": [], "dask": []}
        sent: dict[str, list] = {"ferroplasma": [], "dask": []}
        for rep in range(args.reps):
            for method in ("ferroplasma", "dask"):
                out = work / f"out-{method}"
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()
                before = hosts.bytes_sent() if hosts.net else 0
                t = time.perf_counter()
                if method == "ferroplasma":
                    R.sort_records(
                        str(src), str(out), partitions=args.partitions, workers=hosts.dask,
                        socket=hosts.stores[0].socket, say=lambda _m: None,
                    )  # fmt: skip
                else:
                    dask_sort_records(hosts.dask, files, str(out), args.partitions)
                dt = time.perf_counter() - t
                rows[method].append(dt)
                if hosts.net:
                    sent[method].append(hosts.bytes_sent() - before)
                _say(f"records rep {rep + 1}: {method} {dt:.1f} s")
                if rep == 0:
                    report = R.validate_records(str(src), str(out), workers=1)
                    if not report.ok:
                        raise SystemExit(f"{method}'s output is wrong: {report.problems}")
        result["records"] = _summary(rows, sent, total)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -------------------------------------------------------------- dataframe


def _frame(seed: int, rows: int):
    import pandas as pd

    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "key": rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, rows),
            "value": rng.standard_normal(rows),
        }
    )


def _put_frame(seed: int, rows: int) -> bytes:
    from ferroplasma.jobs.pool import worker_client

    return worker_client().put(_frame(seed, rows)).binary()


def _check(frames_sum: float, rows: int, key_sorted: bool, got_rows: int, got_sum: float) -> None:
    if got_rows != rows or not key_sorted or not np.isclose(got_sum, frames_sum):
        raise SystemExit(f"wrong result: {got_rows} rows of {rows}, sorted {key_sorted}")


def bench_dataframe(hosts, args, result: dict) -> None:
    import dask.dataframe as dd
    import distributed

    import ferroplasma as fp
    from ferroplasma.jobs.dataframe import sort_dataframe

    parts_n = args.df_partitions
    per = args.rows // parts_n
    workers = sorted(hosts.dask.scheduler_info()["workers"])
    where = [[workers[q % len(workers)]] for q in range(parts_n)]
    client = hosts.clients[0]
    want_sum = None
    rows: dict[str, list] = {"ferroplasma": [], "dask": []}
    sent: dict[str, list] = {"ferroplasma": [], "dask": []}
    for rep in range(args.reps):
        # ferroplasma: every partition made in its host's store.
        futures = [
            hosts.dask.submit(_put_frame, q, per, workers=w, pure=False)
            for q, w in enumerate(where)
        ]
        parts = [fp.ObjectID(b) for b in hosts.dask.gather(futures)]
        before = hosts.bytes_sent() if hosts.net else 0
        t = time.perf_counter()
        out = sort_dataframe(client, parts, "key", workers=hosts.dask)
        dt = time.perf_counter() - t
        if hosts.net:
            sent["ferroplasma"].append(hosts.bytes_sent() - before)
        rows["ferroplasma"].append(dt)
        _say(f"dataframe rep {rep + 1}: ferroplasma {dt:.1f} s")
        if rep == 0:
            keys_ok, n, total = True, 0, 0.0
            last = None
            for oid in out:
                b = client.get(oid, timeout=120)
                k = b["key"].to_numpy()
                keys_ok &= bool((np.diff(k) >= 0).all()) and (last is None or k[0] >= last)
                last = k[-1] if len(k) else last
                n += len(b)
                total += float(b["value"].sum())
                del b
            want_sum = sum(float(_frame(q, per)["value"].sum()) for q in range(parts_n))
            _check(want_sum, per * parts_n, keys_ok, n, total)
        client.delete(out + parts)
        # Dask alone: the same partitions in the workers' memory.
        made = [
            hosts.dask.submit(_frame, q, per, workers=w, pure=False) for q, w in enumerate(where)
        ]
        distributed.wait(made)
        ddf = dd.from_delayed(made, meta=_frame(0, 0), verify_meta=False)
        before = hosts.bytes_sent() if hosts.net else 0
        t = time.perf_counter()
        ordered = hosts.dask.persist(ddf.sort_values("key", shuffle_method="p2p"))
        distributed.wait(ordered)
        dt = time.perf_counter() - t
        if hosts.net:
            sent["dask"].append(hosts.bytes_sent() - before)
        rows["dask"].append(dt)
        _say(f"dataframe rep {rep + 1}: dask {dt:.1f} s")
        if rep == 0:
            got_rows = int(ordered.shape[0].compute())
            got_sum = float(ordered["value"].sum().compute())
            heads_ok = bool(
                ordered.map_partitions(
                    lambda f: (np.diff(f["key"].to_numpy()) >= 0).all(), meta=bool
                )
                .compute()
                .all()
            )
            _check(want_sum, per * parts_n, heads_ok, got_rows, got_sum)
        del ordered, ddf, made
    # A sorted frame keeps each row's index label (pandas' and Dask's
    # sort_values do): 8 bytes a row more than the partitions, whose
    # RangeIndex cost nothing.
    result["dataframe"] = _summary(rows, sent, args.rows * 24)


def _summary(rows: dict, sent: dict, data_bytes: int) -> dict:
    out = {"data_bytes": data_bytes, "min_bytes_crossing": data_bytes * (HOSTS - 1) // HOSTS}
    for method, times in rows.items():
        out[method] = {
            "seconds": times,
            "median_s": statistics.median(times),
            "bytes_sent": sent[method],
        }
    out["speedup"] = out["dask"]["median_s"] / out["ferroplasma"]["median_s"]
    return out


BEGIN = "<!-- bench-jobs-dask:begin (generated by make bench-jobs; edits are overwritten) -->"
END = "<!-- bench-jobs-dask:end -->"
TITLE = "## Jobs across hosts: ferroplasma on Dask against Dask alone"


def _mb(n: float) -> str:
    return f"{n / 1e6:,.0f} MB"


def report(result: dict, out: str) -> None:
    """The docs/benchmarks.md section and docs/img/jobs-dask.png."""
    sys.path.insert(0, str(HERE))
    from compare.report import replace_section

    a = result["args"]
    where = (
        f"{result['hosts']} hosts, each a network namespace with its store and one "
        "single-threaded Dask worker, the scheduler in a fourth"
        if result["netns"]
        else f"{result['hosts']} hosts on loopback (not root: bytes crossing not counted)"
    )
    lines = [
        f"{where}; {result['machine']['cpus']} cores; {a['reps']} repetitions interleaved, "
        f"medians. Reproduce: `make bench-jobs` (or `.venv/bin/python "
        f"bench/jobs_dask_bench.py --size {a['size']} --rows {a['rows']}`). "
        f"Run {result['machine']['date']}.",
        "",
        "| job | data | ferroplasma on Dask | Dask alone (p2p shuffle) | Dask ÷ ferroplasma "
        "| bytes crossing hosts, ferroplasma / Dask / minimum |",
        "|---|---|---:|---:|---:|---|",
    ]
    for job, what in (
        ("records", f"{a['size']} of records into {a['partitions']} partitions"),
        ("dataframe", f"{a['rows'] / 1e6:.0f} M rows (int64 key, float64 value)"),
    ):
        d = result.get(job)
        if not d:
            continue
        fp_, dk = d["ferroplasma"], d["dask"]
        if fp_["bytes_sent"]:
            crossed = (
                f"{_mb(statistics.median(fp_['bytes_sent']))} / "
                f"{_mb(statistics.median(dk['bytes_sent']))} / {_mb(d['min_bytes_crossing'])}"
            )
        else:
            crossed = "not counted"
        lines.append(
            f"| {job} | {what} | {fp_['median_s']:.1f} s | {dk['median_s']:.1f} s | "
            f"**{d['speedup']:.2f}×** | {crossed} |"
        )
    lines += ["", "![ferroplasma on Dask vs Dask alone](img/jobs-dask.png)", ""]
    replace_section(os.path.join(out, "benchmarks.md"), "\n".join(lines) + "\n", BEGIN, END, TITLE)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs = [j for j in ("records", "dataframe") if result.get(j)]
    fig, ax = plt.subplots(figsize=(7, 0.8 + 0.9 * len(jobs)))
    y = np.arange(len(jobs))
    for k, (method, color) in enumerate((("ferroplasma", "#4c72b0"), ("dask", "#dd8452"))):
        vals = [result[j][method]["median_s"] for j in jobs]
        bars = ax.barh(y + (0.2 if k else -0.2), vals, 0.38, color=color,
                       label="ferroplasma on Dask" if k == 0 else "Dask alone (p2p)")  # fmt: skip
        ax.bar_label(bars, fmt="%.1f s", padding=3, fontsize=8)
    ax.set_yticks(y, jobs)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (lower is better)")
    ax.set_title(f"Sorting across {result['hosts']} hosts on Dask")
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.join(out, "img"), exist_ok=True)
    fig.savefig(os.path.join(out, "img", "jobs-dask.png"), dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--size", default="2GiB", help="records to sort (default 2GiB)")
    p.add_argument("--partitions", type=int, default=80, help="record partitions (80)")
    p.add_argument("--rows", type=int, default=50_000_000, help="DataFrame rows (50 M)")
    p.add_argument("--df-partitions", type=int, default=12, help="DataFrame partitions (12)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--memory", default="3GiB", help="each host's store (3GiB)")
    p.add_argument("--data", default=str(HERE / "data"), help="where the record input goes")
    p.add_argument("--only", choices=["records", "dataframe"], help="one job only")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--out", help="also write the docs section and plot into this docs dir")
    p.add_argument("--from-json", help="measure nothing: report an earlier run's JSON")
    args = p.parse_args()
    if args.from_json:
        report(json.loads(Path(args.from_json).read_text()), args.out or "docs")
        return

    from ferroplasma.jobs.hosts import Hosts, can_use_netns

    os.makedirs(args.data, exist_ok=True)
    netns = can_use_netns()
    if not netns:
        _say("not root: hosts on loopback, bytes crossing hosts not counted")
    result: dict = {"machine": _machine(), "hosts": HOSTS, "netns": netns, "args": vars(args)}
    with Hosts(HOSTS, memory=args.memory, netns=netns, peer_timeout="10s") as hosts:
        if args.only in (None, "records"):
            bench_records(hosts, args, result)
        if args.only in (None, "dataframe"):
            bench_dataframe(hosts, args, result)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text)
    if args.out:
        report(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
