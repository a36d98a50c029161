"""Jobs on the store, timed next to their single-machine anchors in one run.

    .venv/bin/python bench/jobs_bench.py dataframe --rows 100000000 \
        --json bench/results/jobs-df.json
    .venv/bin/python bench/jobs_bench.py records --size 10GiB --json bench/results/jobs-rec.json
    .venv/bin/python bench/jobs_report.py bench/results/jobs-*.json --out docs

`make bench-jobs` runs all three (QUICK=1: 20 M rows and 1 GiB).

**dataframe** (the parallel sample sort of "Plasma In-Memory Object Store",
Moritz and Nishihara, 2017; docs/references.md): an int64 key (uniform over
the whole int64 range) and a float64 payload. Anchor:
``DataFrame.sort_values("key")`` in one process (pandas' default quicksort,
unstable) and with ``kind="stable"`` (what the job guarantees). The job: the
frame as K partitions in a store (prefaulted), ``fp.jobs.sort_dataframe`` on
a started pool of ``workers`` processes, result in the store. Each method
``--reps`` times, interleaved; speed-up = pandas median / job median;
efficiency = speed-up / workers.

**records** (the workload of "Plasma Map/Reduce Slightly Faster Than
Hadoop", Stolpmann, 2012): ``ferroplasma records gen`` writes the input once;
then, interleaved per repetition: ``ferroplasma records sort`` into 80
partitions (its own private store), GNU ``sort --parallel=N -S <same
memory>`` with ``LC_ALL=C`` into one file, and Spark local mode
(``local[N]``, pyspark in bench/.spark-venv) range-partitioning into 80
sorted files (``--spark-reps``, default 1: it takes minutes). Each output
is checked with ``ferroplasma records validate``
(once per method) and deleted before the next run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = sys.executable


def _machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


# ------------------------------------------------------------------ dataframe


def bench_dataframe(args: argparse.Namespace) -> dict:
    import numpy as np
    import pandas as pd

    import ferroplasma as fp
    from ferroplasma import jobs

    n, k, workers = args.rows, args.partitions, args.workers
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "key": rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, n),
            "payload": rng.random(n),
        }
    )
    data_bytes = int(frame.memory_usage(index=False).sum())
    times: dict[str, list[float]] = {"pandas": [], "pandas-stable": [], "ferroplasma": []}
    if args.single_worker:
        times["ferroplasma-1-worker"] = []
    memory = max(2**30, data_bytes * 6)
    with fp.start_store(memory, prefault=True) as store:
        client = store.connect()
        edges = [n * i // k for i in range(k + 1)]
        parts = [client.put(frame.iloc[a:b]) for a, b in zip(edges, edges[1:])]
        with jobs.Pool(store.socket, workers) as pool, jobs.Pool(store.socket, 1) as one:
            pool.start()
            one.start()
            for rep in range(args.reps):
                for method in times:
                    t = time.perf_counter()
                    if method == "pandas":
                        out = frame.sort_values("key")
                    elif method == "pandas-stable":
                        out = frame.sort_values("key", kind="stable")
                    else:
                        use = one if method.endswith("1-worker") else pool
                        out = jobs.sort_dataframe(client, parts, "key", workers=use)
                    dt = time.perf_counter() - t
                    if method.startswith("ferroplasma"):
                        if rep == 0:
                            _check_sorted(client, out, n)
                        client.delete(out)
                    del out
                    times[method].append(dt)
                    print(f"  rep {rep} {method:22s} {dt:7.2f} s", flush=True)
    med = {m: statistics.median(v) for m, v in times.items()}
    speedup = med["pandas"] / med["ferroplasma"]
    result = {
        "kind": "dataframe",
        "rows": n,
        "bytes": data_bytes,
        "partitions": k,
        "workers": workers,
        "reps": args.reps,
        "times": times,
        "median": med,
        "speedup_vs_pandas": speedup,
        "speedup_vs_pandas_stable": med["pandas-stable"] / med["ferroplasma"],
        "efficiency_per_core": speedup / workers,
        "machine": _machine(),
        "command": "bench/jobs_bench.py " + " ".join(sys.argv[2:]),
    }
    print(
        f"dataframe {n:,} rows: pandas {med['pandas']:.2f} s, stable {med['pandas-stable']:.2f} s, "
        f"ferroplasma ({workers} workers) {med['ferroplasma']:.2f} s: speed-up {speedup:.2f}× "
        f"({result['speedup_vs_pandas_stable']:.2f}× the stable sort), efficiency "
        f"{result['efficiency_per_core']:.2f} per core"
    )
    return result


def _check_sorted(client, out, n) -> None:
    import numpy as np

    frames = client.get(out)
    keys = np.concatenate([f["key"].to_numpy() for f in frames])
    assert len(keys) == n and bool((keys[1:] >= keys[:-1]).all()), "job output not sorted"


# ------------------------------------------------------------------ records


def _run(cmd: list[str], env: dict | None = None, **kw) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env={**os.environ, **(env or {})}, **kw)
    return time.perf_counter() - t


def _fp(*args: str) -> list[str]:
    return [PY, "-m", "ferroplasma", *args]


def _drop_caches() -> None:
    """Writes dirty pages out so one method's output does not slow the next."""
    subprocess.run(["sync"], check=False)


SPARK_JOB = r"""
import sys
from pyspark.sql import SparkSession, functions as F
inp, out, parts, cores, mem = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
spark = (SparkSession.builder.master(f"local[{cores}]")
         .config("spark.driver.memory", mem)
         .config("spark.sql.shuffle.partitions", parts)
         .config("spark.ui.enabled", "false")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
df = spark.read.text(inp)
key = F.substring("value", 1, 8)
(df.repartitionByRange(parts, key).sortWithinPartitions(key)
   .write.mode("overwrite").option("lineSep", "\n").text(out))
spark.stop()
"""


def bench_records(args: argparse.Namespace) -> dict:
    from ferroplasma.jobs.records import parse_size

    data = Path(args.data)
    inp = data / "in"
    size = parse_size(args.size)
    have = sum(f.stat().st_size for f in inp.glob("records-*.txt")) if inp.exists() else 0
    if have != size // 100 * 100:
        shutil.rmtree(inp, ignore_errors=True)
        print(f"generating {size / 2**30:.1f} GiB of records in {inp}", flush=True)
        _run(_fp("records", "gen", "--size", str(size), "--files", "10", "--out", str(inp)))
    out = data / "out"
    tmp = data / "tmp"
    workers = args.workers
    mem_gib = max(1, int(size * 1.1 / 2**30) + 1)
    methods = ["ferroplasma", "gnu-sort"] + ([] if args.no_spark else ["spark"])
    spark_py = HERE / ".spark-venv" / "bin" / "python"
    if "spark" in methods and not spark_py.exists():
        raise SystemExit(
            "Spark: python3 -m venv bench/.spark-venv && bench/.spark-venv/bin/pip install pyspark"
        )
    spark_script = data / "spark_sort.py"
    spark_script.write_text(SPARK_JOB)
    times: dict[str, list[float]] = {m: [] for m in methods}
    checked: dict[str, str] = {}
    summary_line = ""
    for rep in range(args.reps):
        for method in methods:
            if method == "spark" and rep >= args.spark_reps:
                continue
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            _drop_caches()
            if method == "ferroplasma":
                cmd = _fp(
                    "records", "sort", "--input", str(inp), "--output", str(out),
                    "--partitions", str(args.partitions), "--workers", str(workers),
                    "--socket", str(tmp / "none.sock"), "--quiet",
                )  # fmt: skip
                t = time.perf_counter()
                r = subprocess.run(cmd, check=True, capture_output=True, text=True)
                dt = time.perf_counter() - t
                summary_line = r.stdout.strip()
            elif method == "gnu-sort":
                out.mkdir(parents=True)
                files = sorted(str(p) for p in inp.glob("records-*.txt"))
                cmd = ["sort", f"--parallel={workers}", f"-S{mem_gib}G", "-T", str(tmp)]
                with open(out / "part-00000", "wb") as f:
                    dt = _run([*cmd, *files], env={"LC_ALL": "C"}, stdout=f)
            else:
                cmd = [
                    str(spark_py), str(spark_script), str(inp), str(out),
                    str(args.partitions), str(workers), f"{mem_gib + 2}g",
                ]  # fmt: skip
                dt = _run(cmd, env={"PYSPARK_PYTHON": str(spark_py)})
            times[method].append(dt)
            print(f"  rep {rep} {method:12s} {dt:8.1f} s  {size / 1e6 / dt:7.1f} MB/s", flush=True)
            if method not in checked:
                r = subprocess.run(
                    _fp(
                        "records", "validate", "--input", str(inp), "--output", str(out), "--quiet"
                    ),
                    capture_output=True,
                    text=True,
                )
                checked[method] = r.stdout.strip().splitlines()[0] if r.stdout else r.stderr
                print(f"    validate: {checked[method]}", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    med = {m: statistics.median(v) for m, v in times.items()}
    mbps = {m: size / 1e6 / t for m, t in med.items()}
    result = {
        "kind": "records",
        "bytes": size // 100 * 100,
        "partitions": args.partitions,
        "workers": workers,
        "reps": args.reps,
        "times": times,
        "median": med,
        "mb_per_s": mbps,
        "mb_per_s_per_core": {m: v / workers for m, v in mbps.items()},
        "ratio_vs_gnu_sort": mbps["ferroplasma"] / mbps["gnu-sort"],
        "validated": checked,
        "ferroplasma_summary": summary_line,
        "machine": _machine(),
        "command": "bench/jobs_bench.py " + " ".join(sys.argv[2:]),
    }
    if "spark" in mbps:
        result["ratio_vs_spark"] = mbps["ferroplasma"] / mbps["spark"]
    print(
        "records: "
        + ", ".join(f"{m} {v:.0f} MB/s" for m, v in mbps.items())
        + f"; ferroplasma = {result['ratio_vs_gnu_sort']:.2f}× GNU sort"
        + (f", {result['ratio_vs_spark']:.2f}× Spark" if "spark" in mbps else "")
    )
    return result


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="what", required=True)
    d = sub.add_parser("dataframe", help="sample sort vs pandas sort_values")
    d.add_argument("--rows", type=int, default=100_000_000)
    d.add_argument("--partitions", type=int, default=8)
    d.add_argument("--single-worker", action="store_true", help="also time a 1-worker job")
    r = sub.add_parser("records", help="record sort vs GNU sort and Spark")
    r.add_argument("--size", default="10GiB")
    r.add_argument("--partitions", type=int, default=80)
    r.add_argument("--data", default=str(HERE / "data" / "records"))
    r.add_argument("--no-spark", action="store_true")
    r.add_argument(
        "--spark-reps", type=int, default=1, help="Spark repetitions (default 1: minutes each)"
    )
    for sp in (d, r):
        sp.add_argument("--workers", type=int, default=os.cpu_count())
        sp.add_argument("--reps", type=int, default=3)
        sp.add_argument("--json", help="write the results here")
    args = p.parse_args()
    result = bench_dataframe(args) if args.what == "dataframe" else bench_records(args)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
