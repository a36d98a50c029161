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


def _held_mib(pid: int) -> float:
    """The store's resident memory, and the pages of its shared memory this
    process touched: small objects are written by their creator (writes
    without a round trip), and their pages count where they were touched."""
    return _rss_mib(pid) + sum(rss for _, rss in _store_mappings()) / 1024


def test_deleting_everything_gives_the_memory_back():
    # Freed pages go back once unused for --give-back-after (30 s by default).
    with fp.start_store("512MiB", give_back_after="1s") as s:
        c = s.connect()
        time.sleep(0.3)
        empty = _held_mib(s.process.pid)
        ids = [fp.ObjectID.from_random() for _ in range(40_000)]
        data = os.urandom(8192)
        for oid in ids:
            c.create_and_seal(oid, data)
        full = _held_mib(s.process.pid)
        assert full - empty > 250, f"the store holds its 312 MiB of objects ({full - empty:.0f})"
        c.delete(ids)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _held_mib(s.process.pid) - empty > 64:
            time.sleep(0.1)
        after = _held_mib(s.process.pid)
        assert after - empty <= 64, f"{after - empty:.0f} MiB kept after deleting everything"
        # The memory is usable again, and reads as written.
        oid = fp.ObjectID.from_random()
        c.create_and_seal(oid, data)
        assert bytes(c.get_buffers([oid], timeout=0)[0]) == data


def _store_mappings() -> list[tuple[int, int]]:
    """(size, resident) in KiB of this process's mappings of the store's
    shared memory."""
    out, cur = [], None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:  # a mapping's first line
                cur = "ferroplasma" in line
            elif cur and head[0] == "Size:":
                size = int(head[1])
            elif cur and head[0] == "Rss:":
                out.append((size, int(head[1])))
    return out


def test_a_client_maps_a_large_table_and_its_holds_in_ahead_of_its_gets():
    """On a table of millions of slots, nearly every get of a random object
    touched pages of the table and of the client's holds for the first
    time, and paid page faults for it (9.3 µs a get against 1.2 µs warm at
    3 million objects, bench/cold_gets.py). A client maps large ones in on a thread of its own
    when it connects: they are resident before any get."""
    slots = 1 << 20
    with fp.start_store("80MiB", table_slots=slots) as s:
        c = s.connect()
        table_kib = (64 + slots * 40 + 4095) // 4096 * 4  # a header, 40 B a slot
        holds_kib = slots * 4 // 1024

        def resident() -> tuple[float, float]:
            maps = _store_mappings()
            table = [r / z for z, r in maps if z == table_kib]
            holds = [r / z for z, r in maps if holds_kib <= z < holds_kib + 64]
            assert table and holds, f"no table or holds mapping among {maps}"
            return table[0], holds[0]

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and min(resident()) < 0.95:
            time.sleep(0.05)
        table, holds = resident()
        assert table >= 0.95 and holds >= 0.95, f"resident: table {table:.0%}, holds {holds:.0%}"
        oid = fp.ObjectID.from_random()
        c.create_and_seal(oid, b"still reads")
        assert bytes(c.get_buffers([oid])[0]) == b"still reads"
