"""What a stored object costs the store's memory, and whether deletes give it back.

    .venv/bin/python bench/store_rss.py [--count 1000000] [--binary target/release/ferroplasma]
        [-- STORE ARGS...]

Starts a store (the given `ferroplasma` binary, `store --memory` twice the
data), puts COUNT objects of 64 bytes from one client, deletes them all in
chunks of 100,000, and prints the store process's resident memory
(/proc/PID/status: VmRSS, and of it RssAnon, the private memory that holds
the store's tables; RssShmem is the objects' shared memory) when empty,
when full and after the deletes, with the growth per object. Store
arguments after `--` are passed on (`-- --table-slots 0` leaves out the
shared table). It also prints the mean time of a put early on (puts 100 to
1,100) and at the end (the last 1,000), from this client.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time

from ferroplasma._native import NativeClient

DATA = b"x" * 64
CHUNK = 100_000


def connect(sock: str) -> NativeClient:
    """A client of the store starting at `sock`, once it listens."""
    for _ in range(1000):
        try:
            return NativeClient(sock)
        except Exception:
            time.sleep(0.01)
    return NativeClient(sock)


def rss_mib(pid: int) -> dict[str, float]:
    """The process's resident memory, MiB, by kind."""
    keys = ("VmRSS", "RssAnon", "RssShmem", "RssFile")
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in keys:
                out[name] = int(rest.split()[0]) / 1024
    return out


def show(label: str, r: dict[str, float]) -> None:
    print(f"{label:<14}" + "  ".join(f"{k} {v:8.1f}" for k, v in r.items()) + "  (MiB)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=1_000_000)
    p.add_argument("--binary", default="target/release/ferroplasma")
    p.add_argument("store_args", nargs="*", help="after --: more arguments of `store`")
    a = p.parse_args()
    n = a.count
    d = tempfile.mkdtemp()
    sock = os.path.join(d, "s")
    memory = max(n * 64 * 2, 1 << 28)
    # Pages go back after 1 s without allocations (the default waits 30 s).
    cmd = [a.binary, "store", "--socket", sock, "--memory", str(memory), "--give-back-after", "1s"]
    cmd += a.store_args
    store = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    try:
        c = connect(sock)
        time.sleep(0.2)
        r0 = rss_mib(store.pid)
        show("empty", r0)
        ids = [os.urandom(20) for _ in range(n)]
        t0 = time.perf_counter()
        # Puts 0-99 warm up; 100-1,099 are "early"; the last 1,000 "last".
        parts = [
            ids[:100],
            ids[100:1100],
            ids[1100 : max(n - 1000, 1100)],
            ids[max(n - 1000, 1100) :],
        ]
        means = []
        for part in parts:
            t = time.perf_counter()
            for oid in part:
                c.create_and_seal(oid, DATA, b"")
            means.append((time.perf_counter() - t) / max(len(part), 1) * 1e6)
        took = time.perf_counter() - t0
        print(f"put {n}: {took:.1f} s; mean put {means[1]:.1f} us early, {means[3]:.1f} us last")
        time.sleep(0.5)
        r1 = rss_mib(store.pid)
        show("full", r1)
        per = {k: (r1[k] - r0[k]) * 2**20 / n for k in ("VmRSS", "RssAnon")}
        print(f"per object: {per['VmRSS']:.0f} B resident, {per['RssAnon']:.0f} B of it private")
        t0 = time.perf_counter()
        for i in range(0, n, CHUNK):
            c.delete(ids[i : i + CHUNK])
        print(f"delete {n}: {time.perf_counter() - t0:.1f} s")
        time.sleep(3.0)
        r2 = rss_mib(store.pid)
        show("after delete", r2)
        print(
            f"after delete minus empty: {r2['VmRSS'] - r0['VmRSS']:.1f} MiB resident,"
            f" {r2['RssAnon'] - r0['RssAnon']:.1f} MiB private"
        )
    finally:
        store.terminate()
        store.wait()


if __name__ == "__main__":
    main()
