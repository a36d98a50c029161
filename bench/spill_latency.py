"""Latency of small gets while the store spills.

A reader process gets a 1 KiB object over and over, timing each get, while
a writer puts 256 MiB objects into a 512 MiB store with a spill directory,
so that every put makes the store spill about 256 MiB to disk; then while
the writer gets spilled 256 MiB objects back (each get restores one and
spills another). The figures (p50, p99, max of the 1 KiB get) are printed
next to the same reader's figures with nobody writing, in the same run.

    make bench-spill          # or: .venv/bin/python bench/spill_latency.py
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import tempfile
import time

import numpy as np

import ferroplasma as fp

PHASES = ("idle", "spilling", "restoring")


def _reader(socket: str, oid: bytes, seconds: float, out) -> None:
    c = fp.connect(socket)
    lat = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        [b] = c.get_buffers([oid], timeout=10)
        lat.append(time.perf_counter() - t)
        del b
    out.put(lat)


def _figures(lat: list[float]) -> dict:
    a = np.array(lat) * 1e6
    return {
        "gets": len(a),
        "p50_us": float(np.percentile(a, 50)),
        "p99_us": float(np.percentile(a, 99)),
        "max_us": float(a.max()),
    }


def measure(seconds: float, spill_parent: str) -> dict:
    spill = tempfile.mkdtemp(dir=spill_parent, prefix="fp-spill-bench-")
    with fp.start_store("512MiB", spill_dir=spill) as store:
        c = store.connect()
        oid = c.put(b"x" * 1024).binary()
        results = {}
        bigs: list = []
        for phase in PHASES:
            q = mp.Queue()
            p = mp.Process(target=_reader, args=(store.socket, oid, seconds, q))
            p.start()
            puts = 0
            big = np.ones(256 << 20, dtype=np.uint8)
            end = time.perf_counter() + seconds
            if phase == "spilling":
                while time.perf_counter() < end:
                    bigs.append(c.put(big))
                    puts += 1
            elif phase == "restoring":
                while time.perf_counter() < end:
                    # The oldest is spilled: getting it reads 256 MiB back
                    # and spills another.
                    oldest = bigs.pop(0)
                    c.get_buffers([oldest], timeout=60)
                    c.delete([oldest])
                    bigs.append(c.put(big))
                    puts += 1
            lat = q.get()
            p.join()
            results[phase] = {**_figures(lat), "puts_of_256MiB": puts}
        st = c.stats()
        results["spills"], results["restores"] = st["spills"], st["restores"]
    return results


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=10.0, help="per phase (default 10)")
    ap.add_argument("--spill-parent", default="/var/tmp", help="where the spill directory goes")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    r = measure(args.seconds, args.spill_parent)
    for phase in PHASES:
        f = r[phase]
        print(
            f"{phase:>9}: 1 KiB get p50 {f['p50_us']:8.1f} us  p99 {f['p99_us']:10.1f} us  "
            f"max {f['max_us']:10.1f} us  ({f['gets']} gets, {f['puts_of_256MiB']} puts of 256 MiB)"
        )
    print(f"objects spilled: {r['spills']}, restored: {r['restores']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(r, fh, indent=2)


if __name__ == "__main__":
    main()
