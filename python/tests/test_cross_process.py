"""Many processes read the same bytes without copying them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np

import ferroplasma as fp

READER = textwrap.dedent(
    """
    import sys, numpy as np, ferroplasma as fp

    def rss_anon_kib():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1])

    client = fp.connect(sys.argv[1])
    oid = fp.ObjectID.from_hex(sys.argv[2])
    before = rss_anon_kib()
    arr = client.get(oid)
    total = float(arr.sum())          # reads every byte
    after = rss_anon_kib()
    print(after - before, total, arr.nbytes)
    """
)


def test_a_200_mb_array_is_read_by_another_process_without_a_private_copy():
    with fp.start_store("512MiB") as store:
        client = store.connect()
        arr = np.ones(200 * 1024 * 1024 // 8, dtype=np.float64)
        oid = client.put(arr)
        del arr
        out = subprocess.run(
            [sys.executable, "-c", READER, store.socket, oid.hex()],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        growth_kib, total, nbytes = int(out[0]), float(out[1]), int(out[2])
        assert nbytes == 200 * 1024 * 1024
        assert total == nbytes / 8, "the reader saw every element"
        assert growth_kib < 8 * 1024, f"the reader's private memory grew by {growth_kib} KiB"


def test_readers_in_several_processes_see_the_same_object():
    with fp.start_store("64MiB") as store:
        client = store.connect()
        oid = client.put({"v": np.arange(1000)})
        code = "import sys, ferroplasma as fp; c = fp.connect(sys.argv[1]); "
        code += "print(int(c.get(fp.ObjectID.from_hex(sys.argv[2]))['v'].sum()))"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", code, store.socket, oid.hex()],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        assert [int(p.communicate()[0]) for p in procs] == [499500] * 4
