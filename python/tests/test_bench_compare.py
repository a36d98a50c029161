"""The side-by-side benchmark's statistics, report and adapters.

Runs without the peers (Plasma, Ray, Vineyard) installed: the adapters that
need no peer (ferroplasma against a real store, shared_memory, pickle) run
every workload at a tiny size, through the same code the benchmark uses.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

from compare import adapters, report, run, stats, worker, workloads

# ---------------------------------------------------------------- statistics


@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 99, 100])
def test_percentile_matches_numpy(q):
    xs = list(np.random.default_rng(q).exponential(size=101 + q))
    assert stats.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_percentile_rejects_bad_input():
    with pytest.raises(ValueError):
        stats.percentile([], 50)
    with pytest.raises(ValueError):
        stats.percentile([1.0], 101)


def test_summarize_samples():
    s = stats.summarize_samples([float(i) for i in range(1, 101)])
    assert s["p50"] == pytest.approx(50.5)
    assert s["p99"] == pytest.approx(99.01)
    assert s["n"] == 100


def test_across_reps_drops_warmup_and_missing():
    s = stats.across_reps([100.0, 3.0, None, 1.0, 2.0])
    assert s == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert stats.across_reps([5.0]) is None  # only the warm-up ran
    assert stats.across_reps([None, None]) is None


def test_ratio():
    assert stats.ratio(3.0, 1.5) == 2.0
    assert stats.ratio(None, 1.0) is None
    assert stats.ratio(1.0, 0.0) is None


def test_interleaved_rotates_every_system_to_the_front():
    systems = ["a", "b", "c"]
    firsts = [stats.interleaved(systems, r)[0] for r in range(3)]
    assert sorted(firsts) == systems
    for r in range(5):
        assert sorted(stats.interleaved(systems, r)) == systems
    assert stats.interleaved([], 3) == []


# -------------------------------------------------------------------- report


def _results():
    fig = lambda m: {"median": m, "min": m * 0.9, "max": m * 1.1, "n": 3}  # noqa: E731
    ok = {"status": "ok", "version": "1", "error": None, "notes": ""}
    return {
        "machine": {
            "date": "2026-01-01",
            "cpu": "cpu",
            "cores": 2,
            "memory_gib": 1.0,
            "kernel": "k",
            "python": "3",
        },
        "config": {
            "rounds": 3,
            "warmup_rounds": 1,
            "quick": False,
            "seconds": 1,
            "workloads": ["latency", "micro"],
        },
        "systems": {
            "ferroplasma": ok,
            "plasma": ok,
            "ray": {"status": "missing", "version": None, "error": "pip failed", "notes": ""},
        },
        "limits": {"memcpy_gibs": fig(10.0), "read_gibs": fig(20.0), "socket_rt": fig(1e-5)},
        "figures": {
            "latency/get/p50": {"ferroplasma": fig(10e-6), "plasma": fig(20e-6)},
            "micro/10x100000000/reader_gibs": {"ferroplasma": fig(4.0), "plasma": fig(8.0)},
        },
        "errors": {},
    }


def test_ratios_point_the_same_way_for_times_and_rates():
    r = _results()
    # plasma takes twice as long: ratio 2, ferroplasma ahead
    assert report.cost_ratio("latency/get/p50", 20e-6, 10e-6) == pytest.approx(2.0)
    # plasma reads twice as fast: ratio 0.5, ferroplasma behind
    assert report.cost_ratio("x/reader_gibs", 8.0, 4.0) == pytest.approx(0.5)
    lag = report.behind(r)
    assert len(lag) == 1 and "reader_gibs" in lag[0] and "plasma" in lag[0]


def test_markdown_reports_missing_peers_and_ratios():
    md = report.markdown(_results())
    assert "**missing**: pip failed" in md
    assert "**×2.00**" in md  # plasma's get, twice ferroplasma's time
    assert "**×0.50**" in md  # plasma's reader, twice ferroplasma's GiB/s
    assert "n/a" in md  # shapes that did not run
    assert "| ray |" in md


def test_replace_section(tmp_path):
    path = tmp_path / "benchmarks.md"
    path.write_text("# Benchmarks\n\nintro\n")
    report.replace_section(str(path), "first\n")
    report.replace_section(str(path), "second\n")
    text = path.read_text()
    assert text.startswith("# Benchmarks\n\nintro\n")
    assert "second" in text and "first" not in text
    assert text.count(report.BEGIN) == 1 and text.count(report.END) == 1


def test_write_makes_json_markdown_and_plots(tmp_path):
    paths = report.write(_results(), str(tmp_path))
    names = sorted(os.path.basename(p) for p in paths)
    assert names == ["compare-latency.png", "compare-micro.png", "compare.json", "compare.md"]
    assert all(os.path.getsize(p) > 0 for p in paths)


def test_flatten():
    flat = run.flatten({"a": {"p50": 1, "p99": 2, "n": 5}, "b": {"c": 3, "d": None}})
    assert flat == {"a/p50": 1, "a/p99": 2, "b/c": 3, "b/d": None}


def test_missing_peer_is_reported_not_dropped(tmp_path, monkeypatch):
    monkeypatch.setattr(run, "VENVS", str(tmp_path))
    why = run.ensure_peer("plasma", install=False)
    assert why is not None and "pyarrow==11.0.0" in why


def test_unknown_system_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown system"):
        adapters.make("memcached")


# ----------------------------------------------------------- adapters, live

SHAPES = [(5, 1000), (2, 100_000)]


@pytest.fixture(params=["ferroplasma", "shm", "pickle"])
def adapter(request, tmp_path):
    a = adapters.make(request.param)
    a.start(64 * 1024 * 1024, str(tmp_path))
    yield a
    a.stop()


def test_latency_workload(adapter):
    if not adapter.raw:
        with pytest.raises(adapters.Unsupported):
            workloads.latency(adapter, 10)
        return
    r = workloads.latency(adapter, 20)
    for op in ["create_seal", "get", "release", "contains", "delete"]:
        assert r[op]["n"] == 20 and 0 < r[op]["p50"] <= r[op]["p99"]


def test_micro_workload_reads_the_right_bytes_in_another_process(adapter):
    if not adapter.raw:
        return
    r = workloads.micro(adapter, worker.remote_read(adapter), shapes=SHAPES)
    assert set(r) == {"5x1000", "2x100000"}
    for fig in r.values():
        assert fig["create"] > 0 and fig["get_each"] > 0 and fig["reader_gibs"] > 0
        assert (fig["get_batch"] is None) == (not adapter.batched_get)


def test_putget_workload(adapter):
    r = workloads.putget(adapter, worker.remote_read(adapter), scale=0.02, sizes=[1000, 100_000])
    assert set(r) == {"numpy:1000", "numpy:100000", "bytes:1000", "bytes:100000"}
    for fig in r.values():
        assert fig["put"] > 0 and fig["get"] > 0 and fig["get_other"] > 0


def test_ray_blog_workload_round_trips(adapter):
    objs = [("small dict", {"a": np.arange(10), "b": np.ones(3)}), ("strings", ["x", "y"])]
    r = workloads.ray_blog(adapter, calls=1, objects=objs)
    assert set(r) == {"small dict", "strings"}


def test_reader_sees_what_the_writer_stored(adapter):
    """The reader process's checksum is checked against the source."""
    if not adapter.raw:
        return
    src = np.arange(1000, dtype=np.uint64).view(np.uint8)
    keys = [adapter.create_seal(src) for _ in range(3)]
    got = worker.spawn_reader(adapter, keys, "raw")
    assert got["checksum"] == 3 * int(np.arange(1000, dtype=np.uint64).sum())
    adapter.delete(keys)


def test_worker_process_protocol(tmp_path, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # where the worker's scratch dir goes
    w = run.Worker("shm", str(tmp_path))
    try:
        assert w.ask(cmd="start", capacity=1 << 20)["ok"]
        r = w.ask(cmd="run", workload="latency", params={"ops": 5})
        assert r["ok"] and r["result"]["get"]["n"] == 5
        bad = w.ask(cmd="run", workload="nonsense")
        assert not bad["ok"] and "unknown workload" in bad["error"]
        assert [p.name[:11] for p in scratch.iterdir()] == ["fp-compare-"]
    finally:
        w.close()
    assert list(scratch.iterdir()) == [], "the worker removed its scratch directory"


def test_limits_are_measured():
    lim = workloads.limits(nbytes=1_000_000, rt_samples=50)
    assert lim["memcpy_gibs"] > 0 and lim["read_gibs"] > 0 and 0 < lim["socket_rt"] < 0.1


def test_docs_section_is_what_the_report_makes_of_docs_compare_json():
    """docs/benchmarks.md's generated section, its chart names and
    docs/compare.json agree: a renamed workload, heading or chart is renamed
    in all three, as `make bench-compare` would write them."""
    import json

    docs = os.path.join(os.path.dirname(__file__), "..", "..", "docs")
    with open(os.path.join(docs, "compare.json")) as f:
        results = json.load(f)
    names = [report.PLOTS[w] for w in results["config"]["workloads"] if w in report.PLOTS]
    with open(os.path.join(docs, "benchmarks.md")) as f:
        text = f.read()
    section = text.split(report.BEGIN + "\n", 1)[1].split(report.END, 1)[0]
    assert section == report.markdown(results) + report.pictures_md(names)
    for n in names:
        assert os.path.isfile(os.path.join(docs, "img", n)), n
