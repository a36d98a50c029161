"""One query's result on the scan server, batch by batch: produced by the
native source (buffers over TCP), or here in Python (the serializing
baseline, UCX, or batches placed in the local store for a client that
shares it)."""

from __future__ import annotations

import collections
import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

from .. import arrow_layout, serialization
from .._ids import ObjectID
from ..errors import FerroplasmaError

__all__ = ["Scan", "Stored", "batch_ids"]


class Stored:
    """A batch the server placed in the local store."""

    __slots__ = ("id", "nbytes", "rows")

    def __init__(self, oid: ObjectID, rows: int, nbytes: int) -> None:
        self.id, self.rows, self.nbytes = oid, rows, nbytes


class Scan:
    """One query's result, batch by batch.

    Buffers to a remote client (the default) go through the native source:
    a thread reads DuckDB's result one batch ahead while the previous batch
    is sent, and each ITERATE's batches are sent from Rust, gathered
    straight from DuckDB's memory into the socket. The serializing baseline
    (``wire="ipc"``) and batches placed in the local store (``store``) are
    produced here, one at a time. ``materialize`` runs the query to the end
    first (placing every batch in the store, when it goes there)."""

    def __init__(
        self,
        con: Any,
        rel: Any,
        batch_rows: int,
        materialize: bool,
        wire: str,
        store: Any,
        ids: Any = None,
        native: bool = True,
    ) -> None:
        self.con = con
        self._ids = ids  # the ids of the batches placed in the store, in order
        self.wire = wire
        self.store = store
        self.native: Any = None
        self._reader = rel.to_arrow_reader(batch_rows)
        self.schema = self._reader.schema
        self._ready: collections.deque = collections.deque()
        # Batches placed in the store and announced to the client: deleted
        # again unless the client finalizes the scan (it may have died).
        self.sent_ids: list[ObjectID] = []
        if store is None and wire == "buffers" and native:
            from .._native import NativeScanSource

            self.native = NativeScanSource(self._reader, bool(materialize))
            self._reader = None
        elif materialize:
            try:
                while (item := self._produce()) is not None:
                    self._ready.append(item)
            except BaseException:
                for item in self._ready:  # placed, never to be sent
                    with contextlib.suppress(FerroplasmaError):
                        store.abort(item.id)
                raise
            self._reader = None

    @property
    def via_store(self) -> bool:
        return self.store is not None

    def _produce(self) -> Any:
        if self._reader is None:
            return None
        try:
            batch = self._reader.read_next_batch()
        except StopIteration:
            return None
        if self.store is None:
            return batch
        oid, nbytes = put_batch(self.store, batch, next(self._ids))
        return Stored(oid, batch.num_rows, nbytes)

    def next(self) -> Any:
        """The next batch (or _Stored), or None at the end."""
        return self._ready.popleft() if self._ready else self._produce()

    def announce(self, item: Stored) -> None:
        """Seals a batch placed in the store, about to be sent as an id. It
        stays unsealed until then, so that the store discards it should this
        server die first."""
        serialization.seal_batch_object(self.store, item.id)
        self.sent_ids.append(item.id)

    def interrupt(self) -> None:
        """Stops DuckDB's query, from any thread (it then fails the batch
        being produced)."""
        with contextlib.suppress(Exception):
            self.con.interrupt()

    def close(self, finalized: bool) -> None:
        """Ends the scan. Batches placed in the store and never sent are
        discarded; those sent too, unless the client ``finalized`` the scan
        (a client that went away midway would leave them with no owner, so a
        scan that fails deletes even those its client already received)."""
        if self.native is not None:
            # A query still running (a long sort) stops at once; then the
            # producer is joined before DuckDB goes.
            self.interrupt()
            self.native.close()
        unsent = [item.id for item in self._ready if isinstance(item, Stored)]
        self._ready.clear()
        for oid in unsent:
            with contextlib.suppress(FerroplasmaError):
                self.store.abort(oid)
        if not finalized and self.sent_ids:
            with contextlib.suppress(FerroplasmaError):
                self.store.delete(self.sent_ids)
        self.sent_ids = []
        self._reader = None
        self.con.close()


def batch_ids(probe: ObjectID) -> Iterator[ObjectID]:
    """The ids of a scan's batches placed in the store, in order: the first
    12 bytes of the client's probe id (random, known to the client and this
    server only), then the batch's number from 1. The client can so name a
    batch whose id it never received (lost with a server that died), and
    delete it."""
    prefix = probe.binary()[:12]
    for seq in itertools.count(1):
        yield ObjectID(prefix + seq.to_bytes(8, "big"))


def put_batch(client: Any, batch: Any, oid: ObjectID) -> tuple[ObjectID, int]:
    """Writes ``batch`` into the store as a kind-3 object ``oid`` (one copy,
    from DuckDB's memory into shared memory), left unsealed until it is
    sent."""
    desc, bufs = arrow_layout.flatten(batch)

    def copy(views: list[memoryview]) -> None:
        for view, b in zip(views, bufs):
            view[:] = memoryview(b).cast("B")

    schema = batch.schema.serialize().to_pybytes()
    return serialization.put_batch_object(
        client, schema, batch.num_rows, desc, copy, seal=False, oid=oid
    )
