"""What reading a batch's ids costs among millions of `ObjectID`s: batched
gets of 1,000 random ids from a list (the ids read in passes that let the
CPU load them ahead, crates/python/src/client.rs `oids`) against the same
kind of batch as a tuple (read one id after the other), alternating, each
batch used once.

    .venv/bin/python bench/batch_ids.py --objects 3000000
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

import ferroplasma as fp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=3_000_000)
    ap.add_argument("--batches", type=int, default=400)
    args = ap.parse_args()
    with fp.start_store("3GiB") as store:
        c = store.connect()
        ids = [fp.ObjectID(i.to_bytes(8, "little") + b"\x07" * 12) for i in range(args.objects)]
        for oid in ids:
            c.create_and_seal(oid, b"x" * 64)
        rng = random.Random(1)
        batches = [rng.sample(ids, 1000) for _ in range(args.batches)]
        batches = [b if k % 2 == 0 else tuple(b) for k, b in enumerate(batches)]
        native = store.connect()._native
        native.get_buffers(ids[:1000], 0)
        time.sleep(3)  # the new client maps the table in on a thread of its own
        got: dict[str, list[float]] = {"list": [], "tuple": []}
        gc.disable()
        for b in batches:
            t = time.perf_counter()
            bufs = native.get_buffers(b, 0)
            got["list" if type(b) is list else "tuple"].append(time.perf_counter() - t)
            del bufs
        gc.enable()
    p50 = {k: statistics.median(v) * 1e6 for k, v in got.items()}
    print(
        f"batched get of 1,000 random ids among {args.objects:,} objects, p50: "
        f"{p50['list']:.0f} µs from a list (read in passes), "
        f"{p50['tuple']:.0f} µs from a tuple (one by one), ×{p50['list'] / p50['tuple']:.2f}"
    )


if __name__ == "__main__":
    main()
