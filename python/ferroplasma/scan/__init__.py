"""Columnar scans: SQL on a remote host's datasets, results as Arrow batches
whose buffers crossed the network as they are, as in "Thallus: An RDMA-based
Columnar Data Transport Protocol" (Chakraborty et al., 2024), over TCP.

Server (on the host with the data)::

    ferroplasma scan-server --listen 0.0.0.0:7700 --root /data

Client::

    import ferroplasma as fp
    scan = fp.scan.connect("datahost:7700")
    reader = scan.query("SELECT l_orderkey, l_price FROM dataset", "lineitem")
    for batch in reader:            # pyarrow.RecordBatch around received buffers
        ...
    ids = scan.query("SELECT * FROM dataset", "lineitem", into_store=fp.connect())
    # every process on this host: fp.connect().get(ids[0]) -> RecordBatch, zero-copy

See docs/scan.md for the protocol and the transport interface.
"""

from __future__ import annotations

from .client import Scan, ScanClient, connect
from .server import ScanServer
from .transport import TcpTransport, Transport

__all__ = ["Scan", "ScanClient", "ScanServer", "TcpTransport", "Transport", "connect"]
