"""``ferroplasma scan-server``: the scan server from the command line.

Bad values end without a traceback, with exit status 2: a flag of the wrong
form is a usage error (argparse's), and a listen address, root or token file
that cannot be used is one line on stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

from ..client import default_socket
from . import engine
from .server import ScanServer

DESCRIPTION = """\
Serve the datasets under --root to ferroplasma scan clients (fp.scan.connect).

A dataset is a Parquet, CSV or JSON file, or a directory of them, named by its
path relative to the root; clients query it with SQL as the view `dataset`:

    ferroplasma scan-server --listen 0.0.0.0:7700 --root /data --token-file /etc/scan.token
    # client:  fp.scan.connect("host:7700", token=...).query("SELECT a FROM dataset", "t.parquet")

Each query runs in its own DuckDB database that can read only its dataset and
accepts one SELECT statement. Batches travel as their Arrow buffers, gathered
straight from DuckDB's memory (docs/scan.md). A client on this host with the
same store gets its batches placed in the store (only ids travel).

Give the token in a file (--token-file) or in $FERROPLASMA_SCAN_TOKEN, not with
--token: every local user can read a command line (ps, /proc/PID/cmdline).
Listening beyond loopback without a token logs a warning. A connection must
send its HELLO (with the token) within 3 s; at most 64 connections may be
waiting to, and at most --max-connections be open; beyond a cap a connection
is closed at once. Refused connections are logged at most once per reason
every 10 s, with a count of those not logged.
"""

#: A token file longer than this is not a token.
MAX_TOKEN_FILE = 1 << 16


def _whole(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from ``lo`` to ``hi``."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < lo or (hi is not None and n > hi):
            bounds = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
            raise argparse.ArgumentTypeError(f"{n} is not {bounds}")
        return n

    return parse


def read_token_file(path: str) -> str:
    """The token in the file ``path``, its trailing newline stripped.
    Raises ValueError (a one-line message) for a file that cannot be read,
    is not UTF-8 text, is empty or is too long to be a token."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TOKEN_FILE + 1)
    except OSError as e:
        raise ValueError(f"--token-file {path!r}: {e.strerror or e}") from None
    if len(raw) > MAX_TOKEN_FILE:
        raise ValueError(f"--token-file {path!r} is over {MAX_TOKEN_FILE} bytes: not a token")
    try:
        token = raw.decode().rstrip("\r\n")
    except UnicodeDecodeError:
        raise ValueError(f"--token-file {path!r} is not UTF-8 text") from None
    if not token:
        raise ValueError(f"--token-file {path!r} is empty")
    return token


def _token(flag: str | None, path: str | None) -> str | None:
    """The token from --token-file, --token or $FERROPLASMA_SCAN_TOKEN (in
    that order; an empty variable means none). An empty --token is refused:
    ``--token "$UNSET"`` must not start a server that anyone may query."""
    if path is not None:
        return read_token_file(path)
    if flag is not None:
        if not flag:
            raise ValueError("--token is empty: give the token, or leave --token out")
        return flag
    return os.environ.get("FERROPLASMA_SCAN_TOKEN") or None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ferroplasma scan-server",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:7700",
        help="HOST:PORT to accept clients on (default %(default)s; 0.0.0.0:7700 for all hosts)",
    )
    p.add_argument("--root", required=True, help="directory whose datasets are served")
    token = p.add_mutually_exclusive_group()
    token.add_argument(
        "--token",
        help="shared secret clients must present (default: $FERROPLASMA_SCAN_TOKEN; none). "
        "Every local user can read it on a command line (ps, /proc/PID/cmdline): prefer "
        "--token-file or $FERROPLASMA_SCAN_TOKEN",
    )
    token.add_argument(
        "--token-file",
        metavar="PATH",
        help="read the token from PATH (a trailing newline is stripped; it overrides "
        "$FERROPLASMA_SCAN_TOKEN); make the file readable by the server's user only",
    )
    p.add_argument(
        "--store-socket",
        default=default_socket(),
        help="local store for same-host clients (default: $FERROPLASMA_SOCKET or "
        "/tmp/ferroplasma.sock; used only when a client shows it shares it)",
    )
    p.add_argument("--no-store", action="store_true", help="never place batches in the local store")
    p.add_argument(
        "--threads",
        type=_whole(1, engine.MAX_THREADS),
        help=f"DuckDB threads per query, 1 to {engine.MAX_THREADS} (default: all cores)",
    )
    p.add_argument(
        "--max-connections",
        type=_whole(1),
        default=256,
        help="connections open at once, authenticated or not (default %(default)s)",
    )
    p.add_argument(
        "--ucx-listen",
        metavar="[ucx://]HOST:PORT",
        help="also serve over UCX on PORT (0 picks one): RDMA where the hardware is, shared "
        "memory on one host, else TCP. Clients connect to ucx://HOST:PORT. The binding "
        "listens on every interface whatever HOST says, so this needs a token "
        "(--token-file or $FERROPLASMA_SCAN_TOKEN). Needs the UCX binding: pip install "
        "ucxx-cu12",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def main(argv: list[str]) -> int:
    """Runs the scan server until SIGTERM or Ctrl-C; returns the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        token = _token(args.token, args.token_file)
        server = ScanServer(
            args.listen,
            args.root,
            token=token,
            store_socket=None if args.no_store else args.store_socket,
            threads=args.threads,
            max_connections=args.max_connections,
            ucx_listen=args.ucx_listen,
        )
    except (OSError, ValueError) as e:
        message = " ".join(str(e).split())  # one line, whatever the value held
        print(f"ferroplasma scan-server: {message}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    also = f" and {server.ucx_address}" if server.ucx_address else ""
    print(f"ferroplasma scan-server: serving {server.root} on {server.address}{also}", flush=True)
    # Woken each second: a signal the kernel hands to another thread (one of
    # DuckDB's, say) would never interrupt an untimed wait here, and the
    # handler only runs in this thread.
    while not stop.wait(1.0):
        pass
    server.close()
    return 0
