"""Several hosts on one machine, for trying and testing jobs across hosts:
stores joined into one cluster, a Dask scheduler, and one Dask worker per
store (each talking to the store of its own host), all real processes.

Over loopback (any user), or with each host in a network namespace of its
own and the scheduler in another (root and iproute2): then every byte
between hosts crosses a virtual link, and :meth:`Hosts.bytes_sent` counts
them, as Ray's ``cluster_utils.Cluster`` does for Ray::

    from ferroplasma.jobs.hosts import Hosts

    with Hosts(3, memory="512MiB", netns=True) as hosts:
        summary = records.sort_records(src, out, workers=hosts.dask,
                                       socket=hosts.stores[0].socket)
        print(hosts.bytes_sent())

The driver (this process) stays in the machine's own namespace and reaches
the scheduler and the stores' Unix sockets from there.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

from .. import start_store
from ..errors import StoreUnavailable

_QUIET = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
TOKEN = "ferroplasma-hosts"


def can_use_netns() -> bool:
    """Whether network namespaces can be made here (root, iproute2)."""
    return os.geteuid() == 0 and shutil.which("ip") is not None


def _free_subnet() -> int:
    """An X such that no interface here has an address in 10.77.X.0/24."""
    shown = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    taken = {int(x) for x in re.findall(r"inet 10\.77\.(\d+)\.", shown)}
    start = os.getpid() % 250
    for k in range(250):
        x = (start + k) % 250 + 1
        if x not in taken:
            return x
    raise RuntimeError("every 10.77.X.0/24 network is in use here")


class Network:
    """A bridge in this namespace and one network namespace per name, each
    linked to the bridge by a veth pair, with addresses 10.77.S.1, .2, …
    (S from this process id); the bridge itself is 10.77.S.254."""

    def __init__(self, names: list[str]) -> None:
        tag = uuid.uuid4().hex[:5]
        self.bridge = f"fpb{tag}"
        subnet = _free_subnet()
        self.ips = [f"10.77.{subnet}.{i + 1}" for i in range(len(names))]
        self.namespaces = [f"fp{tag}-{n}" for n in names]
        self.peers = [f"fpp{tag}{i}" for i in range(len(names))]
        steps = [
            f"ip link add {self.bridge} type bridge",
            f"ip addr add 10.77.{subnet}.254/24 dev {self.bridge}",
            f"ip link set {self.bridge} up",
        ]
        for ns, ip, peer in zip(self.namespaces, self.ips, self.peers):
            inner = f"fph{tag}{peer[-1]}"
            steps += [
                f"ip netns add {ns}",
                f"ip link add {inner} type veth peer name {peer}",
                f"ip link set {inner} netns {ns}",
                f"ip link set {peer} master {self.bridge} up",
                f"ip -n {ns} addr add {ip}/24 dev {inner}",
                f"ip -n {ns} link set {inner} up",
                f"ip -n {ns} link set lo up",
            ]
        try:
            for step in steps:
                subprocess.run(step.split(), check=True, capture_output=True, text=True)
        except subprocess.CalledProcessError as e:
            self.close()
            raise RuntimeError(f"cannot make the network ({e.cmd}): {e.stderr.strip()}") from e

    def prefix(self, i: int) -> list[str]:
        """The command prefix that runs a program in namespace ``i``."""
        return ["ip", "netns", "exec", self.namespaces[i]]

    def sent(self, i: int) -> int:
        """Bytes namespace ``i`` has sent to the bridge so far."""
        with open(f"/sys/class/net/{self.peers[i]}/statistics/rx_bytes") as f:
            return int(f.read())

    def close(self) -> None:
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], **_QUIET, check=False)
        subprocess.run(["ip", "link", "del", self.bridge], **_QUIET, check=False)


def _die_with_parent() -> None:
    """In a child before it runs its program: the kernel kills it when the
    process that started it dies (Linux), so that a driver killed mid-run
    leaves no workers or scheduler behind. (The kernel's "parent" is the
    starting thread: make :class:`Hosts` in a thread that outlives them.)"""
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))


def start_scheduler(
    stack: contextlib.ExitStack, host: str = "127.0.0.1", prefix: list[str] | None = None
) -> str:
    """A Dask scheduler on ``host`` (a port the system picks); its address."""
    tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="fp-dask-"))
    path = os.path.join(tmp, "scheduler.json")
    proc = subprocess.Popen(
        [
            *(prefix or []),
            sys.executable,
            "-m",
            "distributed.cli.dask_scheduler",
            "--host",
            host,
            "--port",
            "0",
            "--dashboard-address",
            ":0",
            "--scheduler-file",
            path,
        ],
        preexec_fn=_die_with_parent,
        **_QUIET,
    )
    stack.callback(_stop, proc)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the Dask scheduler exited with code {proc.returncode}")
        with contextlib.suppress(OSError, ValueError):
            with open(path) as f:
                return str(json.load(f)["address"])
        time.sleep(0.05)
    raise RuntimeError("the Dask scheduler did not start within 60 s")


def start_worker(
    stack: contextlib.ExitStack,
    address: str,
    socket: str,
    *,
    name: str,
    nthreads: int = 1,
    host: str | None = None,
    prefix: list[str] | None = None,
    mount: tuple[str, str] | None = None,
) -> subprocess.Popen:
    """A Dask worker whose tasks use the store at ``socket``. With ``mount``
    (source, target; root), the worker sees directory ``source`` at
    ``target``, and no other process does: a disk of its host's own."""
    bind = []
    if mount:
        bind = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
        bind += ['mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh", *mount]
    proc = subprocess.Popen(
        [
            *(prefix or []),
            *bind,
            sys.executable,
            "-m",
            "distributed.cli.dask_worker",
            address,
            "--nthreads",
            str(nthreads),
            "--name",
            name,
            "--no-nanny",
            "--dashboard-address",
            ":0",
            *(["--host", host] if host else []),
        ],
        env=dict(os.environ, FERROPLASMA_SOCKET=socket),
        preexec_fn=_die_with_parent,
        **_QUIET,
    )
    stack.callback(_stop, proc)
    return proc


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
    p.wait()


class Hosts:
    """``n`` hosts: a store each (one cluster), a Dask worker each, a
    scheduler, and a Dask client of it (:attr:`dask`). A context manager:
    everything stops, and the namespaces go, when the block ends."""

    def __init__(
        self,
        n: int = 3,
        memory: str = "256MiB",
        *,
        netns: bool = False,
        nthreads: int = 1,
        heartbeat_interval: str = "100ms",
        peer_timeout: str = "2s",
        local_dirs: list[str] | None = None,
        local_path: str | None = None,
    ) -> None:
        """With ``local_dirs`` and ``local_path`` (root): host ``i``'s worker
        sees ``local_dirs[i]`` at ``local_path``, as if each host had a
        disk of its own mounted there."""
        import distributed

        self._stack = contextlib.ExitStack()
        try:
            self.net = None
            if netns:
                self.net = Network([str(i) for i in range(n)] + ["s"])
                self._stack.callback(self.net.close)
            ips = self.net.ips if self.net else ["127.0.0.1"] * (n + 1)
            common = {
                "cluster_token": TOKEN,
                "heartbeat_interval": heartbeat_interval,
                "peer_timeout": peer_timeout,
            }
            self.stores = []
            seed = None
            for i in range(n):
                store = self._stack.enter_context(
                    start_store(
                        memory,
                        netns=self.net.namespaces[i] if self.net else None,
                        cluster_listen=f"{ips[i]}:0",
                        join=seed,
                        **common,
                    )
                )
                self.stores.append(store)
                if seed is None:
                    seed = _member_address(store.connect())
            self.clients = [s.connect() for s in self.stores]
            self.members = [_member_address(c) for c in self.clients]
            _wait_joined(self.clients)
            self.address = start_scheduler(
                self._stack, ips[n], self.net.prefix(n) if self.net else None
            )
            self.workers = [
                start_worker(
                    self._stack,
                    self.address,
                    store.socket,
                    name=f"host{i}",
                    nthreads=nthreads,
                    host=ips[i] if self.net else None,
                    prefix=self.net.prefix(i) if self.net else None,
                    mount=(local_dirs[i], local_path) if local_dirs and local_path else None,
                )
                for i, store in enumerate(self.stores)
            ]
            self.dask = self._stack.enter_context(distributed.Client(self.address, timeout=60))
            self.dask.wait_for_workers(n, timeout=60)
        except BaseException:
            self._stack.close()
            raise

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._stack.close()

    def kill(self, i: int) -> None:
        """Kills host ``i`` whole: its store and its Dask worker."""
        self.stores[i].process.kill()
        self.workers[i].kill()

    def objects_left(self, alive: list[int]) -> list[int]:
        """Objects in each store of ``alive``."""
        return [self.clients[i].stats()["objects"] for i in alive]

    def bytes_sent(self) -> int:
        """Bytes the hosts (the scheduler's included) have sent over their
        links so far: what crossed between hosts (network namespaces
        only)."""
        if self.net is None:
            raise ValueError("bytes_sent counts only with netns=True")
        return sum(self.net.sent(i) for i in range(len(self.net.namespaces)))


def _member_address(client: Any) -> str:
    [me] = [m for m in client.cluster_status()["members"] if m["health"] == "this"]
    return str(me["address"])


def _wait_joined(clients: list[Any], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    n = len(clients)
    while True:
        seen = [
            sum(m["health"] in ("this", "alive") for m in c.cluster_status()["members"])
            for c in clients
        ]
        if all(s == n for s in seen):
            return
        if time.monotonic() > deadline:
            raise StoreUnavailable(f"the stores did not all join one cluster: {seen}")
        time.sleep(0.02)
