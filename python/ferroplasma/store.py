"""Starting a store from Python (for notebooks, tests and scripts)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from .errors import StoreUnavailable

__all__ = ["StoreProcess", "start_store"]


class StoreProcess:
    """A store started by :func:`start_store`."""

    def __init__(self, socket: str, process: subprocess.Popen, log_path: str) -> None:
        self.socket = socket  #: the socket path to connect to
        self.process = process  #: the store's ``subprocess.Popen``
        self.log_path = log_path  #: where its log goes

    def connect(self):
        """A :class:`~ferroplasma.Client` connected to this store."""
        from .client import Client

        return Client(self.socket)

    def __repr__(self) -> str:
        return f"<ferroplasma store pid={self.process.pid} socket={self.socket!r}>"


def _flags(options: dict) -> list:
    args = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False or value is None:
            continue
        else:
            args += [flag, str(value)]
    return args


@contextlib.contextmanager
def start_store(
    memory: str = "1GiB",
    socket: str | None = None,
    timeout: float = 30.0,
    netns: str | None = None,
    **options: Any,
) -> Iterator[StoreProcess]:
    """Starts a store process and stops it when the block ends.

    ``memory`` accepts "512MiB", "4GiB" or bytes; ``socket`` defaults to a
    fresh temporary path; other keyword arguments become flags of
    ``ferroplasma store`` (``prefault=True`` → ``--prefault``,
    ``dir="/dev/shm"`` → ``--dir /dev/shm``). With ``netns``, the store
    runs in that network namespace (``ip netns exec``; root): a host of its
    own for cluster experiments on one machine. The store runs in a session
    of its own, so a Ctrl-C in the terminal interrupts the program, not the
    store under it; the store stops when the block ends, or when this
    program exits in any way (``--exit-with-parent``).

    >>> import ferroplasma as fp
    >>> with fp.start_store("256MiB") as store:        # doctest: +SKIP
    ...     client = store.connect()
    ...     oid = client.put([1, 2, 3])
    """
    tmp = tempfile.mkdtemp(prefix="ferroplasma-")
    if socket is None:
        socket = os.path.join(tmp, "store.sock")
    log_path = os.path.join(tmp, "store.log")
    args = ["ip", "netns", "exec", netns] if netns else []
    args += [sys.executable, "-m", "ferroplasma", "store", "--memory", str(memory)]
    args.append("--exit-with-parent")  # even if this program is killed
    args += ["--socket", socket, *_flags(options)]
    with open(log_path, "wb") as log:
        # A session of its own: Ctrl-C in a terminal interrupts this program,
        # which then stops the store as the block ends, instead of killing
        # the store under it.
        proc = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        _wait_ready(proc, socket, log_path, timeout)
        yield StoreProcess(socket, proc, log_path)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _wait_ready(proc: subprocess.Popen, socket: str, log_path: str, timeout: float) -> None:
    from . import _native

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            with open(log_path, "rb") as f:
                tail = f.read()[-2000:].decode(errors="replace")
            raise StoreUnavailable(f"the store exited with code {proc.returncode}:\n{tail}")
        try:
            _native.NativeClient(socket)
            return
        except StoreUnavailable as e:
            if time.monotonic() > deadline:
                proc.kill()
                raise StoreUnavailable(
                    f"the store did not answer on {socket} within {timeout} s"
                ) from e
            time.sleep(0.01)
