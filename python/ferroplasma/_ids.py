"""ObjectID: the 20-byte identifier of an object."""

from __future__ import annotations

import os

from .errors import InvalidRequest

__all__ = ["ObjectID"]

ID_LEN = 20


class ObjectID:
    """A 20-byte object id (Plasma-compatible).

    >>> oid = ObjectID.random()
    >>> len(oid.binary())
    20
    >>> ObjectID(oid.binary()) == oid
    True
    >>> ObjectID.from_hex(str(oid)) == oid
    True
    """

    __slots__ = ("_b",)

    def __init__(self, binary: bytes | bytearray | memoryview) -> None:
        b = bytes(binary)
        if len(b) != ID_LEN:
            raise InvalidRequest(f"an object id is {ID_LEN} bytes, got {len(b)}")
        self._b = b

    @classmethod
    def random(cls) -> ObjectID:
        """A random id (160 bits from the OS, unique in practice across hosts)."""
        return cls(os.urandom(ID_LEN))

    @classmethod
    def from_random(cls) -> ObjectID:
        """The same as :meth:`random` (the name pyarrow.plasma used)."""
        return cls.random()

    @classmethod
    def from_hex(cls, text: str) -> ObjectID:
        """Parses 40 hex characters."""
        try:
            return cls(bytes.fromhex(text))
        except ValueError as e:
            raise InvalidRequest(f"not a 40-character hex object id: {text!r}") from e

    def binary(self) -> bytes:
        """The 20 raw bytes."""
        return self._b

    def hex(self) -> str:
        """Lower-case hex, 40 characters."""
        return self._b.hex()

    def __str__(self) -> str:
        return self._b.hex()

    def __repr__(self) -> str:
        return f"ObjectID({self._b.hex()})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectID) and other._b == self._b

    def __hash__(self) -> int:
        return hash(self._b)

    def __reduce__(self):  # picklable
        return (ObjectID, (self._b,))


def as_bytes(oid: ObjectID | bytes) -> bytes:
    """The raw id of an ObjectID or of 20 bytes."""
    if isinstance(oid, ObjectID):
        return oid._b
    if isinstance(oid, (bytes, bytearray, memoryview)) and len(oid) == ID_LEN:
        return bytes(oid)
    raise InvalidRequest(f"expected an ObjectID or {ID_LEN} bytes, got {oid!r}")
