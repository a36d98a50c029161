"""Serialization benchmark: ferroplasma put/get against pickle and memcpy.

Runs, in one process and one run:

* the four test objects of "Fast Python Serialization with Ray and Apache
  Arrow" (Moritz and Nishihara, 2017; docs/references.md): pickle
  (HIGHEST_PROTOCOL) dumps/loads next to ferroplasma put (serialize into the
  store) and get (deserialize from it);
* numpy arrays of 1 kB, 100 kB, 10 MB and 100 MB: put and get, next to pickle
  dumps/loads and a memcpy into touched memory of the same size.

Prints a table with ratios, checks the targets, writes JSON and PNG plots.

    make bench-python                       # or:
    .venv/bin/python bench/python_serialization.py --out docs
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import platform
import statistics
import sys
import time

import numpy as np

import ferroplasma as fp
from compare.objects import ray_blog_objects  # bench/ is on sys.path as the script dir


def timed(fn, repeat, cleanup=None, min_sample=0.02):
    """Median, min and max seconds per call of `fn()`, as timeit measures:
    garbage collection off, each sample long enough (>= `min_sample` s) to
    be timed precisely; `cleanup(results)` runs after each sample, untimed."""

    def sample(number):
        results = []
        t = time.perf_counter()
        for _ in range(number):
            results.append(fn())
        dt = time.perf_counter() - t
        if cleanup:
            cleanup(results)
        return dt

    gc_was = gc.isenabled()
    gc.disable()
    try:
        number = 1
        while True:
            dt = sample(number)
            if dt >= min_sample or number >= 4096:
                break
            number = min(4096, max(number * 2, int(number * min_sample / max(dt, 1e-9))))
        samples = [sample(number) / number for _ in range(repeat)]
    finally:
        if gc_was:
            gc.enable()
    return statistics.median(samples), min(samples), max(samples)


def bench_object(client, obj, repeat):
    blob = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    p_ser = timed(lambda: pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), repeat)
    p_de = timed(lambda: pickle.loads(blob), repeat)
    f_ser = timed(lambda: client.put(obj), repeat, cleanup=client.delete)
    oid = client.put(obj)
    f_de = timed(lambda: client.get(oid), repeat)
    client.delete(oid)
    return {"pickle": [p_ser, p_de], "ferroplasma": [f_ser, f_de]}


def bench_array(client, nbytes, repeat):
    arr = np.random.default_rng(1).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(arr)
    np.copyto(dst, arr)  # touch the destination pages
    memcpy = timed(lambda: np.copyto(dst, arr), repeat)
    blob = pickle.dumps(arr, protocol=pickle.HIGHEST_PROTOCOL)
    p_ser = timed(lambda: pickle.dumps(arr, protocol=pickle.HIGHEST_PROTOCOL), repeat)
    p_de = timed(lambda: pickle.loads(blob), repeat)
    f_put = timed(lambda: client.put(arr), repeat, cleanup=client.delete)
    oid = client.put(arr)
    f_get = timed(lambda: client.get(oid), repeat)
    client.delete(oid)
    return {
        "bytes": nbytes,
        "memcpy": memcpy,
        "pickle_dumps": p_ser,
        "pickle_loads": p_de,
        "put": f_put,
        "get": f_get,
    }


def round_trip_latency(client, repeat):
    """1-byte put/get of an inline object and a Unix-socket ping-pong, for scale."""
    import socket

    a, b = socket.socketpair()
    import threading

    def echo():
        while True:
            d = b.recv(1)
            if not d:
                return
            b.send(d)

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    rt = timed(lambda: (a.send(b"x"), a.recv(1)), repeat * 50)
    a.close()
    return rt


def human(n):
    for unit in ["B", "kB", "MB", "GB"]:
        if n < 1000:
            return f"{n:g} {unit}"
        n /= 1000
    return f"{n:g} TB"


def us(t):
    return t * 1e6


def report(objs, arrays, checks):
    lines = []
    lines.append("Ray serialization post's objects (median seconds; ratio = ferroplasma / pickle)")
    lines.append(
        f"{'object':<34} {'pickle ser':>11} {'fp put':>11} {'ratio':>7} "
        f"{'pickle de':>11} {'fp get':>11} {'ratio':>7}"
    )
    for name, r in objs.items():
        ps, pd_ = r["pickle"][0][0], r["pickle"][1][0]
        fs, fd = r["ferroplasma"][0][0], r["ferroplasma"][1][0]
        lines.append(
            f"{name:<34} {ps:>11.5f} {fs:>11.5f} {fs / ps:>7.3f} "
            f"{pd_:>11.5f} {fd:>11.6f} {fd / pd_:>7.4f}"
        )
    lines.append("")
    lines.append("numpy arrays (median µs; GiB/s for copies)")
    lines.append(
        f"{'size':>8} {'memcpy':>10} {'put':>10} {'put/memcpy bw':>14} {'get':>8} "
        f"{'pickle dumps':>13} {'pickle loads':>13}"
    )
    for a in arrays:
        lines.append(
            f"{human(a['bytes']):>8} {us(a['memcpy'][0]):>10.1f} {us(a['put'][0]):>10.1f} "
            f"{a['memcpy'][0] / a['put'][0]:>14.2f} {us(a['get'][0]):>8.1f} "
            f"{us(a['pickle_dumps'][0]):>13.1f} {us(a['pickle_loads'][0]):>13.1f}"
        )
    lines.append("")
    for name, ok, detail in checks:
        lines.append(f"target {name}: {'met' if ok else 'MISSED'} ({detail})")
    return "\n".join(lines)


def targets(objs, arrays):
    by = {a["bytes"]: a for a in arrays}
    big = by[100_000_000]
    checks = [
        (
            "get of a 100 MB array <= 50 us",
            big["get"][0] <= 50e-6,
            f"{us(big['get'][0]):.1f} us; 1 kB: {us(by[1000]['get'][0]):.1f} us",
        ),
        (
            "put of a 100 MB array >= 0.8x memcpy bandwidth",
            big["memcpy"][0] / big["put"][0] >= 0.8,
            f"{big['memcpy'][0] / big['put'][0]:.2f}x",
        ),
    ]
    for name in ["List of large numpy arrays", "Dictionary of large numpy arrays"]:
        r = objs[name]
        ratio = r["ferroplasma"][1][0] / r["pickle"][1][0]
        checks.append((f"deserialize '{name}' <= 0.03x pickle", ratio <= 0.03, f"{ratio:.4f}x"))
    for name in ["Large dictionary of small sets", "Large list of strings"]:
        r = objs[name]
        for i, what in [(0, "serialize"), (1, "deserialize")]:
            ratio = r["ferroplasma"][i][0] / r["pickle"][i][0]
            checks.append((f"{what} '{name}' <= 1.1x pickle", ratio <= 1.1, f"{ratio:.3f}x"))
    return checks


def plot(objs, arrays, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.join(out_dir, "img"), exist_ok=True)
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.4))
    for ax, (name, r) in zip(axes, objs.items()):
        x = np.arange(2)
        ax.bar(x - 0.18, [r["pickle"][0][0], r["pickle"][1][0]], 0.36, label="pickle")
        ax.bar(
            x + 0.18, [r["ferroplasma"][0][0], r["ferroplasma"][1][0]], 0.36, label="ferroplasma"
        )
        ax.set_xticks(x, ["serialize", "deserialize"])
        ax.set_title(name, fontsize=9, fontweight="bold")
        ax.set_ylabel("seconds")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "img", "serialization-ray-blog.png"), dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    sizes = [a["bytes"] for a in arrays]
    for key, label in [
        ("memcpy", "memcpy (touched memory)"),
        ("put", "ferroplasma put"),
        ("get", "ferroplasma get"),
        ("pickle_dumps", "pickle.dumps"),
        ("pickle_loads", "pickle.loads"),
    ]:
        ax.plot(sizes, [us(a[key][0]) for a in arrays], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("array size (bytes)")
    ax.set_ylabel("median time (µs)")
    ax.set_title("numpy arrays: put/get vs pickle and memcpy")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "img", "serialization-numpy.png"), dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7, help="timed runs per figure (median)")
    ap.add_argument("--out", default=None, help="directory for results.json and img/*.png")
    args = ap.parse_args()
    with fp.start_store("1GiB", prefault=True) as store:
        client = store.connect()
        rt = round_trip_latency(client, args.repeat)
        objs = {name: bench_object(client, obj, args.repeat) for name, obj in ray_blog_objects()}
        arrays = [
            bench_array(client, n, args.repeat) for n in [1000, 100_000, 10_000_000, 100_000_000]
        ]
    checks = targets(objs, arrays)
    print(
        f"python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} cores; "
        f"socketpair round trip {us(rt[0]):.1f} us (same process, for scale)\n"
    )
    print(report(objs, arrays, checks))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "serialization-results.json"), "w") as f:
            json.dump(
                {"objects": objs, "arrays": arrays, "targets": checks, "socket_rt": rt},
                f,
                indent=1,
            )
        plot(objs, arrays, args.out)
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
