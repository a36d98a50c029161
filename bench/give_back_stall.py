"""How long the store stops answering while it gives freed memory back.

    .venv/bin/python bench/give_back_stall.py [--objects 100] [--size 10000000]
        [--rounds 3] [--binary target/release/ferroplasma]

Starts a store, and in each round creates OBJECTS objects of SIZE bytes
(their pages written), deletes them, and then, for 1.5 s while the store
gives their pages back to the kernel (once a second, when enough was
freed: docs/operations.md, "Memory per object"), asks it a question every
200 µs (a contains of an absent id, one round trip) and prints the median
and the worst of those round trips. A store that gives pages back while
holding its state stops answering for as long as the kernel takes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time

import ferroplasma as fp


def connect(sock: str) -> fp.Client:
    """A client of the store starting at `sock`, once it listens."""
    for _ in range(1000):
        try:
            return fp.connect(sock)
        except Exception:
            time.sleep(0.01)
    return fp.connect(sock)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--objects", type=int, default=100)
    p.add_argument("--size", type=int, default=10_000_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--binary", default="target/release/ferroplasma")
    a = p.parse_args()
    if a.objects < 1 or a.size < 1 or a.rounds < 1:
        p.error("--objects, --size and --rounds must be at least 1")
    sock = os.path.join(tempfile.mkdtemp(), "s")
    memory = a.objects * a.size * 3
    store = subprocess.Popen(
        # Pages go back after 1 s without allocations (the default waits 30 s).
        [a.binary, "store", "--socket", sock, "--memory", str(memory), "--give-back-after", "1s"],
        stderr=subprocess.DEVNULL,
    )
    try:
        c = connect(sock)
        data = b"x" * a.size
        absent = fp.ObjectID.from_random()
        mib = a.objects * a.size / 2**20
        for r in range(a.rounds):
            ids = [fp.ObjectID.from_random() for _ in range(a.objects)]
            for oid in ids:
                c.create_and_seal(oid, data)
            c.delete(ids)
            trips = []
            end = time.monotonic() + 3.0
            while time.monotonic() < end:
                t = time.perf_counter()
                c.contains(absent)
                trips.append(time.perf_counter() - t)
                time.sleep(0.0002)
            print(
                f"round {r + 1}: {mib:.0f} MiB freed; {len(trips)} round trips over 3 s: "
                f"median {statistics.median(trips) * 1e6:.0f} us, worst {max(trips) * 1e3:.1f} ms"
            )
    finally:
        store.terminate()
        store.wait()


if __name__ == "__main__":
    main()
