"""The exceptions ferroplasma raises.

Every error derives from :class:`FerroplasmaError` and also from the builtin
it resembles, so ``except KeyError`` catches a missing object and
``except MemoryError`` a full store.
"""

from __future__ import annotations

__all__ = [
    "AccessDenied",
    "ClusterUnavailable",
    "DatasetNotFound",
    "Disconnected",
    "FerroplasmaError",
    "ForkedClient",
    "InvalidObjectState",
    "InvalidRequest",
    "JobError",
    "MalformedRecord",
    "MissingDependency",
    "ObjectExists",
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
    "StoreUnavailable",
    "TooManyWaiting",
]


class FerroplasmaError(Exception):
    """Base class of every ferroplasma error."""


class ObjectExists(FerroplasmaError, FileExistsError):
    """An object with this id already exists (sealed, or being created)."""


class ObjectNotFound(FerroplasmaError, KeyError):
    """No object has this id."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class StoreFull(FerroplasmaError, MemoryError):
    """The object does not fit, even after evicting every unused object."""


class StoreUnavailable(FerroplasmaError, ConnectionError):
    """No store answers on the socket: start one (``ferroplasma store``)."""


class Disconnected(StoreUnavailable):
    """The connection to the store broke (the store stopped or died); a
    StoreUnavailable, so one ``except StoreUnavailable`` covers both."""


class StoreBusy(StoreUnavailable):
    """The store serves its maximum of clients (``--max-clients``) and refused
    this connection: retry when some have disconnected, or start the store
    with more. A StoreUnavailable, so one ``except StoreUnavailable`` covers
    it (and ``plasma.connect`` retries it, as Plasma did)."""


class InvalidObjectState(FerroplasmaError, RuntimeError):
    """Seal or abort of an object that is sealed or that another client created."""


class ObjectTooLarge(FerroplasmaError, ValueError):
    """A size or count over the store's limits."""


class TooManyWaiting(FerroplasmaError, RuntimeError):
    """This connection already has as many gets waiting (4,096) or creates
    waiting for space, or waits for as many objects (1,000,000), as the store
    allows: wait for some to finish, or use another connection."""


class InvalidRequest(FerroplasmaError, ValueError):
    """A malformed argument, such as an id that is not 20 bytes."""


class ProtocolError(FerroplasmaError, RuntimeError):
    """Client and store disagree about the protocol (e.g. different versions)."""


class ObjectNotHeld(FerroplasmaError, ValueError):
    """Release of an object this client holds no reference to."""


class ForkedClient(FerroplasmaError, RuntimeError):
    """A client was used in a child process after fork(): connect a new one."""


class MissingDependency(FerroplasmaError, ImportError):
    """An optional package a feature needs is not installed; the message
    says what to install (``pip install '.[jobs]'`` in a checkout, or the
    packages by name)."""


class ObjectLost(FerroplasmaError, LookupError):
    """Every copy of the object was on a host that is gone (cluster mode)."""


class PermissionDenied(FerroplasmaError, PermissionError):
    """Not allowed: the store is run by a user this client does not trust
    (``trust_uid=`` or ``$FERROPLASMA_TRUST_UID`` names one to trust), or
    this client's user may only read the store (docs/security.md)."""


class ClusterUnavailable(FerroplasmaError, ConnectionError):
    """A cluster member the request needed did not answer; retry shortly."""


class SerializationError(FerroplasmaError, ValueError):
    """The object's bytes are not in ferroplasma's serialization format."""


class ScanError(FerroplasmaError):
    """Base class of the errors a scan server (``ferroplasma.scan``) reports."""


class QueryError(ScanError, ValueError):
    """The SQL is not one SELECT statement, or DuckDB rejected or failed it
    (the message is DuckDB's)."""


class DatasetNotFound(ScanError, FileNotFoundError):
    """No dataset with this name under the scan server's root."""


class AccessDenied(ScanError, PermissionError):
    """A dataset path outside the server's root, or a wrong token."""


class ScanServerUnavailable(ScanError, ConnectionError):
    """No scan server answers at the address, or the connection broke."""


class JobError(FerroplasmaError):
    """Base class of the errors of ``ferroplasma.jobs`` (sorts run on the store):
    bad arguments, missing inputs, or a worker that failed."""


class MalformedRecord(JobError, ValueError):
    """An input line of a record sort is not a record (8-byte key, TAB, 90
    bytes, LF). ``path`` and ``line`` (1-based) say where."""

    def __init__(self, message: str, path: str = "", line: int = 0) -> None:
        super().__init__(message)
        self.path = path
        self.line = line

    def __reduce__(self):
        return (type(self), (self.args[0], self.path, self.line))
