"""The workloads, written once against the adapter interface.

Each function runs one repetition on one system and returns plain numbers
(seconds, GiB/s) in a dict; `run.py` repeats them, interleaved between
systems, and summarizes. A workload that a system cannot do raises
`Unsupported` for that figure only (reported as n/a).

    latency     create+seal 1 KiB, get one, release, contains, delete (p50, p99)
    micro       the six shapes of the ThymesisFlow Plasma paper's microbenchmarks
                (Abrahamse et al., 2022): create all, get all batched and one by
                one, a reader process reading every byte (GiB/s)
    putget      put/get of numpy arrays and bytes, same process and another
    ray-blog    the four objects of the Ray serialization post (Moritz and
                Nishihara, 2017), put and get
    limits      memcpy and sequential-read bandwidth, 1-byte socket round trip
"""

from __future__ import annotations

import gc
import os
import socket
import statistics
import time

import numpy as np

from .adapters import Adapter, Unsupported
from .objects import MICRO_SHAPES, PUT_GET_SIZES, payload, ray_blog_objects, read_all
from .stats import summarize_samples

GIB = 1024**3
clock = time.perf_counter


class _NoGC:
    """Garbage collection off while timing, as timeit does."""

    def __enter__(self):
        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc):
        if self.was:
            gc.enable()


def _try(fn):
    try:
        return fn()
    except Unsupported:
        return None


# --------------------------------------------------------------------- latency
def latency(a: Adapter, ops: int) -> dict:
    """Per-operation latency on 1 KiB objects; p50 and p99 of `ops` samples."""
    if not a.raw:
        raise Unsupported
    src = payload(1024)
    out = {}
    samples = {k: [] for k in ["create_seal", "get", "release", "contains", "delete"]}
    keys = []
    with _NoGC():
        for _ in range(ops):
            t = clock()
            key = a.create_seal(src)
            samples["create_seal"].append(clock() - t)
            keys.append(key)
        for key in keys:
            t = clock()
            h = a.get(key)
            samples["get"].append(clock() - t)
            handles = [h]
            del h
            t = clock()
            a.release(handles.pop())
            samples["release"].append(clock() - t)
        contains = _try(lambda: [_timed_contains(a, k, samples["contains"]) for k in keys])
        if contains is None:
            samples["contains"] = []
        while keys:
            t = clock()
            a.delete([keys.pop()])
            samples["delete"].append(clock() - t)
    for k, v in samples.items():
        out[k] = summarize_samples(v) if v else None
    return out


def _timed_contains(a, key, into):
    t = clock()
    found = a.contains(key)
    into.append(clock() - t)
    if not found:
        raise AssertionError(f"{a.name}: contains() is false for a sealed object")


# ----------------------------------------------------------------------- micro
def micro(a: Adapter, remote_read, shapes=MICRO_SHAPES) -> dict:
    """The ThymesisFlow Plasma paper's microbenchmarks. `remote_read(keys, mode)` runs the
    reader in another process and returns its result dict."""
    if not a.raw:
        raise Unsupported
    out = {}
    for count, size in shapes:
        src = payload(size)
        expect = read_all(src) * count
        r = {}
        with _NoGC():
            t = clock()
            keys = [a.create_seal(src) for _ in range(count)]
            r["create"] = clock() - t
            if a.batched_get:
                t = clock()
                hs = a.get_many(keys)
                r["get_batch"] = clock() - t
                for h in hs:
                    a.release(h)
                del hs
            else:
                r["get_batch"] = None
            t = clock()
            for key in keys:
                a.release(a.get(key))
            r["get_each"] = clock() - t
        if a.cross_process:
            got = remote_read(keys, "raw")
            if got["checksum"] != expect:
                raise AssertionError(f"{a.name}: the reader read wrong bytes ({count}x{size})")
            r["reader_gibs"] = count * size / GIB / got["seconds"]
        with _NoGC():
            t = clock()
            a.delete(keys)
            r["delete"] = clock() - t
        out[f"{count}x{size}"] = r
    return out


# ---------------------------------------------------------------------- putget
PUT_GET_COUNTS = {1_000: 200, 10_000: 200, 100_000: 100, 1_000_000: 30, 10_000_000: 8}


def putget(a: Adapter, remote_read, scale: float = 1.0, sizes=PUT_GET_SIZES) -> dict:
    """put and get of numpy arrays and of bytes objects: p50 seconds per call,
    in this process and (get only) in another process."""
    out = {}
    for kind in ["numpy", "bytes"]:
        for size in sizes:
            arr = payload(size)
            obj = arr if kind == "numpy" else arr.tobytes()
            n = max(2, int(PUT_GET_COUNTS.get(size, 3) * scale))
            puts, gets, keys = [], [], []
            with _NoGC():
                for _ in range(n):
                    t = clock()
                    keys.append(a.put(obj))
                    puts.append(clock() - t)
                for key in keys:
                    t = clock()
                    got = a.get_obj(key)
                    gets.append(clock() - t)
                    if len(got) != len(obj):
                        raise AssertionError(f"{a.name}: get returned {len(got)} items")
                    del got
            r = {"put": summarize_samples(puts)["p50"], "get": summarize_samples(gets)["p50"]}
            other = remote_read(keys, "obj") if a.cross_process else None
            r["get_other"] = summarize_samples(other["samples"])["p50"] if other else None
            a.delete_obj(keys)
            out[f"{kind}:{size}"] = r
    return out


# -------------------------------------------------------------------- ray-blog
_RAY_BLOG_OBJECTS = None


def ray_blog(a: Adapter, calls: int = 3, objects=None) -> dict:
    """put and get of each of the Ray serialization post's objects: the median
    of `calls` calls, seconds."""
    global _RAY_BLOG_OBJECTS
    if objects is None:
        if _RAY_BLOG_OBJECTS is None:
            _RAY_BLOG_OBJECTS = ray_blog_objects()
        objects = _RAY_BLOG_OBJECTS
    out = {}
    for name, obj in objects:
        puts, gets = [], []
        for _ in range(calls):
            with _NoGC():
                t = clock()
                key = a.put(obj)
                puts.append(clock() - t)
                t = clock()
                got = a.get_obj(key)
                gets.append(clock() - t)
            if len(got) != len(obj):
                raise AssertionError(f"{a.name}: {name} came back with {len(got)} items")
            del got
            a.delete_obj([key])
        out[name] = {"put": statistics.median(puts), "get": statistics.median(gets)}
    return out


# ---------------------------------------------------------------------- limits
def limits(nbytes: int = 100_000_000, rt_samples: int = 2000) -> dict:
    """The machine's physical limits, measured like the workloads."""
    src = payload(nbytes)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch every page first
    copies, reads = [], []
    for _ in range(5):
        t = clock()
        np.copyto(dst, src)
        copies.append(clock() - t)
        t = clock()
        read_all(dst)
        reads.append(clock() - t)
    return {
        "memcpy_gibs": nbytes / GIB / min(copies),
        "read_gibs": nbytes / GIB / min(reads),
        "socket_rt": socket_round_trip(rt_samples),
    }


def socket_round_trip(samples: int) -> float:
    """p50 of a 1-byte ping-pong over a Unix socketpair with a forked echo
    process (both sides Python, like every adapter)."""
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the echo process
        a.close()
        try:
            while True:
                d = b.recv(1)
                if not d:
                    break
                b.send(d)
        finally:
            os._exit(0)
    b.close()
    times = []
    try:
        with _NoGC():
            for _ in range(samples):
                t = clock()
                a.send(b"x")
                a.recv(1)
                times.append(clock() - t)
    finally:
        a.close()
        os.waitpid(pid, 0)
    return summarize_samples(times[samples // 10 :])["p50"]
