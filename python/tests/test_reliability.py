"""Spilling, waiting for space and a dying store, through the Python API."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import ferroplasma as fp
from conftest import eventually


def test_spilled_objects_are_listed_and_come_back(tmp_path):
    with fp.start_store("1MiB", spill_dir=str(tmp_path)) as store:
        c = store.connect()
        arrays = [np.full(40_000, i, dtype=np.float64) for i in range(6)]  # 320 kB each
        ids = [c.put(a) for a in arrays]
        listed = c.list()
        spilled = [oid for oid, info in listed.items() if info["spilled"]]
        assert len(spilled) >= 3
        assert c.stats()["spilled_objects"] == len(spilled)
        assert all(c.contains(ids))
        for oid, a in zip(ids, arrays):
            np.testing.assert_array_equal(c.get(oid), a)
        assert c.stats()["restores"] >= 3


def test_put_can_wait_for_space():
    with fp.start_store("1MiB") as store:
        holder, c = store.connect(), store.connect()
        big = holder.put(np.zeros(100_000))  # 800 kB
        view = holder.get(big)
        with pytest.raises(fp.errors.StoreFull):
            c.put(np.zeros(60_000))
        t = time.monotonic()
        with pytest.raises(fp.errors.StoreFull):
            c.put(np.zeros(60_000), wait=0.2)
        assert time.monotonic() - t >= 0.19

        def let_go():
            probe = store.connect()
            eventually(lambda: probe.stats()["waiting_creates"] == 1, what="the put to wait")
            nonlocal view
            del view
            holder.delete(big)

        threading.Thread(target=let_go).start()
        oid = c.put(np.ones(60_000), wait=10)
        assert c.get(oid)[0] == 1.0


def test_a_client_killed_while_its_create_waits_for_space_is_forgotten():
    with fp.start_store("1MiB") as store:
        holder, probe = store.connect(), store.connect()
        big = holder.put(np.zeros(100_000))  # 800 kB, held
        view = holder.get(big)
        code = (
            "import sys, numpy as np, ferroplasma as fp; c = fp.connect(sys.argv[1]); "
            "c.put(np.zeros(60_000), wait=60)"
        )
        child = subprocess.Popen([sys.executable, "-c", code, store.socket])
        try:
            eventually(lambda: probe.stats()["waiting_creates"] == 1, what="the put to wait")
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        eventually(lambda: probe.stats()["waiting_creates"] == 0, what="the put to be forgotten")
        del view
        holder.delete(big)
        oid = probe.put(np.ones(60_000))
        assert probe.get(oid)[0] == 1.0


def test_a_dying_store_raises_store_unavailable():
    with fp.start_store("8MiB") as store:
        c = store.connect()
        got = {}

        def blocked():
            try:
                c.get(fp.ObjectID.random(), timeout=None)
            except fp.errors.StoreUnavailable as e:
                got["error"] = e

        t = threading.Thread(target=blocked)
        t.start()
        probe = store.connect()
        eventually(lambda: probe.stats()["awaited_objects"] == 1, what="the get to wait")
        os.kill(store.process.pid, signal.SIGKILL)
        t.join(5)
        assert not t.is_alive(), "the blocked get hung"
        assert isinstance(got["error"], fp.errors.Disconnected)
        with pytest.raises(fp.errors.StoreUnavailable):
            c.put(b"x" * 100_000)


def test_ctrl_c_interrupts_a_get_that_waits_forever_and_the_client_stays_usable(client):
    """SIGINT in a get with no timeout raises KeyboardInterrupt at once (it
    used to break the connection: "Interrupted system call"), and the same
    client goes on working. The test sets SIGINT's handler itself: started
    under nohup or by a CI that ignores SIGINT, it would wait forever."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    main = threading.main_thread().ident
    timer = threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            client.get(fp.ObjectID.from_random())  # never created: waits forever
    finally:
        signal.signal(signal.SIGINT, old)
    timer.join()
    assert time.monotonic() - t0 < 5
    oid = client.put(b"after the interrupt")
    assert client.get(oid, timeout=5) == b"after the interrupt"
    assert client.contains(oid)


def test_a_signal_whose_handler_raises_nothing_does_not_disturb_a_get(client):
    hits = []
    old = signal.signal(signal.SIGUSR1, lambda *_: hits.append(1))
    try:
        main = threading.main_thread().ident
        timer = threading.Timer(0.2, signal.pthread_kill, (main, signal.SIGUSR1))
        timer.start()
        missing = fp.ObjectID.from_random()
        assert client.get(missing, timeout=1.0) is fp.NotAvailable
        timer.join()
        assert hits == [1]
        oid = client.put(b"still connected")
        assert client.get(oid, timeout=5) == b"still connected"
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_the_signal_tests_pass_when_started_with_sigint_ignored():
    """Started in the background, under nohup, or by a CI that ignores
    SIGINT, the Ctrl-C test hung forever."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", "ctrl_c"],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout[-2000:]


EXIT_WITH_THREADS_IN_GETS = """
import sys, threading
import ferroplasma as fp
ids = [fp.ObjectID.from_random() for _ in range(1000)]
def loop():
    c = fp.connect(sys.argv[1])
    while True:  # short gets: threads keep coming back into Python
        c.get_buffers(ids, timeout=0.01)
for _ in range(16):
    threading.Thread(target=loop, daemon=True).start()
threading.Event().wait(0.3)
print("main thread returns", flush=True)
"""


def test_a_program_exits_normally_while_daemon_threads_wait_in_gets(store):
    """Python < 3.14 ends a daemon thread that comes back from native code
    during shutdown with a forced unwind; through the bindings that aborted
    the process ("FATAL: exception not rethrown", status 134) in nearly every
    run. Repeated, each run must exit with status 0."""
    for run in range(6):
        out = subprocess.run(
            [sys.executable, "-c", EXIT_WITH_THREADS_IN_GETS, store.socket],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (out.returncode, out.stderr[-500:]) == (0, ""), f"run {run}"
        assert "main thread returns" in out.stdout
