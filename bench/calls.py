"""Per-call cost of every language's client, side by side in one run, next
to Plasma's own C++ client (pyarrow 11.0.0's libplasma, on its own
plasma-store-server): `make bench-calls` (QUICK=1: one round).

Every program does the same, with its own client, against a store started
here (1 GiB; Plasma's with the same memory):

- get: a get of one sealed 64-byte object (timeout 0), a read of its first
  byte, and its release;
- contains: a contains of that object;
- create+seal: a create of a new 64-byte object, one byte written, a seal,
  and the creator's reference given back;
- batched get: a get of 1,000 sealed 64-byte objects in one call, a read of
  each, and their release.

The first three are the median of 200 blocks of 100 calls (ns per call),
the last the median of 50 batches (µs per batch). Each program runs once
per round, all of them in turn, and a figure is the median over the rounds;
ratios are against Plasma's C++ client. The programs: bench/calls/calls.c
(C), bench/calls/calls_plasma.cc (Plasma's C++ API, built against
ferroplasma's <plasma/client.h> and against Plasma 11's own),
go/ferroplasma/cmd/callbench (Go), java/src/test/java/io/ferroplasma/plasma/
CallBench.java (Java), bench/src/calls.rs (Rust) and `calls.py --worker`
(Python).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
C_OUT = ROOT / "target" / "c"
PLASMA = ROOT / "target" / "plasma-cpp" / "pyarrow"
FERROPLASMA = ROOT / ".venv" / "bin" / "ferroplasma"
JAVA_OUT = ROOT / "target" / "java"
MEASURES = ("get_ns", "contains_ns", "create_seal_ns", "batch_us")
LABELS = {
    "get_ns": "get + release (ns)",
    "contains_ns": "contains (ns)",
    "create_seal_ns": "create + seal (ns)",
    "batch_us": "batched get + release of 1,000 (µs)",
}
OLD_ABI = ["-D_GLIBCXX_USE_CXX11_ABI=0", "-D_PLASMA_NO_DEPRECATE"]


def worker(socket: str) -> dict[str, float]:
    """The Python client's figures (run in a process of its own)."""
    import ferroplasma as fp

    client = fp.connect(socket)
    single = fp.ObjectID.random()
    client.create_and_seal(single, b"\x01" * 64)
    batch = [fp.ObjectID.random() for _ in range(1000)]
    for oid in batch:
        client.create_and_seal(oid, b"\x01" * 64)
    clock = time.perf_counter_ns

    def per_call(op) -> float:
        t = []
        for _ in range(200):
            t0 = clock()
            for _ in range(100):
                op()
            t.append((clock() - t0) / 100)
        return statistics.median(t)

    one = [single]

    def get() -> None:
        buf = client.get_buffers(one, 0)[0]
        memoryview(buf)[0]

    out = {"get_ns": per_call(get), "contains_ns": per_call(lambda: client.contains(single))}
    t = []
    for _ in range(200):
        fresh = [fp.ObjectID.random() for _ in range(100)]
        t0 = clock()
        for oid in fresh:
            buf = client.create(oid, 64)
            memoryview(buf)[0] = 1
            client.seal(oid)
            del buf
        t.append((clock() - t0) / 100)
        client.delete(fresh)
    out["create_seal_ns"] = statistics.median(t)
    t = []
    for _ in range(50):
        t0 = clock()
        got = client.get_buffers(batch, 0)
        for buf in got:
            memoryview(buf)[0]
        del got, buf
        t.append((clock() - t0) / 1e3)
    out["batch_us"] = statistics.median(t)
    client.delete([*batch, single])
    return out


def run(cmd: list[str], **kw) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def build(tmp: Path) -> dict[str, list[str]]:
    """Builds each program; returns the command of each client (socket last)."""
    need = [
        (C_OUT / "lib" / "libferroplasma.so", "make c-lib"),
        (PLASMA / "plasma-store-server", "make target/plasma-cpp/.extracted"),
        (JAVA_OUT / "classpath.txt", "make java"),
        (
            ROOT / "target" / "release" / "ferroplasma-bench-calls",
            "cargo build --release -p ferroplasma-bench",
        ),
    ]
    for path, how in need:
        if not path.exists():
            raise SystemExit(f"{path} is missing: run `{how}` (make bench-calls does)")
    src = ROOT / "bench" / "calls"
    lib = C_OUT / "lib"
    run(
        [
            "cc",
            "-O2",
            "-std=c11",
            str(src / "calls.c"),
            f"-I{C_OUT / 'include'}",
            f"-L{lib}",
            "-lferroplasma",
            f"-Wl,-rpath,{lib}",
            "-o",
            str(tmp / "calls-c"),
        ]
    )
    env = dict(os.environ, PKG_CONFIG_PATH=str(lib / "pkgconfig"))
    flags = run(["pkg-config", "--cflags", "--libs", "ferroplasma-plasma"], env=env).split()
    run(
        [
            "c++",
            "-O2",
            "-std=c++20",
            str(src / "calls_plasma.cc"),
            *flags,
            "-o",
            str(tmp / "calls-cpp"),
        ]
    )
    run(
        [
            "c++",
            "-O2",
            "-std=c++17",
            *OLD_ABI,
            str(src / "calls_plasma.cc"),
            f"-I{PLASMA / 'include'}",
            str(PLASMA / "libplasma.so.1100"),
            str(PLASMA / "libarrow.so.1100"),
            f"-Wl,-rpath,{PLASMA}",
            "-pthread",
            "-o",
            str(tmp / "calls-plasma"),
        ]
    )
    go = shutil.which("go") or "/usr/local/go/bin/go"
    go_env = dict(env, CGO_LDFLAGS=f"-Wl,-rpath,{lib}")
    run(
        [go, "build", "-o", str(tmp / "calls-go"), "./cmd/callbench"],
        cwd=ROOT / "go" / "ferroplasma",
        env=go_env,
    )
    jars = (JAVA_OUT / "classpath.txt").read_text().strip()
    cp = f"{JAVA_OUT / 'maven' / 'classes'}:{JAVA_OUT / 'maven' / 'test-classes'}:{jars}"
    return {
        "C": [str(tmp / "calls-c")],
        "C++ (plasma/client.h)": [str(tmp / "calls-cpp")],
        "Go": [str(tmp / "calls-go")],
        "Java": ["java", "-cp", cp, "io.ferroplasma.plasma.CallBench"],
        "Python": [sys.executable, str(Path(__file__).resolve()), "--worker"],
        "Rust": [str(ROOT / "target" / "release" / "ferroplasma-bench-calls")],
        "Plasma 11 C++": [str(tmp / "calls-plasma")],
    }


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + 20
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"no store at {path} after 20 s")
        time.sleep(0.05)


def render(figures: dict[str, dict[str, float]]) -> str:
    """A Markdown table: each client's medians and their ratio to Plasma's."""
    base = figures["Plasma 11 C++"]
    head = "| client | " + " | ".join(LABELS[m] for m in MEASURES) + " |"
    rows = [head, "|---" * (len(MEASURES) + 1) + "|"]
    for name, f in figures.items():
        cells = []
        for m in MEASURES:
            v = f"{f[m]:.2f}" if m == "batch_us" else f"{f[m]:.0f}"
            cells.append(v if name == "Plasma 11 C++" else f"{v} (×{f[m] / base[m]:.3g})")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plot(figures: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(1, len(MEASURES), figsize=(16, 4.2))
    names = list(figures)
    for ax, m in zip(axes, MEASURES, strict=True):
        values = [figures[n][m] for n in names]
        colors = ["#999999" if n.startswith("Plasma") else "#d9541e" for n in names]
        ax.barh(names, values, color=colors)
        ax.set_xscale("log")
        ax.set_xlim(min(values) / 3, max(values) * 2)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(LABELS[m], fontsize=10)
        ax.invert_yaxis()
        if m != MEASURES[0]:
            ax.set_yticklabels([])
    fig.suptitle(
        "Per-call cost by client language (median; log scale; grey: Plasma 11's C++ client)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--rounds", type=int, default=5, help="runs of every program, in turn (default 5)"
    )
    ap.add_argument("--worker", metavar="SOCKET", help=argparse.SUPPRESS)
    ap.add_argument(
        "--json", type=Path, default=ROOT / "docs" / "calls.json", help="where the figures go"
    )
    ap.add_argument(
        "--plot", type=Path, default=ROOT / "docs" / "img" / "calls.png", help="the PNG"
    )
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker)))
        return
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    with tempfile.TemporaryDirectory(prefix="fp-calls-") as d:
        tmp = Path(d)
        commands = build(tmp)
        fp_sock, plasma_sock = tmp / "fp.sock", tmp / "plasma.sock"
        stores = [
            subprocess.Popen(
                [str(FERROPLASMA), "store", "--memory", "1GiB", "--socket", str(fp_sock)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
            subprocess.Popen(
                [str(PLASMA / "plasma-store-server"), "-s", str(plasma_sock), "-m", "1073741824"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
        ]
        try:
            wait_for(fp_sock)
            wait_for(plasma_sock)
            samples: dict[str, list[dict[str, float]]] = {name: [] for name in commands}
            for r in range(args.rounds):
                for name, cmd in commands.items():
                    sock = plasma_sock if name.startswith("Plasma") else fp_sock
                    out = run([*cmd, str(sock)], timeout=600)
                    samples[name].append(json.loads(out.strip().splitlines()[-1]))
                    print(
                        f"round {r + 1}/{args.rounds} {name}: {out.strip()}",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            for p in stores:
                p.kill()
                p.wait()
    figures = {
        n: {m: statistics.median(s[m] for s in v) for m in MEASURES} for n, v in samples.items()
    }
    table = render(figures)
    print(table)
    args.json.write_text(
        json.dumps({"rounds": args.rounds, "figures": figures, "samples": samples}, indent=1) + "\n"
    )
    plot(figures, args.plot)
    print(f"\nfigures: {args.json}; plot: {args.plot}")


if __name__ == "__main__":
    main()
