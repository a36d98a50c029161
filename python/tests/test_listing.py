"""Listing, checking and deleting any number of objects (issue 38): a
store of a million objects is listed whole, each object once, from Python
(``Client.list``, ``Client.list_pages``, ``plasma`` ``list()``) and from
``ferroplasma list``; ``contains`` and ``delete`` take a million ids in one
call. One store is filled once for the module (about 20 s on 2 cores, from
four clients at once)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

import ferroplasma as fp
from ferroplasma import plasma

MILLION = 1_000_000


def _fill(store, ids: list[bytes], clients: int = 4) -> None:
    """Puts every id, from several clients at once: one client waits a
    round trip per put, which on an idle VM is mostly a sleeping vCPU
    waking (docs/benchmarks.md), so four keep the store busy and fill it
    about five times faster."""
    conns = [store.connect() for _ in range(clients)]

    def put_share(k: int) -> None:
        put = conns[k]._native.create_and_seal
        for raw in ids[k::clients]:
            put(raw, b"x", b"")

    workers = [threading.Thread(target=put_share, args=(k,)) for k in range(clients)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


@pytest.fixture(scope="module")
def full_store():
    with fp.start_store("512MiB") as store:
        client = store.connect()
        ids = [os.urandom(20) for _ in range(MILLION)]
        _fill(store, ids)
        assert len(client.list()) == MILLION
        yield store, client, ids


def test_list_of_a_million_objects_has_each_exactly_once(full_store):
    _, client, ids = full_store
    listed = client.list()
    assert len(listed) == MILLION
    assert {oid.binary() for oid in listed} == set(ids)
    some = fp.ObjectID(ids[12345])
    assert listed[some]["data_size"] == 1 and listed[some]["state"] == "sealed"
    assert sorted(listed[some]) == sorted(
        [
            "data_size",
            "metadata_size",
            "ref_count",
            "state",
            "create_time",
            "construct_duration",
            "delete_pending",
            "spilled",
            "cached",
        ]
    )


def test_list_pages_of_a_million_objects_has_each_exactly_once(full_store):
    _, client, ids = full_store
    seen = 0
    keys: set[bytes] = set()
    pages = client.list_pages(100_000)
    first = next(pages)
    assert 0 < len(first) <= 1000, "the first page is small, so that it comes at once"
    for page in [first, *pages]:
        assert len(page) <= 100_000
        seen += len(page)
        keys.update(oid.binary() for oid in page)
    assert seen == MILLION and keys == set(ids)


def test_plasma_list_of_a_million_objects(full_store):
    store, _, ids = full_store
    listed = plasma.connect(store.socket).list()
    assert len(listed) == MILLION
    info = listed[plasma.ObjectID(ids[7])]
    assert info["data_size"] == 1 and info["state"] == "sealed"
    assert isinstance(info["create_time"], int) and isinstance(info["construct_duration"], int)


def test_the_cli_lists_a_million_objects_each_exactly_once(full_store):
    store, _, ids = full_store
    exe = os.path.join(os.path.dirname(sys.executable), "ferroplasma")
    out = subprocess.run(
        [exe, "list", "-s", store.socket], capture_output=True, text=True, check=True, timeout=120
    ).stdout.splitlines()
    assert out[0].split()[:2] == ["object", "id"]
    rows = [line.split()[0] for line in out[1:]]
    assert len(rows) == MILLION
    assert set(rows) == {raw.hex() for raw in ids}
    assert out[1].split()[1:] == ["1", "0", "0", "sealed"]
    head = subprocess.run(
        [exe, "list", "-s", store.socket, "--limit", "3", "--page-size", "2"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert len(head) == 4


def test_contains_and_delete_of_a_million_ids_in_one_call(full_store):
    _, client, ids = full_store
    oids = [fp.ObjectID(raw) for raw in ids]
    absent = fp.ObjectID.random()
    assert client.contains([*oids, absent]) == [True] * MILLION + [False]
    assert client.delete(oids) == ["deleted"] * MILLION
    assert client.contains(oids[:10]) == [False] * 10
    assert client.list() == {}
    assert client.stats()["objects"] == 0


def test_plasma_delete_and_contains_of_many_ids():
    with fp.start_store("64MiB") as store:
        client = plasma.connect(store.socket)
        ids = [plasma.ObjectID.from_random() for _ in range(120_000)]
        _fill(store, [oid.binary() for oid in ids])
        assert client.contains(ids[-1])
        client.delete(ids)
        assert client.list() == {}
