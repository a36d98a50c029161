"""The trust boundaries as a Python user meets them (docs/security.md): a
store run by another user is refused before anything is sent, unless
trusted; another user a store allows reads, but cannot put, create, delete
or evict. The tests that need a second user run as root."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time

import numpy as np
import pytest

import ferroplasma as fp

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user")


def _as_nobody(work) -> int:
    """Forks; the child becomes uid/gid 65534 (this interpreter and its
    modules are already loaded: the other user cannot read root's Python)
    and runs ``work()``, whose return value is its exit status. Returns the
    child's pid."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            code = work()
        except BaseException as e:  # the parent reads the status
            print(f"child failed: {e!r}", file=sys.stderr, flush=True)
        finally:
            os._exit(code)
    return pid


def _status(pid: int, timeout: float = 60) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    return None


@needs_root
def test_a_store_of_another_user_is_refused_with_its_owner_named():
    from ferroplasma import _native

    # Not under pytest's tmp_path, whose parent only root may enter.
    tmp = tempfile.mkdtemp(prefix="fp-squat-")
    os.chmod(tmp, 0o777)
    sock = os.path.join(tmp, "s.sock")
    squatter = _as_nobody(
        lambda: _native.run_cli(["ferroplasma", "store", "-m", "16MiB", "-s", sock])
    )
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(sock):
            assert time.monotonic() < deadline, "the other user's store did not start"
            assert os.waitpid(squatter, os.WNOHANG)[0] == 0, "the other user's store exited"
            time.sleep(0.05)
        with pytest.raises(fp.PermissionDenied) as refused:
            fp.connect(sock)
        assert isinstance(refused.value, PermissionError)
        assert f"uid {NOBODY}" in str(refused.value)
        assert f"FERROPLASMA_TRUST_UID={NOBODY}" in str(refused.value)
        trusted = fp.connect(sock, trust_uid=NOBODY)
        assert trusted.get(trusted.put([1, 2, 3])) == [1, 2, 3]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(squatter, signal.SIGTERM)
        _status(squatter)
        shutil.rmtree(tmp, ignore_errors=True)


@needs_root
def test_another_allowed_user_reads_but_cannot_put_delete_or_evict():
    with fp.start_store("64MiB", socket_mode="666", allow_uid="0,65534") as store:
        os.chmod(os.path.dirname(store.socket), 0o755)
        c = store.connect()
        assert not c.read_only
        owner = c.put(np.arange(100_000))

        def reader() -> int:
            r = fp.connect(store.socket)
            assert r.read_only
            assert (r.get(owner) == np.arange(100_000)).all()
            attempts = [
                lambda: r.put(np.ones(10)),
                lambda: r.put(np.ones(500_000)),
                lambda: r.create(fp.ObjectID.random(), 1000),
                lambda: r.delete([owner]),
                lambda: r.evict(1 << 30),
            ]
            for attempt in attempts:
                with pytest.raises(fp.PermissionDenied):
                    attempt()
            return 0

        assert _status(_as_nobody(reader)) == 0
        assert (c.get(owner) == np.arange(100_000)).all()
        assert c.stats()["objects"] == 1
