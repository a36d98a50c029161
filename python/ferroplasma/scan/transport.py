"""How scan frames move: a byte stream with gather sends and scatter
receives.

A :class:`Transport` sends a list of buffers as one stream write without
joining them first, and receives the next bytes of the stream straight into
a list of buffers the caller placed (64-byte aligned, or inside a store
object). :class:`TcpTransport` does this with ``sendmsg``/``recvmsg_into``
(the kernel's ``writev``/``readv``): the column buffers go from the memory
DuckDB produced them in to the socket, and from the socket to their final
place, with no user-space copy on either side.

An RDMA transport (UCX or libfabric) fits the same two calls: ``send`` would
register the buffers and post one scatter-gather write, ``recv_into`` would
post the receiver's buffers; see docs/scan.md for the plan.
"""

from __future__ import annotations

import abc
import os
import socket
from collections.abc import Sequence
from typing import Any

__all__ = ["TcpTransport", "Transport", "parse_address", "tcp_connect"]

# Linux's IOV_MAX: at most this many buffers per sendmsg/recvmsg call.
_IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)


class Transport(abc.ABC):
    """A reliable, ordered byte stream with scatter-gather calls."""

    @abc.abstractmethod
    def send(self, parts: Sequence[Any]) -> None:
        """Sends every byte of ``parts`` (buffer-protocol objects), in order."""

    @abc.abstractmethod
    def recv_into(self, views: Sequence[memoryview]) -> None:
        """Fills each of ``views`` completely, in order, from the stream.
        Raises ConnectionError if the stream ends first."""

    @abc.abstractmethod
    def close(self) -> None:
        """Closes the connection (the peer sees the stream end)."""

    def recv_exact(self, n: int) -> bytearray:
        """The next ``n`` bytes of the stream."""
        out = bytearray(n)
        if n:
            self.recv_into([memoryview(out)])
        return out


def _byte_views(parts: Sequence[Any]) -> list[memoryview]:
    out = []
    for p in parts:
        mv = memoryview(p)
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        if mv.nbytes:
            out.append(mv)
    return out


class TcpTransport(Transport):
    """A :class:`Transport` over a connected TCP socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, parts: Sequence[Any]) -> None:
        views = _byte_views(parts)
        i = 0
        while i < len(views):
            batch = views[i : i + _IOV_MAX]
            sent = self.sock.sendmsg(batch)
            # Skip what went out: whole views, then part of the next one.
            for v in batch:
                if sent >= v.nbytes:
                    sent -= v.nbytes
                    i += 1
                else:
                    views[i] = v[sent:]
                    break

    def recv_into(self, views: Sequence[memoryview]) -> None:
        pending = _byte_views(views)
        i = 0
        while i < len(pending):
            batch = pending[i : i + _IOV_MAX]
            got = self.sock.recvmsg_into(batch)[0]
            if got == 0:
                raise ConnectionError("the peer closed the connection")
            for v in batch:
                if got >= v.nbytes:
                    got -= v.nbytes
                    i += 1
                else:
                    pending[i] = v[got:]
                    break

    def fileno(self) -> int:
        """The socket's descriptor (for the native data path, which sends
        and receives on it directly)."""
        return self.sock.fileno()

    def detach(self) -> int:
        """Gives up the socket: its descriptor, which the caller now owns."""
        return self.sock.detach()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (``"[v6]:port"`` for IPv6) as a (host, port) pair."""
    host, sep, port = address.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not host:
        raise ValueError(f"address {address!r} is not HOST:PORT (e.g. 127.0.0.1:7700)")
    if len(port) > 5 or int(port) > 65535:
        raise ValueError(f"address {address!r}: the port is not between 0 and 65535")
    return host.strip("[]"), int(port)


def tcp_connect(address: str, timeout: float | None) -> TcpTransport:
    """Connects to ``address`` (``"host:port"``)."""
    sock = socket.create_connection(parse_address(address), timeout=timeout)
    sock.settimeout(None)
    return TcpTransport(sock)
