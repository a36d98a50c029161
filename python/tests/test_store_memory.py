"""The store's memory follows what it holds: after its objects are deleted,
its resident memory falls back near an empty store's (the arena's free
pages go back to the kernel, the shared table shrinks, the object table
gives its memory back). docs/operations.md, "Memory per object"."""

from __future__ import annotations

import os
import time

import ferroplasma as fp


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_deleting_everything_gives_the_memory_back():
    with fp.start_store("512MiB") as s:
        c = s.connect()
        time.sleep(0.3)
        empty = _rss_mib(s.process.pid)
        ids = [fp.ObjectID.from_random() for _ in range(40_000)]
        data = os.urandom(8192)
        for oid in ids:
            c.create_and_seal(oid, data)  # the store writes the bytes: its pages
        full = _rss_mib(s.process.pid)
        assert full - empty > 250, f"the store holds its 312 MiB of objects ({full - empty:.0f})"
        c.delete(ids)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _rss_mib(s.process.pid) - empty > 64:
            time.sleep(0.1)
        after = _rss_mib(s.process.pid)
        assert after - empty <= 64, f"{after - empty:.0f} MiB kept after deleting everything"
        # The memory is usable again, and reads as written.
        oid = fp.ObjectID.from_random()
        c.create_and_seal(oid, data)
        assert bytes(c.get_buffers([oid], timeout=0)[0]) == data
