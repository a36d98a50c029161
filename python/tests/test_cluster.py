"""Three real stores joined into a cluster over loopback, used from Python:
zero-copy arrays fetched from another member, cluster-wide queries, and
ObjectLost when a member dies."""

from __future__ import annotations

import contextlib
import time

import numpy as np
import pytest

import ferroplasma as fp
from conftest import eventually, member_address

TOKEN = "py-test-token"


@pytest.fixture
def cluster():
    # Each member binds a port the system picks (port 0) and says which; the
    # others join the first and learn the rest by gossip.
    common = {"cluster_token": TOKEN, "heartbeat_interval": "100ms", "peer_timeout": "2s"}
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(fp.start_store("64MiB", cluster_listen="127.0.0.1:0", **common))
        seed = member_address(first.connect())
        stores = [first] + [
            stack.enter_context(
                fp.start_store("64MiB", cluster_listen="127.0.0.1:0", join=seed, **common)
            )
            for _ in range(2)
        ]
        clients = [s.connect() for s in stores]
        for c in clients:
            eventually(
                lambda c=c: (
                    sum(m["health"] in ("this", "alive") for m in c.cluster_status()["members"])
                    == 3
                ),
                what="every member sees every other",
            )
        yield stores, clients, [member_address(c) for c in clients]


def test_an_array_put_on_one_member_is_a_zero_copy_view_on_another(cluster):
    _, (a, b, c), addrs = cluster
    arr = np.arange(1_000_000, dtype=np.float64)
    oid = a.put(arr)
    eventually(lambda: c.contains(oid, cluster=True), what="registered")
    assert not c.contains(oid)
    got = b.get(oid, timeout=10)
    np.testing.assert_array_equal(got, arr)
    assert not got.flags.writeable, "a view of the (immutable) shared memory"
    assert not got.flags.owndata
    assert b.cluster_status()["fetches"] == 1
    again = b.get(oid, timeout=10)
    np.testing.assert_array_equal(again, arr)
    assert b.cluster_status()["fetches"] == 1, "the second get is served locally"
    info = a.list(cluster=True)[oid]
    assert info["cached"] is False
    assert sorted(info["members"]) == sorted(addrs[:2])
    assert b.list()[oid]["cached"] is True
    # Ordinary Python objects travel too.
    oid2 = c.put({"k": [1, 2, 3]})
    assert a.get(oid2, timeout=10) == {"k": [1, 2, 3]}


def test_a_batch_from_two_members_costs_requests_per_member_not_per_object(cluster):
    """A list get of arrays held by two other members: every array arrives,
    with one lookup per other owner and one pull request per holder (each
    lookup also brings what its owner holds), not one per object."""
    _, (a, b, c), _ = cluster
    arrays = [np.full(100 + i, i, dtype=np.int32) for i in range(400)]
    oids = [(a if i % 2 else c).put(x) for i, x in enumerate(arrays)]
    eventually(lambda: all(b.contains(oids, cluster=True)), what="registered")
    before = b.cluster_status()
    got = b.get(oids, timeout=30)
    for x, y in zip(arrays, got):
        np.testing.assert_array_equal(x, y)
    after = b.cluster_status()
    assert after["fetches"] - before["fetches"] == 400
    assert after["lookups"] - before["lookups"] == 2, "one per other owner"
    assert 2 <= after["pulls"] - before["pulls"] <= 4, "per owner and holder"


def test_ids_are_unique_and_delete_is_cluster_wide(cluster):
    _, (a, b, c), _ = cluster
    oid = a.put(b"first")
    with pytest.raises(fp.ObjectExists):
        b.put(b"second", object_id=oid)
    assert c.get(oid, timeout=10) == b"first"
    assert c.delete(oid) == ["deleted"]
    assert not any(x.contains(oid, cluster=True) for x in (a, b, c))
    b.put(b"second", object_id=oid)
    assert a.get(oid, timeout=10) == b"second"


def test_objects_of_a_dead_member_raise_object_lost(cluster):
    stores, (a, b, c), _ = cluster
    mine = [c.put(np.full(1000, i)) for i in range(10)]
    others = [b.put(np.full(1000, i)) for i in range(10)]
    eventually(lambda: all(a.contains(mine, cluster=True)), what="registered")
    stores[2].process.kill()
    stores[2].process.wait()
    t0 = time.monotonic()
    for oid in mine:
        with pytest.raises(fp.ObjectLost):
            a.get(oid, timeout=30)
    assert time.monotonic() - t0 < 10, "detected in seconds, no 30 s hang"
    for i, oid in enumerate(others):
        np.testing.assert_array_equal(a.get(oid, timeout=10), np.full(1000, i))
    health = {m["address"]: m["health"] for m in a.cluster_status()["members"]}
    assert sorted(health.values()) == ["alive", "dead", "this"]


def test_a_lone_store_reports_no_cluster(client):
    assert client.cluster_status()["enabled"] is False
    oid = client.put(b"x")
    # cluster=True on a lone store answers for the store itself.
    assert client.contains(oid, cluster=True)
    assert client.list(cluster=True)[oid]["members"] == [""]


def test_a_member_with_another_token_shows_as_refused(cluster):
    _stores, clients, addrs = cluster
    with fp.start_store(
        "64MiB",
        cluster_listen="127.0.0.1:0",
        join=addrs[0],
        cluster_token="not-the-token",
        heartbeat_interval="100ms",
    ) as intruder:
        c = intruder.connect()

        def health_of_seed():
            members = c.cluster_status()["members"]
            return next(m["health"] for m in members if m["address"] == addrs[0])

        eventually(lambda: health_of_seed() == "refused", what="the seed to refuse the intruder")
        assert sum(m["health"] == "alive" for m in c.cluster_status()["members"]) == 0
        assert len(clients[0].cluster_status()["members"]) == 3


def test_debug_logs_follow_one_get_across_members(monkeypatch):
    """With FERROPLASMA_LOG=debug, the member a client asks logs the request
    in a span naming the client, the request and the object, through its
    lookup and pull; the member holding the object logs serving that
    object to it."""
    monkeypatch.setenv("FERROPLASMA_LOG", "ferroplasma_daemon=debug,ferroplasma_cluster=debug")
    common = {"cluster_token": TOKEN, "heartbeat_interval": "100ms", "peer_timeout": "2s"}
    with fp.start_store("32MiB", cluster_listen="127.0.0.1:0", **common) as a:
        seed = member_address(a.connect())
        with fp.start_store("32MiB", cluster_listen="127.0.0.1:0", join=seed, **common) as b:
            ca, cb = a.connect(), b.connect()
            eventually(
                lambda: sum(m["health"] == "alive" for m in cb.cluster_status()["members"]) == 1,
                what="b sees a",
            )
            oid = ca.put(b"followed")
            assert cb.get(oid, timeout=10) == b"followed"
            hexid = oid.binary().hex()
            with open(b.log_path) as f:
                asking = [line for line in f if f"ids={hexid}" in line and "op=get" in line]
            assert any("received" in line for line in asking), asking
            assert any("lookup: sealed" in line for line in asking), asking
            assert any("pulled" in line for line in asking), asking
            assert any("rid=" in line and "client=" in line for line in asking), asking
            with open(a.log_path) as f:
                holding = f.read()
            assert "pull: serving" in holding and hexid in holding, holding[-2000:]


def test_puts_without_an_id_use_ids_the_member_claimed_ahead(cluster):
    """``put`` without an id takes one the member handed out (claimed
    cluster-wide ahead); the pool shows in ``cluster_status``, and the
    objects are read on every member."""
    _, (a, b, c), _ = cluster
    oids = [a.put({"n": i}) for i in range(300)]
    assert len(set(oids)) == 300
    eventually(lambda: a.cluster_status()["ids_claimed_ahead"] > 0, what="the pool refilled")
    eventually(lambda: all(c.contains(oids, cluster=True)), what="registered")
    for i, oid in enumerate(oids[::50]):
        assert b.get(oid, timeout=10) == {"n": 50 * i}
    assert isinstance(c.new_id(), fp.ObjectID)
