"""ferroplasma: a shared-memory object store for immutable data.

Put an object once; read it from any process on the host without copying::

    import ferroplasma as fp
    import numpy as np

    client = fp.connect()                  # $FERROPLASMA_SOCKET or /tmp/ferroplasma.sock
    oid = client.put(np.arange(1_000_000))
    arr = client.get(oid)                  # in any process: a read-only view of shared memory

Start a store with ``ferroplasma store`` (or ``fp.start_store()`` from Python).
"""

from __future__ import annotations

from typing import Any

from . import errors, scan, serialization
from ._ids import ObjectID
from .client import Client, Event, NotAvailable, Subscription, connect, default_client
from .errors import (
    AccessDenied,
    ClusterUnavailable,
    DatasetNotFound,
    Disconnected,
    FerroplasmaError,
    ForkedClient,
    InvalidObjectState,
    InvalidRequest,
    JobError,
    MalformedRecord,
    MissingDependency,
    ObjectExists,
    ObjectLost,
    ObjectNotFound,
    ObjectNotHeld,
    ObjectTooLarge,
    PermissionDenied,
    ProtocolError,
    QueryError,
    ScanError,
    ScanServerUnavailable,
    SerializationError,
    StoreBusy,
    StoreFull,
    StoreUnavailable,
    TooManyWaiting,
)
from .store import StoreProcess, start_store

__all__ = [
    "AccessDenied",
    "Client",
    "ClusterUnavailable",
    "DatasetNotFound",
    "Disconnected",
    "Event",
    "FerroplasmaError",
    "ForkedClient",
    "InvalidObjectState",
    "InvalidRequest",
    "JobError",
    "MalformedRecord",
    "MissingDependency",
    "NotAvailable",
    "ObjectExists",
    "ObjectID",
    "ObjectLost",
    "ObjectNotFound",
    "ObjectNotHeld",
    "ObjectTooLarge",
    "PermissionDenied",
    "ProtocolError",
    "QueryError",
    "ScanError",
    "ScanServerUnavailable",
    "SerializationError",
    "StoreBusy",
    "StoreFull",
    "StoreProcess",
    "StoreUnavailable",
    "Subscription",
    "TooManyWaiting",
    "connect",
    "errors",
    "get",
    "jobs",
    "put",
    "scan",
    "serialization",
    "start_store",
]

__version__ = "0.1.0"


def put(obj: Any, object_id: ObjectID | None = None) -> ObjectID:
    """``put`` on the default client (connected on first use, and again
    after a fork)."""
    return default_client().put(obj, object_id)


def get(object_id: Any, timeout: float | None = None, *, bytes_as_view: bool = False) -> Any:
    """``get`` on the default client."""
    return default_client().get(object_id, timeout, bytes_as_view=bytes_as_view)


def __getattr__(name: str) -> Any:
    # fp.jobs imports numpy and pandas: only when first used.
    if name == "jobs":
        import importlib

        return importlib.import_module(".jobs", __name__)
    raise AttributeError(f"module 'ferroplasma' has no attribute {name!r}")
