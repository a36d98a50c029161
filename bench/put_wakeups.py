"""What a round trip to the store costs when the machine's CPUs sleep
between requests, and what keeping them awake for a moment after each
request saves: 64 B puts into a store, timed

- with the store and client blocking at once (`--spin-us 0`,
  `FERROPLASMA_SPIN_US=0`), on an otherwise idle machine;
- the same, with two busy processes (`yes`) keeping the CPUs awake;
- with the defaults: store and client each look for the next message for
  50 µs before they block (docs/operations.md, "Round trips on a virtual
  machine").

On a VM an idle vCPU halts, and the store's thread (and then the client)
must be woken for every request. The conditions alternate, `--rounds`
times; each prints its median of the rounds' p50s.

    .venv/bin/python bench/put_wakeups.py --puts 20000
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
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


def timed(socket: str, n: int, first: int, spin_us: int) -> float:
    """p50 of `n` puts from a fresh client process (its window is read
    from the environment once per process)."""
    env = dict(os.environ, FERROPLASMA_SPIN_US=str(spin_us))
    out = subprocess.run(
        [sys.executable, __file__, "--worker", socket, "--puts", str(n), "--first", str(first)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return float(out.stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--puts", type=int, default=20000, help="puts per condition and round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the three conditions")
    ap.add_argument("--hogs", type=int, default=2, help="busy processes in the second condition")
    ap.add_argument("--worker", metavar="SOCKET", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(puts(fp.connect(args.worker), args.puts, args.first))
        return
    got: dict[str, list[float]] = {"blocking": [], "blocking, hogs": [], "spinning": []}
    with fp.start_store("1GiB", spin_us=0) as off, fp.start_store("1GiB") as on:
        first = 0
        for _ in range(args.rounds):
            got["blocking"].append(timed(off.socket, args.puts, first, 0))
            hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(args.hogs)]
            try:
                time.sleep(0.2)
                got["blocking, hogs"].append(timed(off.socket, args.puts, first + args.puts, 0))
            finally:
                for h in hogs:
                    h.kill()
                    h.wait()
            got["spinning"].append(timed(on.socket, args.puts, first, 50))
            first += 2 * args.puts
    p50 = {k: statistics.median(v) for k, v in got.items()}
    print(
        f"64 B put, median of {args.rounds} rounds' p50 of {args.puts:,} puts:\n"
        f"  blocking (--spin-us 0, FERROPLASMA_SPIN_US=0), idle machine: {p50['blocking']:.1f} µs\n"
        f"  blocking, {args.hogs} busy processes beside it: {p50['blocking, hogs']:.1f} µs\n"
        f"  spinning 50 µs on both sides (the defaults), idle machine: {p50['spinning']:.1f} µs "
        f"(×{p50['spinning'] / p50['blocking']:.2f} of blocking)"
    )


if __name__ == "__main__":
    main()
