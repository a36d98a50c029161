"""Fixtures: real stores started with ferroplasma.start_store."""

from __future__ import annotations

import gc
import time

import pytest

import ferroplasma as fp


@pytest.fixture
def store():
    with fp.start_store("64MiB") as s:
        yield s


@pytest.fixture
def client(store):
    return store.connect()


def eventually(pred, timeout=10.0, what="condition"):
    """Waits for `pred()` (releases reach the store asynchronously)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gc.collect()
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def member_address(client) -> str:
    """The cluster address a store started with ``cluster_listen="HOST:0"``
    picked for itself."""
    [me] = [m for m in client.cluster_status()["members"] if m["health"] == "this"]
    return me["address"]
