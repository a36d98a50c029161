"""ferroplasma side by side with Plasma, Ray, Vineyard, shared_memory and pickle.

    make bench-compare              # full run: 7 measured rounds + 1 warm-up
    make bench-compare QUICK=1      # a few minutes, for iterating
    .venv/bin/python -m compare.run --help     (with PYTHONPATH=bench)

Each peer gets its own venv under .bench-venvs/ (installed on first use; a
peer that fails to install is reported as missing, with pip's last words).
Each system runs in a worker process of its venv; the workloads take turns
system by system, the order rotating every round, so that slow drifts of a
noisy machine hit every system alike. The first round is a warm-up and is
dropped; figures are the median with min-max over the other rounds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

from . import report, workloads
from .stats import across_reps, interleaved

BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(BENCH_DIR)
VENVS = os.path.join(ROOT, ".bench-venvs")
DOCS = os.path.join(ROOT, "docs")

# Peers installed into their own venvs: pip requirements.
PEERS = {
    "plasma": ["pyarrow==11.0.0", "numpy<2"],
    "ray": ["ray==2.60.0", "numpy"],
    "vineyard": ["vineyard==0.24.2", "numpy"],
}
# Systems that run in this (the project's) venv.
LOCAL = ["ferroplasma", "shm", "pickle"]
ALL_SYSTEMS = ["ferroplasma", "plasma", "ray", "vineyard", "shm", "pickle"]
WORKLOADS = ["latency", "micro", "putget", "ray-blog"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------- setup
def peer_python(name: str) -> str:
    return os.path.join(VENVS, name, "bin", "python")


def ensure_peer(name: str, install: bool) -> str | None:
    """Makes sure the peer's venv exists; returns None or why it is missing."""
    venv = os.path.join(VENVS, name)
    stamp = os.path.join(venv, ".installed")
    want = " ".join(PEERS[name])
    if os.path.exists(stamp) and open(stamp).read() == want:
        return None
    if not install:
        return f"not installed (run with --setup, or: make bench-compare): {want}"
    log(f"setup: installing {name} into {venv}: {want}")
    try:
        subprocess.run([sys.executable, "-m", "venv", venv], check=True, capture_output=True)
        subprocess.run(
            [peer_python(name), "-m", "pip", "install", "-q", *PEERS[name]],
            check=True,
            capture_output=True,
            text=True,
        )
    except subprocess.CalledProcessError as e:
        tail = (e.stderr or e.stdout or "").strip().splitlines()[-3:]
        return f"pip install {want} failed: {' | '.join(tail)}"
    with open(stamp, "w") as f:
        f.write(want)
    return None


def python_for(system: str) -> str:
    return sys.executable if system in LOCAL else peer_python(system)


# ---------------------------------------------------------------------- worker
class Worker:
    """One system's worker process, driven by JSON lines; `module` is the
    worker's module (bench/scale drives its own with the same protocol)."""

    def __init__(self, system: str, log_dir: str, module: str = "compare.worker"):
        self.system = system
        self.log_path = os.path.join(log_dir, f"{system}.log")
        env = dict(os.environ, PYTHONPATH=BENCH_DIR, PYTHONUNBUFFERED="1")
        env.pop("VIRTUAL_ENV", None)
        self.proc = subprocess.Popen(
            [python_for(system), "-m", module, system],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(self.log_path, "ab"),
            env=env,
            text=True,
        )

    def ask(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.system} worker died; see {self.log_path}")
        return json.loads(line)

    def close(self):
        try:
            self.ask(cmd="stop")
        except (RuntimeError, BrokenPipeError, ValueError):
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# ------------------------------------------------------------------ the run
def machine_facts() -> dict:
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = next(ln for ln in open("/proc/meminfo") if ln.startswith("MemTotal"))
        mem_gib = int(mem.split()[1]) / 1024**2
    except (OSError, StopIteration):
        mem_gib = 0
    import numpy

    try:  # shared-memory transparent huge pages: "never", "advise", ...
        thp = open("/sys/kernel/mm/transparent_hugepage/shmem_enabled").read()
        shmem_thp = thp.split("[", 1)[1].split("]", 1)[0]
    except (OSError, IndexError):
        shmem_thp = "unknown"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_gib, 1),
        "kernel": platform.release(),
        "shmem_thp": shmem_thp,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "date": datetime.date.today().isoformat(),
    }


def flatten(d, prefix=""):
    """{"a": {"b": 1}} -> {"a/b": 1}: one key per figure."""
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, dict):
            if "p50" in v and "p99" in v:  # a latency summary
                out[key + "/p50"] = v["p50"]
                out[key + "/p99"] = v["p99"]
            else:
                out.update(flatten(v, key))
        elif isinstance(v, (int, float)) or v is None:
            out[key] = v
    return out


def run(args) -> dict:
    systems = args.systems
    log_dir = os.path.join(ROOT, "bench", "results", "logs")
    os.makedirs(log_dir, exist_ok=True)
    status = {s: {"status": "ok", "version": None, "error": None} for s in systems}
    for s in systems:
        if s in PEERS:
            why = ensure_peer(s, args.setup)
            if why:
                status[s].update(status="missing", error=why)
                log(f"{s}: MISSING: {why}")
    workers = {}
    for s in systems:
        if status[s]["status"] != "ok":
            continue
        w = Worker(s, log_dir)
        try:
            r = w.ask(cmd="start", capacity=args.capacity)
        except RuntimeError as e:
            r = {"ok": False, "error": str(e)}
        if r.get("ok"):
            status[s]["version"] = r["version"]
            workers[s] = w
            log(f"{s}: started ({r['version']})")
        else:
            status[s].update(status="failed to start", error=r.get("error"))
            log(f"{s}: FAILED TO START: {r.get('error')}")
            w.close()

    rounds = args.reps + 1
    params = {
        "latency": {"ops": 300 if args.quick else 2000},
        "putget": {"scale": 0.2 if args.quick else 1.0},
        "ray-blog": {"calls": 1 if args.quick else 3},
    }
    raw = {w: {s: [] for s in workers} for w in WORKLOADS}
    lim = []
    errors = {}
    spent = {}  # seconds per workload and system, for tuning the run's length
    t0 = time.monotonic()
    try:
        for rnd in range(rounds):
            tag = "warm-up" if rnd == 0 else f"round {rnd}/{args.reps}"
            lim.append(workloads.limits())
            for wl in args.workloads:
                for s in interleaved(list(workers), rnd):
                    log(f"[{time.monotonic() - t0:6.0f} s] {tag}: {wl} on {s}")
                    t1 = time.monotonic()
                    try:
                        r = workers[s].ask(cmd="run", workload=wl, params=params.get(wl, {}))
                    except RuntimeError as e:
                        r = {"ok": False, "error": str(e)}
                    if not r["ok"]:
                        errors.setdefault(f"{wl}/{s}", r["error"])
                        log(f"  {s} {wl}: ERROR {r['error']}")
                    raw[wl][s].append(r.get("result"))
                    spent[f"{wl}/{s}"] = spent.get(f"{wl}/{s}", 0) + time.monotonic() - t1
    finally:
        for w in workers.values():
            w.close()

    figures = {}
    for wl in args.workloads:
        for s, reps in raw[wl].items():
            flat = [flatten(r) for r in reps]
            keys = sorted({k for f in flat for k in f})
            for k in keys:
                summary = across_reps([f.get(k) for f in flat])
                figures.setdefault(f"{wl}/{k}", {})[s] = summary
    limits = {k: across_reps([x[k] for x in lim]) for k in lim[0]}
    from .adapters import NOTES

    for s in systems:
        status[s]["notes"] = NOTES.get(s, "")
    return {
        "machine": machine_facts(),
        "config": {
            "rounds": args.reps,
            "warmup_rounds": 1,
            "quick": args.quick,
            "capacity": args.capacity,
            "workloads": args.workloads,
            "seconds": round(time.monotonic() - t0),
            "seconds_by_step": {k: round(v, 1) for k, v in spent.items()},
        },
        "systems": status,
        "limits": limits,
        "figures": figures,
        "errors": errors,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="bench-compare",
        description=__doc__.split("\n\n")[0],
        epilog="Writes compare.json, compare.md and img/compare-*.png into --out "
        "(docs/ for a full run: the section in docs/benchmarks.md is replaced).",
    )
    ap.add_argument("--quick", action="store_true", help="2 rounds, fewer samples (minutes)")
    ap.add_argument("--reps", type=int, default=None, help="measured rounds (default 7; quick 1)")
    ap.add_argument(
        "--systems",
        default=",".join(ALL_SYSTEMS),
        help=f"comma-separated subset of {','.join(ALL_SYSTEMS)}",
    )
    ap.add_argument(
        "--workloads", default=",".join(WORKLOADS), help=f"subset of {','.join(WORKLOADS)}"
    )
    ap.add_argument(
        "--capacity", type=int, default=3 * 1024**3, help="bytes of memory per store (3 GiB)"
    )
    ap.add_argument("--setup", action="store_true", help="install missing peers' venvs first")
    ap.add_argument("--out", default=None, help="output dir (default: docs, or bench/results)")
    ap.add_argument(
        "--from-json",
        metavar="FILE",
        help="measure nothing: render the report of an earlier run's compare.json",
    )
    args = ap.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    args.workloads = [w for w in args.workloads.split(",") if w]
    for s in args.systems:
        if s not in ALL_SYSTEMS:
            ap.error(f"unknown system {s!r}; choose from {', '.join(ALL_SYSTEMS)}")
    for w in args.workloads:
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    if args.reps is None:
        args.reps = 1 if args.quick else 7
    if args.out is None:
        args.out = os.path.join(ROOT, "bench", "results") if args.quick else DOCS
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
    else:
        results = run(args)
    into_docs = os.path.abspath(args.out) == DOCS
    md = os.path.join(DOCS, "benchmarks.md") if into_docs else None
    paths = report.write(results, args.out, benchmarks_md=md)
    for p in paths:
        log(f"wrote {os.path.relpath(p, ROOT)}")
    print(report.markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
