"""`make bench-calls` at its smallest, so that it cannot rot: the Python
client's worker measures every figure against a real store and leaves
nothing behind, and the report puts each client beside Plasma's C++ client.
The other languages' programs are built and run by the tests of their
clients (test_languages.py, test_plasma_cpp.py, make test-go and test-java);
the whole run is `make bench-calls QUICK=1`."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import calls


def test_the_python_worker_measures_every_call_and_deletes_its_objects(client):
    before = len(client.list())
    figures = calls.worker(client.socket)
    assert set(figures) == set(calls.MEASURES)
    assert all(v > 0 for v in figures.values()), figures
    # A batch of 1,000 costs more than one get of one object.
    assert figures["batch_us"] * 1000 > figures["get_ns"]
    assert len(client.list()) == before


def test_the_report_gives_each_client_its_ratio_to_plasmas_cpp_client():
    plasma = {
        "get_ns": 70000.0,
        "contains_ns": 60000.0,
        "create_seal_ns": 140000.0,
        "batch_us": 5000.0,
    }
    c = {"get_ns": 140.0, "contains_ns": 60.0, "create_seal_ns": 70000.0, "batch_us": 125.0}
    table = calls.render({"C": c, "Plasma 11 C++": plasma}).splitlines()
    assert table[0].startswith("| client | get + release (ns) | contains (ns)")
    assert table[2] == "| C | 140 (×0.002) | 60 (×0.001) | 70000 (×0.5) | 125.00 (×0.025) |"
    assert table[3] == "| Plasma 11 C++ | 70000 | 60000 | 140000 | 5000.00 |"
