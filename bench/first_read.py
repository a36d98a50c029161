"""How fast a new process reads large objects the first time, and why.

    .venv/bin/python bench/first_read.py [--count 10] [--size 100000000]

Writes COUNT objects of SIZE bytes into a new store (timing each write
into memory never used before), then starts a reader process that gets
each one and reads every byte (sums it as uint64), three passes. It prints
GiB/s and the reader's minor page faults for each pass, the kernel's
shared-memory huge-page setting, and private memory read in this process
for scale. The first pass pays the page faults of mapping the store's memory
(docs/operations.md); later passes read pages already mapped.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

import ferroplasma as fp

READER = r"""
import json, resource, sys, time
import numpy as np
import ferroplasma as fp
client = fp.connect(sys.argv[1])
ids = [fp.ObjectID.from_hex(h) for h in sys.argv[2:]]
passes = []
for _ in range(3):
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = time.perf_counter()
    total = 0
    for oid in ids:
        [buf] = client.get_buffers([oid])
        total += int(np.frombuffer(buf, dtype=np.uint64).sum())
        del buf
    seconds = time.perf_counter() - t
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    passes.append({"seconds": seconds, "faults": faults, "sum": total})
print(json.dumps(passes))
"""


def shmem_thp() -> str:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/shmem_enabled").read()
        return text.split("[", 1)[1].split("]", 1)[0]
    except (OSError, IndexError):
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=10, help="objects (default 10)")
    ap.add_argument("--size", type=int, default=100_000_000, help="bytes each (default 100 MB)")
    args = ap.parse_args(argv)
    gib = args.count * args.size / 2**30
    src = np.random.default_rng(0).integers(0, 256, args.size, dtype=np.uint8)
    with fp.start_store(str(args.count * args.size + 2**28)) as store:
        client = fp.connect(store.socket)
        ids = [fp.ObjectID.random() for _ in range(args.count)]
        writes = []
        for oid in ids:  # raw objects: exactly the bytes of src, into fresh memory
            t = time.perf_counter()
            client.create_and_seal(oid, src)
            writes.append(time.perf_counter() - t)
        out = subprocess.run(
            [sys.executable, "-c", READER, store.socket, *[i.hex() for i in ids]],
            capture_output=True,
            text=True,
            check=True,
        )
        passes = json.loads(out.stdout)
    expect = int(src.view(np.uint64).sum()) * args.count
    print(f"shared-memory huge pages (shmem_enabled): {shmem_thp()}")
    writes.sort()
    print(
        f"writes into memory the store never used: median {writes[len(writes) // 2] * 1e3:.1f} ms"
    )
    for i, p in enumerate(passes, 1):
        if p["sum"] != expect:
            raise SystemExit(f"pass {i} read wrong bytes")
        print(f"pass {i}: {gib / p['seconds']:.2f} GiB/s, {p['faults']} page faults")
    private = src.copy()
    t = time.perf_counter()
    for _ in range(args.count):
        int(private.view(np.uint64).sum())
    print(f"private memory: {gib / (time.perf_counter() - t):.2f} GiB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
