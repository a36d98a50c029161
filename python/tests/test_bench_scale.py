"""`make bench-scale` at its smallest, so that it cannot rot: ferroplasma
grown to 10^3 objects against a real store, through the driver, its worker
process and the report; the pieces it relies on (memory from /proc, the
limits that stop a system, the ratios and targets) on their own.

The peers (Plasma, Ray) are not needed: bench/scale runs them in their own
venvs, as bench/compare does, and test_bench_compare.py covers those.
"""

from __future__ import annotations

import json
import mmap
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

from scale import procmem, report, run, systems

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs")


def test_ferroplasma_grows_to_a_thousand_objects_and_stops_before_ten_thousand(tmp_path):
    """Every figure is measured at 10^3; a grow limit of a millisecond
    stops the store before 10^4 from its put rate, the report says why,
    and every object is deleted."""
    out = tmp_path / "out"
    argv = ["--systems", "ferroplasma", "--counts", "1000,10000", "--samples", "40"]
    argv += ["--batches", "2", "--rounds", "2", "--max-grow-seconds", "0.001"]
    assert run.main([*argv, "--out", str(out)]) == 0
    results = json.loads((out / "scale.json").read_text())
    point = results["points"]["ferroplasma"]["1000"]
    for measure in ["get", "contains", "contains_absent", "get_batch"]:
        assert point[measure]["n"] == (40 if measure != "get_batch" else 2), measure
        assert 0 < point[measure]["p50"] <= point[measure]["p90"], measure
    assert point["put"]["n"] == 1000 and point["put_window"]["n"] == 100
    assert point["store"]["vm_rss"] > 0, "a thousand objects took no memory?"
    assert "10000" not in results["points"]["ferroplasma"]
    st = results["systems"]["ferroplasma"]
    assert st["status"] == "stopped" and st["stopped_after"] == 1000
    assert "growing to 10,000 would take" in st["error"]
    assert st["after_delete"]["deleted"] == 1000
    assert st["put_100"]["n"] == 100
    md = (out / "scale.md").read_text()
    assert "**stopped** after 10^3: growing to 10,000 would take" in md
    assert "| 10^3 | " in md and "![scale.png](img/scale.png)" in md
    assert (out / "img" / "scale.png").stat().st_size > 0


def test_store_memory_sets_the_data_area_apart():
    """The largest shared mapping is the data area: only its touched pages
    count, and the rest of the process is `other`."""
    size = 64 * 2**20
    area = mmap.mmap(-1, size, flags=mmap.MAP_SHARED)
    try:
        area[: 2**20] = b"x" * 2**20  # touch 1 MiB of 64
        got_size, rss, _ = procmem.largest_shared_mapping(os.getpid())
        assert got_size >= size
        assert 2**20 <= rss < 8 * 2**20
        mem = procmem.store([os.getpid()])
        assert mem["vm_rss"] == mem["data_rss"] + mem["other"]
        assert mem["rss_anon"] > 0 and mem["rss_shmem"] >= 2**20
    finally:
        area.close()
    assert procmem.store([]) is None


def test_shared_memory_stops_before_filling_dev_shm():
    shm = systems.make_system("shm", 64)
    assert shm.limit(10) is None
    why = shm.limit(10**12)
    assert why and "of /dev/shm" in why


def _point(get, put_window=1e-6, other=100):
    lat = lambda x: {"p50": x, "p90": x * 2, "n": 10}  # noqa: E731
    n = 10**7
    return {
        "get": lat(get),
        "contains": lat(get),
        "get_batch": lat(get * 100),
        "put_window": lat(put_window),
        "store": {"vm_rss": 200 * n, "other": other * n, "rss_anon": 1, "rss_shmem": 1},
    }


def test_growth_ratios_and_targets():
    ok = {"status": "ok", "version": "1", "error": None, "notes": "", "stopped_after": 10**7}
    results = {
        "config": {"counts": [10**4, 10**6, 10**7]},
        "systems": {
            "ferroplasma": {
                **ok,
                "put_100": {"p50": 1e-6},
                "after_delete": {"deleted": 10**7, "seconds": 1, "store": {"vm_rss": 100 * 2**20}},
            }
        },
        "points": {
            "ferroplasma": {
                "10000": _point(1e-6),
                "1000000": _point(1.2e-6),
                "10000000": _point(3e-6, put_window=1.1e-6, other=400),
            }
        },
    }
    g = report.growth(results)["ferroplasma"]
    assert g["get"][10**6] == pytest.approx(1.2) and g["get"][10**7] == pytest.approx(3.0)
    rows = "\n".join(report.targets(results))
    assert "| get p50 at 10^6 over 10^4 | ×1.20 | ≤ ×1.5 | met |" in rows
    assert "| get p50 at 10^7 over 10^4 | ×3.00 | ≤ ×1.5 | **missed** |" in rows
    assert "×1.10 | ≤ ×1.2 | met |" in rows  # the 10^7th put over the 100th
    assert "| 400 B | ≤ 150 B | **missed** |" in rows
    assert "+100.0 MiB (10,000,000 deleted) | ≤ 64 MiB | **missed** |" in rows
    assert rows.count("| — |") == 6, "no floor measured: none is given"
    # The floor: one read costs 0.5 µs more at 10^7, a batch of 1,000 30 µs.
    results["floor"] = {
        "10000": {"read": 20e-9, "batch": 5e-6},
        "10000000": {"read": 520e-9, "batch": 35e-6},
    }
    rows = "\n".join(report.targets(results))
    assert "| ×3.00 | ≤ ×1.5 | **missed** | ×1.50 (20 ns → 520 ns) |" in rows
    batch_10_7 = next(r for r in rows.splitlines() if r.startswith("| get_batch p50 at 10^7"))
    assert batch_10_7.endswith("| ×1.30 (5 µs → 35 µs) |"), batch_10_7


def test_docs_section_is_what_the_report_makes_of_docs_scale_json():
    """docs/benchmarks.md's generated section and docs/scale.json agree, as
    `make bench-scale` writes them."""
    with open(os.path.join(DOCS, "scale.json")) as f:
        results = json.load(f)
    with open(os.path.join(DOCS, "benchmarks.md")) as f:
        text = f.read()
    section = text.split(report.BEGIN + "\n", 1)[1].split(report.END, 1)[0]
    assert section == report.markdown(results) + f"\n![{report.PLOT}](img/{report.PLOT})\n"
    assert os.path.isfile(os.path.join(DOCS, "img", report.PLOT))
