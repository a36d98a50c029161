"""Jobs on Dask across a cluster of stores: three stores joined into one
cluster (over loopback), a Dask scheduler, and one Dask worker per store
(each with FERROPLASMA_SOCKET of its own store), all real processes. The
record sort runs its tasks through Dask, passing object ids; a reducer
gets runs from other hosts through the cluster's remote get."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time

import pytest

import ferroplasma as fp
from conftest import eventually, member_address

distributed = pytest.importorskip("distributed")  # the `dask` extra; make build installs it
R = pytest.importorskip("ferroplasma.jobs.records")

TOKEN = "dask-test-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Hosts:
    """Stores, their Dask workers, and a client of the scheduler."""

    def __init__(self, stack: contextlib.ExitStack, n: int = 3) -> None:
        common = {"cluster_token": TOKEN, "heartbeat_interval": "100ms", "peer_timeout": "2s"}
        first = stack.enter_context(
            fp.start_store("256MiB", cluster_listen="127.0.0.1:0", **common)
        )
        seed = member_address(first.connect())
        self.stores = [first] + [
            stack.enter_context(
                fp.start_store("256MiB", cluster_listen="127.0.0.1:0", join=seed, **common)
            )
            for _ in range(n - 1)
        ]
        self.clients = [s.connect() for s in self.stores]
        self.members = [member_address(c) for c in self.clients]
        for c in self.clients:
            eventually(
                lambda c=c: (
                    sum(m["health"] in ("this", "alive") for m in c.cluster_status()["members"])
                    == n
                ),
                what="every member sees every other",
            )
        address = self.address = f"tcp://127.0.0.1:{free_port()}"
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self.scheduler = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "distributed.cli.dask_scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                address.rsplit(":", 1)[1],
                "--dashboard-address",
                ":0",
            ],
            **quiet,
        )
        stack.callback(self._stop, self.scheduler)
        self.workers = []
        for i, store in enumerate(self.stores):
            env = dict(os.environ, FERROPLASMA_SOCKET=store.socket)
            w = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "distributed.cli.dask_worker",
                    address,
                    "--nthreads",
                    "1",
                    "--nworkers",
                    "1",
                    "--name",
                    f"host{i}",
                    "--dashboard-address",
                    ":0",
                    "--no-nanny",
                ],
                env=env,
                **quiet,
            )
            stack.callback(self._stop, w)
            self.workers.append(w)
        self.dask = stack.enter_context(distributed.Client(address, timeout=60))
        self.dask.wait_for_workers(n, timeout=60)

    @staticmethod
    def _stop(p: subprocess.Popen) -> None:
        if p.poll() is None:
            p.kill()
        p.wait()

    def kill(self, i: int) -> None:
        """The whole host: its store and its Dask worker."""
        self.stores[i].process.kill()
        self.workers[i].kill()

    def objects_left(self, alive: list[int]) -> list[int]:
        return [self.clients[i].stats()["objects"] for i in alive]


@pytest.fixture
def hosts():
    with contextlib.ExitStack() as stack:
        yield Hosts(stack)


@pytest.fixture
def records(tmp_path):
    src = tmp_path / "in"
    R.gen_records(str(src), "24MB", files=4, seed=5, workers=1)
    return str(src)


def test_the_record_sort_runs_on_dask_across_hosts(hosts, records, tmp_path):
    out = str(tmp_path / "out")
    summary = R.sort_records(
        records,
        out,
        partitions=12,
        workers=hosts.dask,
        socket=hosts.stores[0].socket,
        split_size="2MB",
        say=lambda _msg: None,
    )
    report = R.validate_records(records, out, workers=1)
    assert report.ok, report.problems
    assert report.output_records == summary.records == 240_000
    # Tasks ran on every host, and the store of every host took map runs.
    assert set(summary.hosts) <= set(hosts.members) and len(set(summary.hosts)) >= 2, summary.hosts
    assert summary.store_bytes == summary.input_bytes
    # Nothing of the job is left in any store (cached copies included).
    eventually(lambda: hosts.objects_left([0, 1, 2]) == [0, 0, 0], what="stores emptied")


@pytest.mark.parametrize("phase", ["map", "reduce"])
def test_a_host_killed_mid_job_loses_nothing_of_the_result(hosts, records, tmp_path, phase):
    """Host 2 (store and worker) is killed a third of the way through the
    map phase, or between the phases. Dask runs the map tasks it lost
    again elsewhere (a map task makes its object under the same id again);
    a reducer that meets a run lost with the host makes the driver redo
    that map. The result validates; no store keeps anything."""
    out = str(tmp_path / "out")
    killed = []

    class KillHost2:
        def __init__(self, what: str, total: int) -> None:
            self.what, self.total, self.done = what, total, 0
            if what == "reduce" == phase and not killed:
                hosts.kill(2)  # every map done, no reducer started
                killed.append(time.monotonic())

        def update(self, n: int) -> None:
            self.done += n
            if self.what == "map" == phase and not killed and self.done >= self.total // 3:
                hosts.kill(2)
                killed.append(time.monotonic())

        def close(self) -> None:
            pass

    summary = R.sort_records(
        records,
        out,
        partitions=12,
        workers=hosts.dask,
        socket=hosts.stores[0].socket,
        split_size="1MB",
        progress=KillHost2,
        say=lambda _msg: None,
    )
    assert killed, "the host was never killed"
    report = R.validate_records(records, out, workers=1)
    assert report.ok, report.problems
    if phase == "map":
        assert hosts.members[2] not in summary.hosts
    else:  # runs of host 2's maps were lost after Dask had forgotten them
        assert summary.recomputed_maps >= 1
    eventually(lambda: hosts.objects_left([0, 1]) == [0, 0], what="stores emptied")


@pytest.mark.parametrize("kill", [False, True], ids=["all-hosts", "host-killed-after-split"])
def test_the_dataframe_sort_runs_on_dask_across_hosts(hosts, kill, monkeypatch):
    """Partitions in the stores, sorted by Dask tasks placed where their
    input is (each host taking its share); the buckets equal pandas' stable
    sort. With host 2 killed between the split and the merge (the inputs
    are on hosts 0 and 1; host 2 ran its share of the splits), the slices
    lost with it are made again."""
    import numpy as np
    import pandas as pd

    from ferroplasma.jobs import dataframe as D

    rng = np.random.default_rng(3)
    frame = pd.DataFrame(
        {"key": rng.integers(0, 1000, 60_000), "value": rng.standard_normal(60_000)}
    )
    chunks = [frame.iloc[i * 10_000 : (i + 1) * 10_000] for i in range(6)]
    homes = 2 if kill else 3
    parts = [hosts.clients[q % homes].put(c) for q, c in enumerate(chunks)]
    if kill:
        calls = []
        real_place = D.place

        def place_then_kill(weights, members):
            calls.append(len(weights))
            if len(calls) == 2:  # the merge's placement: every split is done
                hosts.kill(2)
                time.sleep(3)  # the peer timeout: the cluster declares it dead
            return real_place(weights, members)

        monkeypatch.setattr(D, "place", place_then_kill)
    out = D.sort_dataframe(hosts.clients[0], parts, "key", workers=hosts.dask, buckets=6)
    got = pd.concat(hosts.clients[0].get(out, timeout=30))
    want = frame.sort_values("key", kind="stable")
    pd.testing.assert_frame_equal(got, want)
    del got  # views of the buckets: they hold them in the store
    alive = [0, 1] if kill else [0, 1, 2]
    hosts.clients[0].delete(out + parts)
    eventually(lambda: hosts.objects_left(alive) == [0] * len(alive), what="stores emptied")


def test_the_commands_take_a_scheduler(hosts, records, tmp_path):
    cli = [sys.executable, "-m", "ferroplasma"]
    out = tmp_path / "out"
    done = subprocess.run(
        [
            *cli,
            "records",
            "sort",
            "--input",
            records,
            "--output",
            str(out),
            "--partitions",
            "6",
            "--split-size",
            "4MB",
            "--scheduler",
            hosts.address,
            "--socket",
            hosts.stores[0].socket,
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert R.validate_records(records, str(out), workers=1).ok
    nobody = f"tcp://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [
            *cli,
            "records",
            "sort",
            "--input",
            records,
            "--output",
            str(tmp_path / "o2"),
            "--scheduler",
            nobody,
            "--socket",
            hosts.stores[0].socket,
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "no Dask scheduler answers" in done.stderr, done.stderr
