"""Jobs on a real store: the DataFrame sample sort and the record sort."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import ferroplasma as fp
from conftest import eventually
from ferroplasma import jobs
from ferroplasma.errors import JobError, MalformedRecord
from ferroplasma.jobs import records as R

# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def big_store():
    with fp.start_store("256MiB") as s:
        yield s


@pytest.fixture(scope="module")
def pool(big_store):
    with jobs.Pool(big_store.socket, workers=2) as p:
        yield p.start()


@pytest.fixture
def bclient(big_store):
    c = big_store.connect()
    yield c
    c.delete(list(c.list()))


def put_parts(client, frame, k):
    edges = [len(frame) * i // k for i in range(k + 1)]
    return [client.put(frame.iloc[a:b]) for a, b in zip(edges, edges[1:])]


def sorted_via_job(client, frame, by, ascending=True, k=4, **kw):
    parts = put_parts(client, frame, k)
    out = jobs.sort_dataframe(client, parts, by, ascending=ascending, **kw)
    got = pd.concat(client.get(out))
    return got, out, parts


def expected(frame, by, ascending=True):
    return frame.sort_values(by, ascending=ascending, kind="stable", na_position="last")


# ------------------------------------------------------------------ DataFrame sort


def frame_of(n, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "i": rng.integers(-1000, 1000, n),
            "u": rng.integers(0, 2**64 - 1, n, dtype=np.uint64),
            "f": rng.normal(size=n),
            "s": rng.choice(["pear", "apple", "fig", "kiwi", ""], n),
            "t": pd.to_datetime(rng.integers(0, 10**9, n), unit="s"),
            "b": rng.random(n) < 0.3,
            "c": pd.Categorical(rng.choice(["lo", "mid", "hi"], n), ["lo", "mid", "hi"]),
            "row": np.arange(n),
        }
    )


@pytest.mark.parametrize(
    "by,ascending",
    [
        ("i", True),
        ("i", False),
        ("u", False),
        ("f", True),
        ("f", False),
        ("s", True),
        ("t", False),
        ("b", True),
        ("c", False),
        (["s", "i"], [True, False]),
        (["c", "b", "f"], [False, True, True]),
    ],
)
def test_sort_dataframe_equals_stable_sort_values(bclient, pool, by, ascending):
    frame = frame_of(20_000)
    got, out, _ = sorted_via_job(bclient, frame, by, ascending, k=5, workers=pool, buckets=3)
    assert len(out) == 3
    pd.testing.assert_frame_equal(got, expected(frame, by, ascending))


def test_sort_dataframe_nulls_go_last(bclient, pool):
    frame = frame_of(5_000)
    frame.loc[frame.index[::7], "f"] = np.nan
    frame.loc[frame.index[::11], "t"] = pd.NaT
    frame.loc[frame.index[::13], "s"] = None
    for by, asc in [("f", True), ("f", False), ("t", True), ("s", False)]:
        got, _, _ = sorted_via_job(bclient, frame, by, asc, workers=pool)
        pd.testing.assert_frame_equal(got, expected(frame, by, asc))


def test_sort_dataframe_extreme_integers_descending(bclient, pool):
    info = np.iinfo(np.int64)
    frame = pd.DataFrame({"k": np.array([info.min, info.max, 0, -1, info.min, 1] * 500)})
    got, _, _ = sorted_via_job(bclient, frame, "k", False, workers=pool)
    pd.testing.assert_frame_equal(got, expected(frame, "k", False))


def test_sort_dataframe_skewed_keys_spread_over_buckets(bclient, pool):
    rng = np.random.default_rng(3)
    n = 40_000
    keys = np.where(rng.random(n) < 0.9, 7, rng.integers(0, 1000, n))
    frame = pd.DataFrame({"k": keys, "row": np.arange(n)})
    got, out, _ = sorted_via_job(bclient, frame, "k", k=4, workers=pool, buckets=8)
    pd.testing.assert_frame_equal(got, expected(frame, "k"))
    sizes = [len(f) for f in bclient.get(out)]
    # 90 % of the rows share one key, yet no bucket holds much more than its share.
    assert max(sizes) < 1.5 * n / 8, sizes


def test_sort_dataframe_empty_partitions_and_buckets(bclient, pool):
    frame = frame_of(3_000)
    parts = [
        bclient.put(frame.iloc[:0]),
        bclient.put(frame.iloc[:1000]),
        bclient.put(frame.iloc[:0]),
        bclient.put(frame.iloc[1000:]),
    ]
    out = jobs.sort_dataframe(bclient, parts, "i", workers=pool, buckets=6)
    pd.testing.assert_frame_equal(pd.concat(bclient.get(out)), expected(frame, "i"))
    # All partitions empty: as many empty buckets, with the columns.
    empties = [bclient.put(frame.iloc[:0]) for _ in range(3)]
    out = jobs.sort_dataframe(bclient, empties, "i", workers=pool)
    frames = bclient.get(out)
    assert len(frames) == 3 and all(len(f) == 0 for f in frames)
    assert list(frames[0].columns) == list(frame.columns)
    # Few distinct keys, many buckets: some buckets are empty.
    tiny = pd.DataFrame({"k": [2, 1, 2, 1]})
    out = jobs.sort_dataframe(bclient, put_parts(bclient, tiny, 2), "k", workers=pool, buckets=7)
    pd.testing.assert_frame_equal(pd.concat(bclient.get(out)), expected(tiny, "k"))


def test_sort_dataframe_one_worker_and_more_workers_than_partitions(bclient):
    frame = frame_of(4_000)
    for workers, k in [(1, 3), (4, 2)]:
        got, out, _ = sorted_via_job(bclient, frame, "f", k=k, workers=workers)
        assert len(out) == k
        pd.testing.assert_frame_equal(got, expected(frame, "f"))
    # The signature: (client, parts, by, workers, buckets).
    out = jobs.sort_dataframe(bclient, put_parts(bclient, frame, 3), "f", 1, 2)
    assert len(out) == 2
    pd.testing.assert_frame_equal(pd.concat(bclient.get(out)), expected(frame, "f"))


def test_sort_dataframe_leaves_only_inputs_and_outputs(bclient, pool):
    frame = frame_of(10_000)
    parts = put_parts(bclient, frame, 4)
    out = jobs.sort_dataframe(bclient, parts, "i", workers=pool, buckets=5)
    want = {*parts, *out}
    eventually(lambda: set(bclient.list()) == want, what="only inputs and outputs left")
    # The inputs are untouched.
    pd.testing.assert_frame_equal(pd.concat(bclient.get(parts)), frame)


def test_sort_dataframe_bad_arguments(bclient, pool):
    frame = frame_of(100)
    parts = put_parts(bclient, frame, 2)
    with pytest.raises(JobError, match="no column 'nope'"):
        jobs.sort_dataframe(bclient, parts, "nope", workers=pool)
    array = bclient.put(np.arange(3))
    with pytest.raises(JobError, match="not a pandas DataFrame"):
        jobs.sort_dataframe(bclient, [array], "i", workers=pool)
    with pytest.raises(JobError, match="not in the store"):
        jobs.sort_dataframe(bclient, [fp.ObjectID.random()], "i", workers=pool)
    with pytest.raises(JobError, match="buckets"):
        jobs.sort_dataframe(bclient, parts, "i", workers=pool, buckets=0)
    with pytest.raises(JobError, match="ascending"):
        jobs.sort_dataframe(bclient, parts, ["i", "f"], pool, ascending=[True])
    with pytest.raises(JobError, match="workers"):
        jobs.sort_dataframe(bclient, parts, "i", workers=0)
    assert jobs.sort_dataframe(bclient, [], "i", workers=pool) == []
    # Nothing of the failed jobs is left behind.
    eventually(lambda: set(bclient.list()) == {*parts, array}, what="only the inputs left")


def test_pool_with_spawned_workers(bclient):
    frame = frame_of(2_000)
    with jobs.Pool(bclient.socket, 2, start_method="spawn") as spawned:
        got, _, _ = sorted_via_job(bclient, frame, "s", workers=spawned)
    pd.testing.assert_frame_equal(got, expected(frame, "s"))


def test_progress_lines_without_tqdm(capsys):
    from ferroplasma.jobs.cli import _LineProgress

    bar = _LineProgress("map", 1000)
    for _ in range(10):
        bar.update(100)
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 10 and lines[-1].startswith("map: 100% (")
    assert lines[-1].endswith("MB/s)")


def test_pool_reports_a_missing_store(tmp_path):
    with jobs.Pool(str(tmp_path / "none.sock"), workers=1) as p:
        with pytest.raises(fp.StoreUnavailable):
            p.start()


# ------------------------------------------------------------------ records


def fp_cli(*args, env=None, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "ferroplasma", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=300,
    )


def read_all(directory):
    return b"".join(
        open(os.path.join(directory, f), "rb").read() for f in sorted(os.listdir(directory))
    )


def test_gen_is_seeded_and_well_formed(tmp_path):
    a = R.gen_records(str(tmp_path / "a"), "1MB", files=3, seed=5, workers=2)
    R.gen_records(str(tmp_path / "b"), "1MB", files=3, seed=5, workers=1)
    c = R.gen_records(str(tmp_path / "c"), "1MB", files=3, seed=6, workers=1)
    assert [os.path.basename(p) for p in a] == [f"records-{i:05d}.txt" for i in range(3)]
    assert read_all(tmp_path / "a") == read_all(tmp_path / "b") != read_all(tmp_path / "c")
    data = read_all(tmp_path / "a")
    assert len(data) == 10_000 * 100 and sum(os.path.getsize(p) for p in c) == len(data)
    lines = data.split(b"\n")[:-1]
    assert all(len(x) == 99 and x[8:9] == b"\t" and b"\t" not in x[:8] for x in lines)
    keys = {x[:8] for x in lines}
    assert 1000 < len(keys) <= 65536


def check_sorted_output(inp, out, partitions):
    files = sorted(os.listdir(out))
    assert files == [f"part-{p:05d}" for p in range(partitions)]
    got = [open(os.path.join(out, f), "rb").read().split(b"\n")[:-1] for f in files]
    keys_per_part = [[x[:8] for x in part] for part in got]
    for ks in keys_per_part:
        assert ks == sorted(ks)
    nonempty = [ks for ks in keys_per_part if ks]
    for a, b in zip(nonempty, nonempty[1:]):
        assert a[-1] < b[0]  # disjoint key ranges in order: a key in one partition
    assert sorted(x for part in got for x in part) == sorted(read_all(inp).split(b"\n")[:-1])
    assert R.validate_records(str(inp), str(out), workers=1).ok


def test_sort_records_on_a_store(tmp_path, big_store):
    inp, out = tmp_path / "in", tmp_path / "out"
    R.gen_records(str(inp), "2MB", files=3, seed=1)
    summary = R.sort_records(
        str(inp), str(out), partitions=7, workers=2, socket=big_store.socket, split_size="300KB"
    )
    assert summary.records == 20_000 and summary.partitions == 7
    assert summary.store_bytes == 2_000_000 and summary.spilled_bytes == 0
    assert not summary.private_store
    check_sorted_output(inp, out, 7)
    c = big_store.connect()
    eventually(lambda: not c.list(), what="the job's objects deleted")
    assert not [f for f in os.listdir(out) if f.startswith(".")]


@pytest.mark.parametrize("workers,partitions", [(1, 5), (6, 3)])
def test_sort_records_one_worker_and_more_workers_than_splits(
    tmp_path, big_store, workers, partitions
):
    inp, out = tmp_path / "in", tmp_path / "out"
    R.gen_records(str(inp), "300KB", files=2, seed=2)
    R.sort_records(str(inp), str(out), partitions, workers=workers, socket=big_store.socket)
    check_sorted_output(inp, out, partitions)


def test_sort_records_skew_gives_empty_partitions(tmp_path, big_store):
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    rng = np.random.default_rng(0)
    lines = [
        (b"SAMEKEY!" if i % 10 else b"other%03d" % (i % 7))
        + b"\t"
        + bytes(rng.integers(33, 127, 90, dtype=np.uint8))
        + b"\n"
        for i in range(5000)
    ]
    (inp / "skewed.txt").write_bytes(b"".join(lines))
    R.sort_records(str(inp), str(out), 12, workers=2, socket=big_store.socket, split_size="100KB")
    check_sorted_output(inp, out, 12)
    sizes = [os.path.getsize(out / f"part-{p:05d}") for p in range(12)]
    assert sizes.count(0) >= 4  # 8 distinct keys cannot fill 12 partitions
    assert max(sizes) == 4500 * 100  # every record of the common key in one partition


def test_sort_records_spills_what_the_store_cannot_hold(tmp_path):
    inp, out = tmp_path / "in", tmp_path / "out"
    R.gen_records(str(inp), "12MB", files=2, seed=3)
    with fp.start_store("4MiB") as small:
        s = R.sort_records(str(inp), str(out), 9, workers=2, socket=small.socket, split_size="1MB")
    assert s.spilled_bytes > 6_000_000 and s.store_bytes > 0
    assert s.store_bytes + s.spilled_bytes == 12_000_000
    check_sorted_output(inp, out, 9)


def test_sort_records_starts_a_private_store(tmp_path):
    inp, out = tmp_path / "in", tmp_path / "out"
    R.gen_records(str(inp), "500KB", files=1)
    said = []
    s = R.sort_records(
        str(inp), str(out), 4, workers=2, socket=str(tmp_path / "none.sock"), say=said.append
    )
    assert s.private_store and "started a private store" in said[0]
    check_sorted_output(inp, out, 4)


def corrupt(path, record, new):
    data = bytearray(open(path, "rb").read())
    data[record * 100 : (record + 1) * 100] = new
    open(path, "wb").write(bytes(data))


@pytest.mark.parametrize(
    "damage,line,why",
    [
        (b"k" * 8 + b"\t" + b"v" * 89 + b"\n", 5, "is 99 bytes long"),
        (b"k" * 8 + b" " + b"v" * 90 + b"\n", 5, "no TAB after its 8-byte key"),
        (b"k\tkkkkkk\t" + b"v" * 90 + b"\n", 5, "TAB inside its key"),
    ],
)
def test_sort_records_names_a_malformed_line(tmp_path, big_store, damage, line, why):
    inp, out = tmp_path / "in", tmp_path / "out"
    paths = R.gen_records(str(inp), "300KB", files=2)
    corrupt(paths[1], line - 1, damage)
    with pytest.raises(MalformedRecord, match=why) as e:
        R.sort_records(str(inp), str(out), 3, workers=2, socket=big_store.socket)
    assert e.value.path == paths[1] and e.value.line == line
    assert f"{paths[1]}:{line}:" in str(e.value)


def test_failed_sort_leaves_nothing_in_the_store(tmp_path, big_store):
    # Maps running when another one fails still finish; what they placed in
    # the store is deleted, as is what the job already held.
    inp = tmp_path / "in"
    paths = R.gen_records(str(inp), "2MB", files=1)
    corrupt(paths[0], 3, b"x" * 100)
    c = big_store.connect()
    with pytest.raises(MalformedRecord):
        R.sort_records(
            str(inp), str(tmp_path / "o"), 4, workers=3, socket=big_store.socket, split_size="50KB"
        )
    eventually(lambda: not c.list(), what="no objects of the failed job left")
    assert not [f for f in os.listdir(tmp_path / "o") if f.startswith(".")]


def test_sort_records_truncated_last_line(tmp_path, big_store):
    inp = tmp_path / "in"
    (path,) = R.gen_records(str(inp), "10KB", files=1)
    with open(path, "ab") as f:
        f.write(b"partial")
    with pytest.raises(MalformedRecord, match=r":101: line is 7 bytes long"):
        R.sort_records(str(inp), str(tmp_path / "o"), 2, workers=1, socket=big_store.socket)


def test_sort_records_bad_arguments(tmp_path, big_store):
    with pytest.raises(JobError, match="does not exist"):
        R.sort_records(str(tmp_path / "missing"), str(tmp_path / "o"), socket=big_store.socket)
    (tmp_path / "empty").mkdir()
    with pytest.raises(JobError, match="holds no files"):
        R.sort_records(str(tmp_path / "empty"), str(tmp_path / "o"), socket=big_store.socket)
    with pytest.raises(JobError, match="partitions"):
        R.sort_records(str(tmp_path / "empty"), str(tmp_path / "o"), partitions=0)
    with pytest.raises(JobError, match="not a size"):
        R.parse_size("ten gigs")
    assert R.parse_size("10GiB") == 10 * 2**30 and R.parse_size("1.5MB") == 1_500_000


def test_validate_finds_each_kind_of_damage(tmp_path, big_store):
    inp, out = tmp_path / "in", tmp_path / "out"
    R.gen_records(str(inp), "400KB", files=2, seed=9)
    R.sort_records(str(inp), str(out), 4, workers=2, socket=big_store.socket)
    assert R.validate_records(str(inp), str(out)).ok
    p0, p1 = out / "part-00000", out / "part-00001"
    original = p0.read_bytes(), p1.read_bytes()

    def damaged(mutate, expect):
        mutate()
        report = R.validate_records(str(inp), str(out), workers=1)
        p0.write_bytes(original[0])
        p1.write_bytes(original[1])
        assert not report.ok
        assert expect in str(report), str(report)

    lines0 = original[0].split(b"\n")[:-1]
    swapped = [*lines0[:10], lines0[200], *lines0[11:200], lines0[10], *lines0[201:]]
    damaged(lambda: p0.write_bytes(b"\n".join(swapped) + b"\n"), "less than the line before")
    # A record from the middle of partition 1 moved to the end of partition 0:
    # both stay sorted, but their key ranges now overlap.
    moved, rest = original[1][10000:10100], original[1][:10000] + original[1][10100:]
    damaged(
        lambda: (p0.write_bytes(original[0] + moved), p1.write_bytes(rest)),
        "partitions overlap",
    )
    flipped = bytearray(original[0])
    flipped[150] = ord("#") if flipped[150] != ord("#") else ord("%")
    damaged(lambda: p0.write_bytes(bytes(flipped)), "differ from the input")
    damaged(lambda: p0.write_bytes(original[0][100:]), "records, the input")
    damaged(lambda: p0.write_bytes(original[0][:-1]), "part-00000:")


def test_records_cli_end_to_end(tmp_path, big_store):
    inp, out = tmp_path / "in", tmp_path / "out"
    r = fp_cli("records", "gen", "--size", "1MB", "--files", "2", "--out", str(inp), "--quiet")
    assert r.returncode == 0, r.stderr
    assert "wrote 0.00 GB in 2 files" in r.stdout
    r = fp_cli(
        "records", "sort", "--input", str(inp), "--output", str(out), "--partitions", "5",
        "--socket", big_store.socket, "--workers", "2",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "sorted 10,000 records" in r.stdout and "through the store" in r.stdout
    assert "map" in r.stderr and "reduce" in r.stderr  # the progress bars
    # An earlier sort's output is not mixed with a new one's.
    again = [
        "records", "sort", "--input", str(inp), "--output", str(out), "--partitions", "3",
        "--socket", big_store.socket, "--quiet",
    ]  # fmt: skip
    r = fp_cli(*again)
    assert r.returncode == 2 and "already holds 5 part files" in r.stderr
    r = fp_cli(*again, "--overwrite")
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(out)) == [f"part-{p:05d}" for p in range(3)]
    r = fp_cli("records", "validate", "--input", str(inp), "--output", str(out), "--quiet")
    assert r.returncode == 0 and r.stdout.startswith("OK: 10,000 records"), r.stdout
    # Damage: exit status 1 and what is wrong.
    (out / "part-00002").write_bytes(b"")
    r = fp_cli("records", "validate", "--input", str(inp), "--output", str(out), "--quiet")
    assert r.returncode == 1 and "INVALID" in r.stdout


def test_records_cli_errors(tmp_path):
    r = fp_cli("records", "sort", "--input", str(tmp_path / "nope"), "--output", str(tmp_path))
    assert r.returncode == 2 and "does not exist" in r.stderr
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "bad.txt").write_bytes(b"short line\n")
    r = fp_cli(
        "records", "sort", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "o"),
        "--socket", str(tmp_path / "none.sock"), "--quiet",
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert f"{tmp_path / 'in' / 'bad.txt'}:1: line is 11 bytes long" in r.stderr
    assert "started a private store" in r.stderr
    r = fp_cli("records", "gen", "--size", "lots", "--out", str(tmp_path / "g"))
    assert r.returncode == 2 and "not a size" in r.stderr
    r = fp_cli("records", "--help")
    assert r.returncode == 0 and "100" in r.stdout and "validate" in r.stdout
    r = fp_cli("--help")
    assert "records" in r.stdout and "dataframe" in r.stdout


def test_dataframe_cli(tmp_path, big_store):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    frame = frame_of(3000).drop(columns=["c"])
    src, dst = tmp_path / "t.parquet", tmp_path / "s.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), src)
    r = fp_cli(
        "dataframe", "sort", "--input", str(src), "--by", "s,i", "--descending", "i",
        "--output", str(dst), "--socket", big_store.socket, "--partitions", "3",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = pq.read_table(dst).to_pandas().reset_index(drop=True)
    want = expected(frame, ["s", "i"], [True, False]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want)
    # Ids in, ids out.
    c = big_store.connect()
    parts = put_parts(c, frame, 2)
    r = fp_cli(
        "dataframe", "sort", "--objects", ",".join(p.hex() for p in parts), "--by", "f",
        "--socket", big_store.socket, "--quiet",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = [fp.ObjectID.from_hex(x) for x in r.stdout.split()]
    pd.testing.assert_frame_equal(pd.concat(c.get(out)), expected(frame, "f"))
    r = fp_cli(
        "dataframe", "sort", "--input", str(src), "--by", "nope", "--socket", big_store.socket
    )
    assert r.returncode == 2 and "no column 'nope'" in r.stderr
    r = fp_cli("dataframe", "sort", "--input", str(src), "--by", "i", "--descending", "f")
    assert r.returncode == 2 and "not --by columns" in r.stderr
