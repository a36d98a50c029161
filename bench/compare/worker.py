"""The process that drives one system, inside that system's venv.

    python -m compare.worker SYSTEM            # driven by run.py over stdin/stdout
    python -m compare.worker --reader SYSTEM   # a reader process (spawned by a worker)

The driver sends one JSON command per line and reads one JSON reply per
line: {"cmd": "start", "capacity": N} -> {"ok": true, "version": ...};
{"cmd": "run", "workload": W, "params": {...}} -> {"ok": true, "result": ...}
or {"ok": false, "error": ...}; {"cmd": "stop"}. Whatever the system's
libraries print goes to stderr, never into the replies.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
import traceback

from . import workloads
from .adapters import Adapter, make, scratch_dir
from .objects import read_all

BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_with(a: Adapter, keys: list, mode: str) -> dict:
    """What a reader process does with the objects another process stored.

    raw: get every object one by one and read every byte; total seconds and
         a checksum of what was read.
    obj: get (deserialize) every object; seconds per get.
    """
    clock = time.perf_counter
    if mode == "raw":
        total = 0
        t = clock()
        for key in keys:
            h = a.get(key)
            v = a.view(h)
            total += read_all(v)
            del v
            a.release(h)
        return {"seconds": clock() - t, "checksum": total}
    if mode == "obj":
        samples = []
        for key in keys:
            t = clock()
            got = a.get_obj(key)
            samples.append(clock() - t)
            del got
        return {"samples": samples}
    raise ValueError(f"unknown reader mode {mode!r}")


def spawn_reader(a: Adapter, keys: list, mode: str) -> dict:
    """Runs `read_with` in a fresh process of this venv and returns its result."""
    env = dict(os.environ, PYTHONPATH=BENCH_DIR)
    proc = subprocess.Popen(
        [sys.executable, "-m", "compare.worker", "--reader", a.name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    if a.name == "pickle":  # the objects themselves travel through the pipe
        head = {"mode": "pipe", "count": len(keys)}
        proc.stdin.write(json.dumps(head).encode() + b"\n")
        proc.stdin.flush()
        for blob in keys:
            proc.stdin.write(struct.pack("<Q", len(blob)))
            proc.stdin.write(blob)
    else:
        head = {"mode": mode, "info": a.reader_info(), "keys": [a.key_text(k) for k in keys]}
        proc.stdin.write(json.dumps(head).encode() + b"\n")
    proc.stdin.close()
    out = proc.stdout.read()
    if proc.wait() != 0:
        raise RuntimeError(f"{a.name} reader process failed (status {proc.returncode})")
    return json.loads(out)


def remote_read(a: Adapter):
    """The function the workloads call to read in another process."""
    own = getattr(a, "remote_read", None)
    if own is not None:
        return own
    return lambda keys, mode: spawn_reader(a, keys, mode)


def reader_main(system: str) -> int:
    inp = sys.stdin.buffer
    head = json.loads(inp.readline())
    if head["mode"] == "pipe":
        import pickle

        samples = []
        for _ in range(head["count"]):
            t = time.perf_counter()
            (n,) = struct.unpack("<Q", inp.read(8))
            obj = pickle.loads(inp.read(n))
            samples.append(time.perf_counter() - t)
            del obj
        result = {"samples": samples}
    else:
        a = make(system)
        a.attach(head["info"])
        keys = [a.key_from_text(k) for k in head["keys"]]
        result = read_with(a, keys, head["mode"])
    sys.stdout.write(json.dumps(result))
    return 0


def run_workload(a: Adapter, name: str, params: dict):
    if name == "latency":
        return workloads.latency(a, params["ops"])
    if name == "micro":
        return workloads.micro(a, remote_read(a))
    if name == "putget":
        return workloads.putget(a, remote_read(a), params.get("scale", 1.0))
    if name == "ray-blog":
        return workloads.ray_blog(a, params.get("calls", 3))
    if name == "limits":
        return workloads.limits()
    raise ValueError(f"unknown workload {name!r}")


def worker_main(system: str) -> int:
    # Replies go to the original stdout; anything else printed goes to stderr.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    a = make(system)

    def reply(**kw):
        replies.write(json.dumps(kw) + "\n")
        replies.flush()

    scratch = scratch_dir()
    try:
        return _serve(a, scratch, reply)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _serve(a: Adapter, scratch: str, reply) -> int:
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "start":
                a.start(cmd["capacity"], scratch)
                reply(ok=True, version=a.version())
            elif cmd["cmd"] == "run":
                reply(ok=True, result=run_workload(a, cmd["workload"], cmd.get("params", {})))
            elif cmd["cmd"] == "stop":
                a.stop()
                reply(ok=True)
                return 0
        except workloads.Unsupported:
            reply(ok=True, result=None)
        except Exception as e:  # reported per figure; the run goes on
            traceback.print_exc()
            reply(ok=False, error=f"{type(e).__name__}: {e}")
    a.stop()
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--reader"]:
        return reader_main(argv[1])
    return worker_main(argv[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
