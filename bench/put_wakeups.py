"""What a round trip to the store costs when the machine's CPUs sleep
between requests, against when they are kept awake: 64 B puts into one
store, timed alone and then with two busy processes (`yes`) beside them.

On a VM an idle vCPU halts, and the store's thread (and then the client)
must be woken for every request; docs/benchmarks.md ("A store of
millions") quotes a run.

    .venv/bin/python bench/put_wakeups.py --puts 20000
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import ferroplasma as fp


def puts(client, n: int, first: int) -> float:
    """p50 in µs of `n` single puts of 64 B."""
    data = b"x" * 64
    out = []
    for i in range(first, first + n):
        oid = i.to_bytes(8, "little") + b"\x09" * 12
        t = time.perf_counter()
        client.create_and_seal(oid, data)
        out.append(time.perf_counter() - t)
    return statistics.median(out) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--puts", type=int, default=20000, help="puts per condition")
    ap.add_argument("--hogs", type=int, default=2, help="busy processes in the second run")
    args = ap.parse_args()
    with fp.start_store("1GiB") as store:
        c = store.connect()
        idle = puts(c, args.puts, 0)
        hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(args.hogs)]
        try:
            time.sleep(0.2)
            busy = puts(c, args.puts, args.puts)
        finally:
            for h in hogs:
                h.kill()
                h.wait()
    print(
        f"64 B put, p50 of {args.puts:,}: {idle:.1f} µs with the machine otherwise idle, "
        f"{busy:.1f} µs with {args.hogs} busy processes beside it (×{idle / busy:.1f})"
    )


if __name__ == "__main__":
    main()
