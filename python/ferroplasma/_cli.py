"""The ``ferroplasma`` console script: the store and its commands, from the
native module (so ``pip install ferroplasma`` alone gives a working store),
and the commands written in Python (``scan-server``, ``records``,
``dataframe``)."""

from __future__ import annotations

import sys


def main() -> None:
    """Runs ``ferroplasma`` with the process's arguments."""
    args = sys.argv[1:]
    if args and args[0] == "scan-server":
        from .scan.cli import main as scan_server

        sys.exit(scan_server(args[1:]))
    if args and args[0] == "records":
        from .jobs.cli import records_main

        sys.exit(records_main(args[1:]))
    if args and args[0] == "dataframe":
        from .jobs.cli import dataframe_main

        sys.exit(dataframe_main(args[1:]))
    from . import _native

    sys.exit(_native.run_cli(["ferroplasma", *args]))


if __name__ == "__main__":
    main()
