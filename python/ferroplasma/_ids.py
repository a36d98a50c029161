"""ObjectID: the 20-byte identifier of an object."""

from __future__ import annotations

import os

from .errors import InvalidRequest

__all__ = ["ObjectID"]

ID_LEN = 20


class ObjectID:
    """A 20-byte object id (Plasma-compatible). Made from 20 bytes, or from
    the 40 hex digits ``str(oid)`` prints.

    >>> oid = ObjectID.random()
    >>> len(oid.binary())
    20
    >>> ObjectID(oid.binary()) == oid
    True
    >>> ObjectID(str(oid)) == oid
    True
    """

    __slots__ = ("_b",)

    def __init__(self, binary: bytes | bytearray | memoryview | str) -> None:
        if isinstance(binary, str):
            self._b = _from_hex(binary)
            return
        if not isinstance(binary, (bytes, bytearray, memoryview)):
            raise TypeError(
                f"an object id is made from {ID_LEN} bytes or {2 * ID_LEN} hex digits, "
                f"not {type(binary).__name__}"
            )
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
        return cls(_from_hex(text))

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
        return (type(self), (self._b,))


def _from_hex(text: str) -> bytes:
    try:
        b = bytes.fromhex(text)
    except ValueError:
        b = b""
    if len(b) != ID_LEN:
        raise InvalidRequest(
            f"not an object id: {text!r} (an id is {ID_LEN} bytes, or the "
            f"{2 * ID_LEN} hex digits str(oid) prints)"
        )
    return b


def as_bytes(oid: ObjectID | bytes | str) -> bytes:
    """The raw id of an ObjectID, of 20 bytes or of 40 hex digits."""
    if isinstance(oid, ObjectID):
        return oid._b
    if isinstance(oid, (bytes, bytearray, memoryview)) and len(oid) == ID_LEN:
        return bytes(oid)
    if isinstance(oid, str):
        return _from_hex(oid)
    raise InvalidRequest(
        f"expected an ObjectID, {ID_LEN} bytes or {2 * ID_LEN} hex digits, got {oid!r}"
    )
