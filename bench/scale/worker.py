"""The process that grows one system's store, inside that system's venv.

    python -m scale.worker SYSTEM       # driven by scale.run over stdin/stdout

One JSON command a line, one JSON reply a line (bench/compare's protocol):

    {"cmd": "start", "capacity": N, "object_size": B, "max_count": M}
        -> {"ok": true, "version": ..., "memory": ..., "unseen_bytes_per_object": ...}
    {"cmd": "grow", "to": N, "seconds": S}   puts objects n..N-1, each timed;
        stops early after S seconds -> {"ok": true, "n": reached, "seconds": ...}
    {"cmd": "measure", "op": OP, "samples": K, "seed": X}
        -> {"ok": true, "samples": [seconds, ...]}, or "samples": null where
        the system has no such operation; OP is get, contains,
        contains_absent or get_batch (1,000 random ids a call)
    {"cmd": "puts", "lo": A, "hi": B} -> {"ok": true, "p50": ..., "p90": ..., "n": ...}
        (puts A..B-1 of those grow made)
    {"cmd": "limit", "count": N} -> {"ok": true, "why": null or why it cannot hold N}
    {"cmd": "memory"} -> {"ok": true, "memory": {store, client}}
    {"cmd": "delete"} -> {"ok": true, "n": deleted, "seconds": ...}
    {"cmd": "stop"}

A failing command answers {"ok": false, "error": ...}; the driver stops
that system and says why.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import time
import traceback

import numpy as np

from compare.adapters import Unsupported, scratch_dir

from . import procmem
from .systems import make_system

BATCH = 1000  # ids in one batched get
DELETE_CHUNK = 10_000  # ids in one delete call
clock = time.perf_counter


class Grower:
    """One system's store, its object count and the latency of every put."""

    def __init__(self, system: str):
        self.name = system
        self.sys = None
        self.n = 0
        self.puts = np.zeros(0)

    def start(self, capacity: int, object_size: int, max_count: int, workdir: str) -> dict:
        self.sys = make_system(self.name, object_size)
        self.sys.start(capacity, workdir)
        self.puts = np.zeros(max_count)
        return {
            "version": self.sys.version(),
            "memory": self.memory(),
            "unseen_bytes_per_object": self.sys.unseen_bytes_per_object,
        }

    def grow(self, to: int, seconds: float) -> dict:
        """Puts objects until `to` or until `seconds` have passed."""
        s, puts = self.sys, self.puts
        t0 = clock()
        deadline = t0 + seconds
        gc.disable()
        try:
            while self.n < to:
                for i in range(self.n, min(to, self.n + 1000)):
                    key = s.new_key(i)
                    t = clock()
                    s.put(key)
                    puts[i] = clock() - t
                    self.n = i + 1
                if clock() > deadline:
                    break
        finally:
            gc.enable()
        return {"n": self.n, "seconds": clock() - t0}

    def measure(self, op: str, samples: int, seed: int) -> list[float] | None:
        s, n = self.sys, self.n
        rng = np.random.default_rng(seed)
        out = []
        try:
            if op == "get_batch":
                batches = [
                    [s.key(int(i)) for i in rng.choice(n, min(n, BATCH), replace=False)]
                    for _ in range(samples)
                ]
                with _no_gc():
                    for keys in batches:
                        t = clock()
                        got = s.get_many(keys)
                        out.append(clock() - t)
                        for h in got:
                            s.release(h)
                        del got
                return out
            idx = rng.integers(0, n, samples)
            if op == "contains_absent":
                keys = [s.absent_key(int(i)) for i in idx]
            else:
                keys = [s.key(int(i)) for i in idx]
            with _no_gc():
                if op == "get":
                    for k in keys:
                        t = clock()
                        h = s.get(k)
                        out.append(clock() - t)
                        s.release(h)
                        del h
                elif op in ("contains", "contains_absent"):
                    want = op == "contains"
                    for k in keys:
                        t = clock()
                        found = s.contains(k)
                        out.append(clock() - t)
                        if found != want:
                            raise RuntimeError(f"contains said {found} of a key it should not")
                else:
                    raise ValueError(f"unknown measure {op!r}")
        except Unsupported:
            return None
        return out

    def put_stats(self, lo: int, hi: int) -> dict | None:
        lo, hi = max(0, lo), min(hi, self.n)
        if hi <= lo:
            return None
        xs = self.puts[lo:hi]
        return {"p50": float(np.median(xs)), "p90": float(np.percentile(xs, 90)), "n": hi - lo}

    def memory(self) -> dict:
        pids = self.sys.store_pids() if self.sys else []
        return {"store": procmem.store(pids), "client": procmem.status(os.getpid())}

    def delete(self) -> dict:
        t0 = clock()
        n = self.n
        for lo in range(0, n, DELETE_CHUNK):
            self.sys.delete_range(lo, min(n, lo + DELETE_CHUNK))
        self.n = 0
        return {"n": n, "seconds": clock() - t0}


class _no_gc:
    """Garbage collection off while timing, as timeit does."""

    def __enter__(self):
        gc.disable()

    def __exit__(self, *exc):
        gc.enable()


def serve(g: Grower, workdir: str, lines, reply) -> int:
    for line in lines:
        cmd = json.loads(line)
        try:
            c = cmd["cmd"]
            if c == "start":
                r = g.start(cmd["capacity"], cmd["object_size"], cmd["max_count"], workdir)
                reply(ok=True, **r)
            elif c == "grow":
                reply(ok=True, **g.grow(cmd["to"], cmd.get("seconds", float("inf"))))
            elif c == "measure":
                reply(ok=True, samples=g.measure(cmd["op"], cmd["samples"], cmd["seed"]))
            elif c == "puts":
                reply(ok=True, stats=g.put_stats(cmd["lo"], cmd["hi"]))
            elif c == "limit":
                reply(ok=True, why=g.sys.limit(cmd["count"]))
            elif c == "memory":
                reply(ok=True, memory=g.memory())
            elif c == "delete":
                reply(ok=True, **g.delete())
            elif c == "stop":
                if g.sys:
                    g.sys.stop()
                reply(ok=True)
                return 0
            else:
                raise ValueError(f"unknown command {c!r}")
        except Exception as e:  # the driver stops this system and says why
            traceback.print_exc()
            reply(ok=False, error=f"{type(e).__name__}: {e}", n=g.n)
    if g.sys:
        g.sys.stop()
    return 0


def main(argv: list[str]) -> int:
    # Replies go to the original stdout; anything else printed goes to stderr.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def reply(**kw):
        replies.write(json.dumps(kw) + "\n")
        replies.flush()

    workdir = scratch_dir()
    try:
        return serve(Grower(argv[0]), workdir, sys.stdin, reply)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
