"""Gets of random objects from a fresh connection to a large store: the
first pass over the ids against a second pass over the same ids.

The first pass is what a reader that just connected (or just followed a
rebuilt table) pays, the second what it pays once the pages of the table
and of its holds it touches are mapped in. docs/operations.md, "Memory per
object", reports a run.

    .venv/bin/python bench/cold_gets.py --objects 3000000
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np

import ferroplasma as fp


def object_id(i: int) -> bytes:
    return i.to_bytes(8, "little") + b"\x07" * 12


def fill(store, n: int, threads: int) -> float:
    """Puts objects 0..n-1 (64 B each) from `threads` connections."""

    def put(t: int) -> None:
        c = store.connect()
        data = b"x" * 64
        for i in range(t, n, threads):
            c.create_and_seal(object_id(i), data)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=put, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def gets(client, ids) -> tuple[float, float]:
    """p50 and p90 (µs) of single gets of `ids`, one at a time."""
    out = []
    for i in ids:
        key = object_id(int(i))
        t = time.perf_counter()
        got = client.get_buffers([key])
        out.append(time.perf_counter() - t)
        del got
    out.sort()
    return out[len(out) // 2] * 1e6, out[len(out) * 9 // 10] * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=3_000_000, help="objects of 64 B to put")
    ap.add_argument("--samples", type=int, default=2000, help="random gets per pass")
    ap.add_argument("--threads", type=int, default=2, help="connections that put")
    args = ap.parse_args()
    memory = f"{max(2, args.objects * 200 // 2**30 + 2)}GiB"
    with fp.start_store(memory) as store:
        took = fill(store, args.objects, args.threads)
        print(f"put {args.objects:,} objects in {took:.1f} s")
        client = store.connect()  # connects after the table grew
        rng = np.random.default_rng(1)
        ids = rng.integers(0, args.objects, args.samples)
        for label, pass_ids in [
            ("first pass, fresh ids", ids),
            ("second pass, same ids", ids),
            ("third pass, new ids", rng.integers(0, args.objects, args.samples)),
        ]:
            p50, p90 = gets(client, pass_ids)
            print(f"{label}: p50 {p50:.2f} µs, p90 {p90:.2f} µs")


if __name__ == "__main__":
    main()
