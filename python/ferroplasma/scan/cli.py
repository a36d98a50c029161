"""``ferroplasma scan-server``: the scan server from the command line."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from ..client import default_socket
from .server import ScanServer

DESCRIPTION = """\
Serve the datasets under --root to ferroplasma scan clients (fp.scan.connect).

A dataset is a Parquet, CSV or JSON file, or a directory of them, named by its
path relative to the root; clients query it with SQL as the view `dataset`:

    ferroplasma scan-server --listen 0.0.0.0:7700 --root /data
    # client:  fp.scan.connect("host:7700").query("SELECT a FROM dataset", "t.parquet")

Each query runs in its own DuckDB database that can read only its dataset and
accepts one SELECT statement. Batches travel as their Arrow buffers, gathered
straight from DuckDB's memory (docs/scan.md). A client on this host with the
same store gets its batches placed in the store (only ids travel).
"""


def main(argv: list[str]) -> int:
    """Runs the scan server until SIGTERM or Ctrl-C; returns the exit code."""
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
    p.add_argument(
        "--token",
        default=os.environ.get("FERROPLASMA_SCAN_TOKEN"),
        help="shared secret clients must present (default: $FERROPLASMA_SCAN_TOKEN; none)",
    )
    p.add_argument(
        "--store-socket",
        default=default_socket(),
        help="local store for same-host clients (default: $FERROPLASMA_SOCKET or "
        "/tmp/ferroplasma.sock; used only when a client shows it shares it)",
    )
    p.add_argument("--no-store", action="store_true", help="never place batches in the local store")
    p.add_argument("--threads", type=int, help="DuckDB threads per query (default: all cores)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = p.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        server = ScanServer(
            args.listen,
            args.root,
            token=args.token,
            store_socket=None if args.no_store else args.store_socket,
            threads=args.threads,
        )
    except (OSError, ValueError) as e:
        print(f"ferroplasma scan-server: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    logging.getLogger("ferroplasma.scan").info(
        "serving %s on %s%s", server.root, server.address, " (token required)" if args.token else ""
    )
    print(f"ferroplasma scan-server: serving {server.root} on {server.address}", flush=True)
    stop.wait()
    server.close()
    return 0
