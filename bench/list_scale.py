"""How long listing a store of many objects takes (issue 38): the first
page and the whole list, from Python and from the `ferroplasma list`
command, at each object count.

    .venv/bin/python bench/list_scale.py --objects 100000 1000000 --reps 3

Each count gets a fresh store filled with objects of 1 byte. Python:
`next(client.list_pages())` (the first page; a build without paged lists
has only `list()`, whose time is then also the first page's) and
`client.list()` (checked to hold every object). CLI: `ferroplasma list`
into a pipe; the first row is timed from the header line, so that the
command's own start (a Python interpreter, for the console script) is left
out of it, and the whole list from the process's start. Medians of
``--reps`` runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import ferroplasma as fp


def fill(client: fp.Client, n: int) -> None:
    put = client._native.create_and_seal
    for _ in range(n):
        put(os.urandom(20), b"x", b"")


def python_times(client: fp.Client, n: int) -> tuple[float, float]:
    if hasattr(client, "list_pages"):
        t = time.perf_counter()
        next(iter(client.list_pages()))
        first = time.perf_counter() - t
    else:
        first = None
    t = time.perf_counter()
    got = client.list()
    whole = time.perf_counter() - t
    assert len(got) == n, (len(got), n)
    return (whole if first is None else first), whole


def cli_times(socket: str, n: int) -> tuple[float, float, float]:
    exe = os.path.join(os.path.dirname(sys.executable), "ferroplasma")
    t0 = time.perf_counter()
    p = subprocess.Popen([exe, "list", "-s", socket], stdout=subprocess.PIPE)
    assert p.stdout is not None
    p.stdout.readline()  # the header
    t_header = time.perf_counter()
    p.stdout.readline()  # the first object
    t_first = time.perf_counter()
    rows = 1 + sum(1 for _ in p.stdout)
    p.wait()
    t_end = time.perf_counter()
    assert rows == n, (rows, n)
    return t_header - t0, t_first - t0, t_end - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    ms = lambda xs: f"{1000 * statistics.median(xs):8.1f}"  # noqa: E731
    print(
        f"{'objects':>9}  {'py first ms':>11}  {'py list ms':>10}  "
        f"{'cli header ms':>13}  {'cli 1st row ms':>14}  {'cli list ms':>11}"
    )
    for n in args.objects:
        with fp.start_store(f"{max(256, n // 2000)}MiB") as store:
            client = store.connect()
            fill(client, n)
            py = [python_times(client, n) for _ in range(args.reps)]
            cli = [cli_times(store.socket, n) for _ in range(args.reps)]
        print(
            f"{n:>9}  {ms([p[0] for p in py]):>11}  {ms([p[1] for p in py]):>10}  "
            f"{ms([c[0] for c in cli]):>13}  {ms([c[1] for c in cli]):>14}  "
            f"{ms([c[2] for c in cli]):>11}",
            flush=True,
        )


if __name__ == "__main__":
    main()
