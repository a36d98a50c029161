"""Costs against the object count: ferroplasma, Plasma, Ray and
shared_memory grown side by side from 10^3 to 10^7 small objects.

    make bench-scale              # 10^3 .. 10^7, rewrites the section of docs/benchmarks.md
    make bench-scale QUICK=1      # 10^3 .. 10^5 (minutes), results in bench/results/
    .venv/bin/python -m scale.run --help     (with PYTHONPATH=bench, or from bench/)

Every system runs in a worker process of its own venv (bench/compare's
workers and venvs). At each count, in turn: every system grows to it (in
slices, taking turns, each put timed); then a few rounds in which every
system, in an order that rotates, times single gets, contains of present
and absent ids and batched gets of 1,000 random ids; then the memory of its
store's processes; and the hardware's floor: one random read among that
many 64-byte slots of shared memory the size of ferroplasma's table
(ferroplasma-bench-floor), which every lookup in the table pays at least
once. A system stops, and the report says why, when growing to
the next count would take over --max-grow-seconds (from its put rate), need
more memory than the machine has free, or when a call fails. When a system
stops, and at the end, every object is deleted and the store's memory is
read again.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

from compare.run import DOCS, PEERS, ROOT, Worker, ensure_peer, machine_facts
from compare.stats import interleaved, percentile

from . import report
from .systems import NOTES, SYSTEMS

COUNTS = [10**3, 10**4, 10**5, 10**6, 10**7]
QUICK_COUNTS = COUNTS[:3]
OPS = ["get", "contains", "contains_absent", "get_batch"]
SETTLE = 2.0  # seconds between a delete and reading memory, for every system


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.3g} s"


def delta(now: dict | None, empty: dict | None) -> dict | None:
    if now is None or empty is None:
        return None
    return {k: now[k] - empty.get(k, 0) for k in now}


class System:
    """The driver's side of one system: its worker and what it said."""

    def __init__(self, name: str):
        self.name = name
        self.worker: Worker | None = None
        self.n = 0
        self.status = {"status": "ok", "version": None, "error": None, "notes": NOTES[name]}
        self.empty: dict = {}
        self.points: dict = {}
        self.rate = None  # seconds per put over the last count, as grown
        self.per_object = 0.0  # bytes of memory per object, store and client
        self.unseen = 0  # bytes per object that no RSS shows (shm's pages)

    @property
    def running(self) -> bool:
        return self.worker is not None and self.status["status"] == "ok"

    def ask(self, **cmd) -> dict:
        try:
            r = self.worker.ask(**cmd)
        except (RuntimeError, BrokenPipeError, ValueError) as e:
            r = {"ok": False, "error": str(e)}
        if not r.get("ok"):
            raise Failed(r.get("error") or "no answer")
        return r

    def stop(self, status: str, why: str) -> None:
        self.status.update(status=status, error=why, stopped_after=self.last_count())
        log(f"{self.name}: {status.upper()}: {why}")

    def last_count(self) -> int | None:
        return max((int(c) for c in self.points), default=None)


class Failed(Exception):
    """A worker's command failed; the system stops with this reason."""


def start(names: list[str], args) -> dict[str, System]:
    log_dir = os.path.join(ROOT, "bench", "results", "logs")
    os.makedirs(log_dir, exist_ok=True)
    systems = {s: System(s) for s in names}
    for s in systems.values():
        if s.name in PEERS:
            why = ensure_peer(s.name, args.setup)
            if why:
                s.status.update(status="missing", error=why)
                log(f"{s.name}: MISSING: {why}")
                continue
        s.worker = Worker(s.name, log_dir, module="scale.worker")
        try:
            r = s.ask(
                cmd="start",
                capacity=args.capacity,
                object_size=args.object_size,
                max_count=max(args.counts),
            )
        except Failed as e:
            s.stop("failed to start", str(e))
            close(s)
            continue
        s.status["version"] = r["version"]
        s.empty = r["memory"]
        s.unseen = r["unseen_bytes_per_object"]
        log(f"{s.name}: started ({r['version']})")
    return systems


def close(s: System) -> None:
    if s.worker is not None:
        s.worker.close()
        s.worker = None


def delete_all(s: System) -> None:
    """Deletes every object, then reads the store's memory again."""
    try:
        r = s.ask(cmd="delete")
        time.sleep(SETTLE)
        mem = s.ask(cmd="memory")["memory"]
        s.status["after_delete"] = {
            "deleted": r["n"],
            "seconds": r["seconds"],
            "store": delta(mem["store"], s.empty.get("store")),
        }
    except Failed as e:
        s.status["after_delete"] = {"error": str(e)}
    close(s)


def halt(s: System, status: str, why: str) -> None:
    s.stop(status, why)
    delete_all(s)


def check(active: list[System], target: int, args) -> None:
    """Stops the systems that cannot reach `target`: a limit of their own,
    too long by their put rate, or more memory than the machine has free."""
    for s in active:
        try:
            why = s.ask(cmd="limit", count=target)["why"]
        except Failed as e:
            why = f"failed: {e}"
        if why is None and s.rate is not None:
            est = s.rate * (target - s.n)
            if est > args.max_grow_seconds:
                why = (
                    f"growing to {target:,} would take ~{duration(est)} at "
                    f"{s.rate * 1e6:.0f} µs per put (limit {duration(args.max_grow_seconds)})"
                )
        if why:
            halt(s, "stopped", why)
    live = [s for s in active if s.running]
    need = {s.name: (s.per_object + s.unseen + args.object_size) * (target - s.n) for s in live}
    avail = mem_available() * 0.8
    while live and sum(need.values()) > avail:
        big = max(live, key=lambda s: need[s.name])
        halt(
            big,
            "stopped",
            f"growing to {target:,} would take ~{need[big.name] / 2**30:.1f} GiB more memory "
            f"(the systems together {sum(need.values()) / 2**30:.1f} GiB; "
            f"80% of MemAvailable is {avail / 2**30:.1f} GiB)",
        )
        live.remove(big)
        del need[big.name]


def grow(active: list[System], target: int, args, bar) -> None:
    """Every system grows to `target` in slices, taking turns."""
    prev = {s.name: s.n for s in active}
    spent = dict.fromkeys(prev, 0.0)
    step = max(1000, math.ceil((target - min(prev.values())) / 10))
    rnd = 0
    while True:
        todo = [s for s in active if s.running and s.n < target]
        if not todo:
            break
        for s in interleaved(todo, rnd):
            left = args.max_grow_seconds - spent[s.name]
            try:
                r = s.ask(cmd="grow", to=min(target, s.n + step), seconds=left)
            except Failed as e:
                halt(s, "failed", f"at {s.n:,} objects: {e}")
                continue
            bar.update(r["n"] - s.n)
            s.n = r["n"]
            spent[s.name] += r["seconds"]
            if s.n < target and spent[s.name] >= args.max_grow_seconds:
                halt(
                    s,
                    "stopped",
                    f"growing to {target:,} took over {duration(args.max_grow_seconds)} "
                    f"(reached {s.n:,})",
                )
        rnd += 1
    for s in active:
        if s.running:
            s.rate = spent[s.name] / max(1, target - prev[s.name])


def summary(samples: list[float]) -> dict:
    return {"p50": percentile(samples, 50), "p90": percentile(samples, 90), "n": len(samples)}


def measure(active: list[System], count: int, stage: int, args) -> dict:
    """Rounds of every measure, the systems taking turns in rotating order."""
    samples = {s.name: {op: [] for op in OPS} for s in active}
    per_round = {op: max(1, args.samples // args.rounds) for op in OPS}
    per_round["get_batch"] = max(1, args.batches // args.rounds)
    for rnd in range(args.rounds):
        for k, op in enumerate(OPS):
            for s in interleaved([s for s in active if s.running], rnd + k):
                seed = (stage * 1000 + rnd) * 10 + k  # the same ids for every system
                try:
                    got = s.ask(cmd="measure", op=op, samples=per_round[op], seed=seed)
                except Failed as e:
                    halt(s, "failed", f"{op} at {count:,} objects: {e}")
                    continue
                if got["samples"] is None:
                    samples[s.name][op] = None
                elif samples[s.name][op] is not None:
                    samples[s.name][op] += got["samples"]
    return {
        name: {op: (summary(xs) if xs else None) for op, xs in ops.items()}
        for name, ops in samples.items()
    }


def record(s: System, count: int, prev: int, figures: dict) -> None:
    """The point of `s` at `count`: the measures, its puts and its memory."""
    try:
        window = max(100, min(1000, count // 10))
        figures["put"] = s.ask(cmd="puts", lo=prev, hi=count)["stats"]
        figures["put_window"] = s.ask(cmd="puts", lo=count - window, hi=count)["stats"]
        if prev == 0:
            s.status["put_100"] = s.ask(cmd="puts", lo=50, hi=150)["stats"]
        mem = s.ask(cmd="memory")["memory"]
    except Failed as e:
        halt(s, "failed", f"reading puts or memory at {count:,} objects: {e}")
        return
    figures["store"] = delta(mem["store"], s.empty.get("store"))
    figures["client"] = delta(mem["client"], s.empty.get("client"))
    figures["grow_seconds_per_put"] = s.rate
    grown = sum((figures[k] or {}).get("vm_rss", 0) for k in ("store", "client"))
    s.per_object = max(0.0, grown / count)
    s.points[str(count)] = figures


FLOOR = os.path.join(ROOT, "target", "release", "ferroplasma-bench-floor")


def floor(count: int) -> dict | None:
    """Seconds of one dependent random read among `count` slots of a
    table's size, and of a batch of 1,000 independent ones
    (bench/src/floor.rs); None without the binary (`make bench-scale`
    builds it)."""
    if not os.path.exists(FLOOR):
        log(f"no {FLOOR}: the floor is left out (cargo build --release -p ferroplasma-bench)")
        return None
    out = subprocess.run(
        [FLOOR, "--objects", str(count)], capture_output=True, text=True, check=True
    ).stdout
    got = json.loads(out.splitlines()[-1])
    return {"read": got["ns_per_read"] * 1e-9, "batch": got["ns_per_batch"] * 1e-9}


def run(args) -> dict:
    from tqdm import tqdm

    t0 = time.monotonic()
    systems = start(args.systems, args)
    prev = 0
    floors: dict[str, dict | None] = {}
    try:
        for stage, target in enumerate(args.counts):
            active = [s for s in systems.values() if s.running]
            if not active:
                break
            check(active, target, args)
            active = [s for s in active if s.running]
            if not active:
                break
            total = sum(target - s.n for s in active)
            with tqdm(total=total, desc=f"grow to {target:,}", unit="put", file=sys.stderr) as bar:
                grow(active, target, args, bar)
            active = [s for s in active if s.running]
            log(f"[{time.monotonic() - t0:6.0f} s] {target:,} objects: measuring")
            figures = measure(active, target, stage, args)
            for s in active:
                if s.running:
                    record(s, target, prev, figures[s.name])
            floors[str(target)] = floor(target)
            prev = target
        for s in systems.values():
            if s.running:
                s.status["stopped_after"] = s.last_count()
                delete_all(s)
    finally:
        for s in systems.values():
            close(s)
    return {
        "machine": machine_facts(),
        "config": {
            "counts": args.counts,
            "quick": args.quick,
            "object_size": args.object_size,
            "capacity": args.capacity,
            "samples": args.samples,
            "batches": args.batches,
            "rounds": args.rounds,
            "max_grow_seconds": args.max_grow_seconds,
            "seconds": round(time.monotonic() - t0),
        },
        "systems": {s.name: s.status for s in systems.values()},
        "points": {s.name: s.points for s in systems.values()},
        "floor": floors,
    }


def parse(argv=None):
    ap = argparse.ArgumentParser(
        prog="bench-scale",
        description=__doc__.split("\n\n")[0],
        epilog="Writes scale.json, scale.md and img/scale.png into --out (docs/ for a full "
        "run: the section in docs/benchmarks.md is replaced).",
    )
    ap.add_argument("--quick", action="store_true", help="10^3..10^5 objects (minutes)")
    ap.add_argument("--counts", help="comma-separated object counts (default 10^3..10^7)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"subset of {','.join(SYSTEMS)}")
    ap.add_argument("--object-size", type=int, default=64, help="bytes per object (64)")
    ap.add_argument(
        "--capacity", type=int, default=4 * 1024**3, help="bytes of memory per store (4 GiB)"
    )
    ap.add_argument("--samples", type=int, default=None, help="gets and contains per count")
    ap.add_argument("--batches", type=int, default=None, help="batched gets per count")
    ap.add_argument("--rounds", type=int, default=4, help="rounds the samples are split into")
    ap.add_argument(
        "--max-grow-seconds",
        type=float,
        default=600,
        help="stop a system whose growing to the next count would take longer (600)",
    )
    ap.add_argument("--setup", action="store_true", help="install missing peers' venvs first")
    ap.add_argument("--out", default=None, help="output dir (default: docs, or bench/results)")
    ap.add_argument("--from-json", metavar="FILE", help="measure nothing: report an earlier run")
    args = ap.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    for s in args.systems:
        if s not in SYSTEMS:
            ap.error(f"unknown system {s!r}; choose from {', '.join(SYSTEMS)}")
    if args.counts:
        args.counts = sorted(int(float(c)) for c in args.counts.split(","))
    else:
        args.counts = QUICK_COUNTS if args.quick else COUNTS
    if args.samples is None:
        args.samples = 800 if args.quick else 2000
    if args.batches is None:
        args.batches = 16 if args.quick else 40
    if args.out is None:
        args.out = os.path.join(ROOT, "bench", "results") if args.quick else DOCS
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
    else:
        results = run(args)
    into_docs = os.path.abspath(args.out) == DOCS
    md = os.path.join(DOCS, "benchmarks.md") if into_docs else None
    for p in report.write(results, args.out, benchmarks_md=md):
        log(f"wrote {os.path.relpath(p, ROOT)}")
    print(report.markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
