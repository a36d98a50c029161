"""The scan protocol's frames (version 1).

Every frame is a 16-byte head, a JSON object of control fields, and a body
of raw bytes (little-endian)::

    offset  size  field
    0       1     kind (below)
    1       3     reserved (0)
    4       4     length of the JSON fields (at most 1 MiB)
    8       8     length of the body
    16      ...   JSON fields, then the body

Client to server (no body):

    HELLO      {"version", "token"}              first frame of a connection
    INIT_SCAN  {"sql", "dataset", "batch_rows", "materialize", "wire",
                "store_probe"}                    -> SCAN or ERROR
    ITERATE    {"scan", "batches", "bytes"}      -> up to that many BATCH (or
                                                    IDS) frames, fewer once
                                                    "bytes" went out; then DONE
    FINALIZE   {"scan"}                          -> FINALIZED
    STATUS     {}                                -> STATUS_REPLY

Server to client:

    READY        {"version"}                     the HELLO was accepted
    SCAN         {"scan", "via_store"}           body: the Arrow IPC schema
    BATCH        {"scan", "rows", "desc"}        body: every buffer the
                                                  descriptor lists, back to back
    BATCH_IPC    {"scan"}                        body: one Arrow IPC message
                                                  (the serializing baseline)
    IDS          {"scan", "id", "rows"}          the batch is in the store
    DONE         {"scan", "more"}                end of an ITERATE's answer
    FINALIZED    {"scan"}
    STATUS_REPLY {"scans", "connections", "unauthenticated",
                  "batches_sent", "bytes_sent", "store_batches"}
    ERROR        {"code", "message"}             code: auth, query, dataset,
                                                  access, scan, protocol,
                                                  busy (a connection cap)

A HELLO's fields are at most 64 KiB. A field of the wrong JSON type is
answered with ERROR (code protocol) like any other malformed request.

The descriptor (``desc``) is :mod:`ferroplasma.arrow_layout`'s.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any

from ..errors import ProtocolError
from .transport import Transport

VERSION = 1
HEAD = struct.Struct("<B3xIQ")
MAX_FIELDS = 1 << 20
MAX_HELLO_FIELDS = 1 << 16

HELLO, INIT_SCAN, ITERATE, FINALIZE, STATUS = 1, 2, 3, 4, 5
READY, SCAN, BATCH, BATCH_IPC, IDS, DONE, FINALIZED, STATUS_REPLY = 16, 17, 18, 19, 20, 21, 22, 23
ERROR = 31

NAMES = {
    HELLO: "HELLO",
    INIT_SCAN: "INIT_SCAN",
    ITERATE: "ITERATE",
    FINALIZE: "FINALIZE",
    STATUS: "STATUS",
    READY: "READY",
    SCAN: "SCAN",
    BATCH: "BATCH",
    BATCH_IPC: "BATCH_IPC",
    IDS: "IDS",
    DONE: "DONE",
    FINALIZED: "FINALIZED",
    STATUS_REPLY: "STATUS_REPLY",
    ERROR: "ERROR",
}


def frame(kind: int, fields: dict[str, Any], body_len: int = 0) -> bytes:
    """A frame's head and fields, ready to send (its body follows them)."""
    raw = json.dumps(fields, separators=(",", ":")).encode()
    return HEAD.pack(kind, len(raw), body_len) + raw


def send(t: Transport, kind: int, fields: dict[str, Any], body: Sequence[Any] = ()) -> None:
    """Sends one frame; ``body`` is a list of buffers sent as they are."""
    body_len = sum(memoryview(b).nbytes for b in body)
    t.send([frame(kind, fields, body_len), *body])


def parse_head(head: bytes | bytearray) -> tuple[int, int, int]:
    """A frame's 16-byte head: (kind, length of the fields, length of the
    body). Raises ProtocolError for an unknown kind or oversized fields."""
    kind, flen, blen = HEAD.unpack(head)
    if kind not in NAMES:
        raise ProtocolError(f"unknown scan frame kind {kind}")
    if flen > MAX_FIELDS:
        raise ProtocolError(f"scan frame fields of {flen} bytes (limit {MAX_FIELDS})")
    return kind, flen, blen


def parse_fields(raw: bytes | bytearray) -> dict[str, Any]:
    """A frame's JSON fields. Raises ProtocolError for anything but a JSON
    object (nesting too deep for the parser included)."""
    try:
        fields = json.loads(raw) if raw else {}
    except (ValueError, RecursionError) as e:
        raise ProtocolError(f"scan frame fields are not JSON: {e}") from None
    if not isinstance(fields, dict):
        raise ProtocolError("scan frame fields are not a JSON object")
    return fields


def recv(t: Transport) -> tuple[int, dict[str, Any], int]:
    """Receives a frame's head and fields: (kind, fields, body length). The
    caller then receives the body (with ``t.recv_into``) or skips it."""
    kind, flen, blen = parse_head(t.recv_exact(HEAD.size))
    return kind, parse_fields(t.recv_exact(flen)), blen


def skip(t: Transport, n: int) -> None:
    """Reads and drops ``n`` body bytes."""
    scratch = memoryview(bytearray(min(n, 1 << 20)))
    while n:
        k = min(n, scratch.nbytes)
        t.recv_into([scratch[:k]])
        n -= k
