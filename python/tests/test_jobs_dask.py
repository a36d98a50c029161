"""Jobs on Dask across a cluster of stores: three stores joined into one
cluster (over loopback), a Dask scheduler, and one Dask worker per store
(each with FERROPLASMA_SOCKET of its own store), all real processes. The
record sort runs its tasks through Dask, passing object ids; a reducer
gets runs from other hosts through the cluster's remote get."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from conftest import eventually

distributed = pytest.importorskip("distributed")  # the `dask` extra; make build installs it
R = pytest.importorskip("ferroplasma.jobs.records")
from ferroplasma.jobs.hosts import Hosts, can_use_netns  # noqa: E402


@pytest.fixture
def hosts():
    with Hosts(3) as h:
        yield h


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
    # A port bound (so nobody else takes it) where nothing listens.
    unused = socket.socket()
    unused.bind(("127.0.0.1", 0))
    nobody = f"tcp://127.0.0.1:{unused.getsockname()[1]}"
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
    unused.close()
    assert done.returncode == 2 and "no Dask scheduler answers" in done.stderr, done.stderr


NETNS = pytest.mark.skipif(
    not can_use_netns(), reason="needs root and iproute2 (network namespaces); CI runs it"
)


@pytest.fixture(scope="module")
def big_records(tmp_path_factory):
    src = tmp_path_factory.mktemp("netns") / "in"
    R.gen_records(str(src), "200MB", files=8, seed=11, workers=2)
    return str(src)


class KillMidMap:
    """A progress hook that kills host ``victim`` of ``hosts`` once a third
    of the map tasks are done."""

    killed = 0

    def __init__(self, hosts, victim):
        self.hosts, self.victim = hosts, victim

    def __call__(self, what: str, total: int):
        hook = self

        class Bar:
            done = 0

            def update(self, n: int) -> None:
                self.done += n
                if what == "map" and not hook.killed and self.done >= total // 3:
                    hook.hosts.kill(hook.victim)
                    hook.killed += 1

            def close(self) -> None:
                pass

        return Bar()


@NETNS
@pytest.mark.parametrize("kill", [False, True], ids=["all-hosts", "host-killed-mid-map"])
def test_jobs_across_hosts_in_network_namespaces(big_records, tmp_path, kill):
    """Three hosts, each a network namespace with its store and its Dask
    worker, the scheduler in a fourth: 200 MB of records sorted into 12
    partitions (validated), then a DataFrame sorted (equal to pandas'
    stable sort). Every byte between hosts crosses a virtual link. With
    host 2 killed a third of the way through the map phase, both jobs still
    finish with correct results on the two hosts left."""
    import numpy as np
    import pandas as pd

    from ferroplasma.jobs import dataframe as D

    with Hosts(3, memory="768MiB", netns=True) as hosts:
        sent_before = hosts.bytes_sent()
        hook = KillMidMap(hosts, 2)
        out = str(tmp_path / "out")
        summary = R.sort_records(
            big_records,
            out,
            partitions=12,
            workers=hosts.dask,
            socket=hosts.stores[0].socket,
            split_size="8MB",
            progress=hook if kill else None,
            say=lambda _msg: None,
        )
        report = R.validate_records(big_records, out, workers=2)
        assert report.ok, report.problems
        assert report.output_records == summary.records == 2_000_000
        crossed = hosts.bytes_sent() - sent_before
        # Reducers pulled the runs of other hosts over the links: about two
        # thirds of the input (more when maps ran again after the kill).
        assert crossed > summary.input_bytes // 3, (crossed, summary.input_bytes)
        if kill:
            assert hook.killed == 1
            assert hosts.members[2] not in summary.hosts, summary.hosts
        alive = [0, 1] if kill else [0, 1, 2]
        assert {hosts.members[i] for i in alive} >= set(summary.hosts)

        rng = np.random.default_rng(7)
        frame = pd.DataFrame(
            {"key": rng.integers(0, 10_000, 300_000), "value": rng.standard_normal(300_000)}
        )
        chunks = [frame.iloc[i * 50_000 : (i + 1) * 50_000] for i in range(6)]
        parts = [hosts.clients[alive[q % len(alive)]].put(c) for q, c in enumerate(chunks)]
        buckets = D.sort_dataframe(hosts.clients[0], parts, "key", workers=hosts.dask, buckets=6)
        got = pd.concat(hosts.clients[0].get(buckets, timeout=60))
        pd.testing.assert_frame_equal(got, frame.sort_values("key", kind="stable"))
        del got
        hosts.clients[0].delete(buckets + parts)
        eventually(
            lambda: hosts.objects_left(alive) == [0] * len(alive),
            timeout=30,
            what="stores emptied",
        )


@NETNS
@pytest.mark.parametrize("kill", [False, True], ids=["all-hosts", "host-killed-mid-map"])
def test_local_inputs_are_read_on_their_hosts(tmp_path, kill):
    """Each host has files of its own at the same path (a directory bound
    there for its worker only, as a local disk). The sort reads every file
    on its host and the result validates against all three hosts' files.
    A host killed mid-map takes inputs nobody else has: the job fails
    with a JobError naming that host, instead of waiting for it."""
    from ferroplasma.errors import JobError

    disks = [tmp_path / f"disk{i}" for i in range(3)]
    for i, d in enumerate(disks):
        R.gen_records(str(d), "16MB", files=2, seed=20 + i, workers=1)
    mountpoint = tmp_path / "local"
    mountpoint.mkdir()
    # What the three disks hold together, for validation by the driver.
    union = tmp_path / "union"
    union.mkdir()
    for i, d in enumerate(disks):
        for f in sorted(d.iterdir()):
            (union / f"h{i}-{f.name}").symlink_to(f)
    out = str(tmp_path / "out")
    with Hosts(
        3,
        memory="256MiB",
        netns=True,
        local_dirs=[str(d) for d in disks],
        local_path=str(mountpoint),
    ) as hosts:
        if not kill:
            summary = R.sort_records(
                str(mountpoint),
                out,
                partitions=12,
                workers=hosts.dask,
                socket=hosts.stores[0].socket,
                split_size="4MB",
                say=lambda _msg: None,
                local_inputs=True,
            )
            assert summary.records == 480_000
            report = R.validate_records(str(union), out, workers=1)
            assert report.ok, report.problems
            assert report.input_records == 480_000
        else:
            with pytest.raises(JobError, match=hosts.members[2].replace(".", r"\.")):
                R.sort_records(
                    str(mountpoint),
                    out,
                    partitions=12,
                    workers=hosts.dask,
                    socket=hosts.stores[0].socket,
                    split_size="1MB",
                    progress=KillMidMap(hosts, 2),
                    say=lambda _msg: None,
                    local_inputs=True,
                )
            assert not [f for f in os.listdir(out) if f.startswith("part-")]
        eventually(
            lambda: hosts.objects_left([0, 1] if kill else [0, 1, 2]) == [0] * (2 if kill else 3),
            timeout=30,
            what="stores emptied",
        )


def test_local_inputs_need_a_dask_cluster(tmp_path):
    from ferroplasma.errors import JobError

    with pytest.raises(JobError, match="local_inputs"):
        R.sort_records(str(tmp_path), str(tmp_path / "out"), workers=1, local_inputs=True)
