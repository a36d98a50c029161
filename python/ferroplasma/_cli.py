"""The ``ferroplasma`` console script: the store and its commands, from the
native module (so ``pip install ferroplasma`` alone gives a working store),
and the commands written in Python (``scan-server``, ``records``,
``dataframe``). Also ``plasma_store`` / ``plasma-store-server``: the store
under the names and flags of Plasma's, for programs that start it by name."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import warnings

#: The commands written in Python: (extra, modules they need).
_PYTHON_COMMANDS = {
    "scan-server": ("scan", ("duckdb", "pyarrow")),
    "records": ("jobs", ("numpy",)),
    "dataframe": ("jobs", ("numpy", "pandas", "pyarrow")),
}


def main() -> None:
    """Runs ``ferroplasma`` with the process's arguments."""
    args = sys.argv[1:]
    if len(args) >= 2 and args[0] == "help" and args[1] in _PYTHON_COMMANDS:
        args = [args[1], *args[2:], "--help"]  # `ferroplasma help records`
    if args and args[0] in _PYTHON_COMMANDS:
        sys.exit(_run_python_command(args[0], args[1:]))
    sys.exit(_run_native(["ferroplasma", *args]))


def _run_python_command(name: str, argv: list[str]) -> int:
    from ._optional import require
    from .errors import MissingDependency

    extra, modules = _PYTHON_COMMANDS[name]
    try:
        require(f"ferroplasma {name}", extra, *modules)
    except MissingDependency as e:
        print(f"ferroplasma {name}: error: {e}", file=sys.stderr)
        return 1
    if name == "scan-server":
        from .scan.cli import main as scan_server

        return scan_server(argv)
    if name == "records":
        from .jobs.cli import records_main

        return records_main(argv)
    from .jobs.cli import dataframe_main

    return dataframe_main(argv)


def _run_native(argv: list[str]) -> int:
    """Runs a command of the native CLI. The store handles SIGINT and SIGTERM
    itself (it shuts down cleanly and exits 0): Python's own SIGINT handling
    is turned off for it, so that Ctrl-C does not also end in a
    KeyboardInterrupt traceback once the store has stopped."""
    import signal

    from . import _native

    if len(argv) > 1 and argv[1] == "store":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    elif "--watch" in argv:
        # `stats --watch` runs in Rust until Ctrl-C: let the signal end the
        # process at once, as for any command-line tool (Python's handler
        # would only run once Rust returned, which it never does).
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    return _native.run_cli(argv)


def _plasma_store_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        add_help=False,  # -h is Plasma's flag for huge pages
        description="A ferroplasma store started with the flags of Plasma's plasma_store "
        "(pyarrow <= 11). Clients of pyarrow.plasma connect to it through "
        "ferroplasma.plasma (docs/migrating-from-plasma.md); `ferroplasma store --help` "
        "lists ferroplasma's own options.",
    )
    p.add_argument("-m", metavar="BYTES", help="memory of the store, in bytes (or 4GiB-style)")
    p.add_argument(
        "-s",
        metavar="SOCKET",
        help="socket path (default: $FERROPLASMA_SOCKET, else /tmp/ferroplasma.sock); a "
        "regular file there is replaced, as Plasma did; a live store's socket never is",
    )
    p.add_argument("-d", metavar="DIR", help="back the memory with a file in DIR (e.g. /dev/shm)")
    p.add_argument("-h", action="store_true", help="use 2 MiB huge pages")
    p.add_argument(
        "-e",
        metavar="EXTERNAL_STORE",
        help="Plasma's external store: not supported; evicted objects spill to a temporary "
        "directory instead (ferroplasma store --spill-dir DIR chooses one)",
    )
    p.add_argument("--help", action="help", help="show this help and exit")
    return p


def plasma_store(argv: list[str], prog: str = "plasma_store") -> int:
    """Runs a store with Plasma's command-line flags (``-m``, ``-s``, ``-d``,
    ``-h``, ``-e``); returns the exit code."""
    args = _plasma_store_parser(prog).parse_args(argv)
    # Plasma's store left its socket file when it stopped, and programs
    # written for it remove the file themselves. Its memory was all for
    # objects (its suite fills the store with one object of its whole size):
    # no room is leased to clients for writes without a round trip.
    cmd = ["ferroplasma", "store", "--replace-file", "--keep-socket", "--fast-writes", "off"]
    if args.m is not None:
        cmd += ["--memory", args.m]
    if args.s is not None:
        cmd += ["--socket", args.s]
    if args.d is not None:
        cmd += ["--dir", args.d]
    if args.h:
        cmd.append("--hugepages")
    spill = None
    if args.e is not None:
        spill = tempfile.mkdtemp(prefix="ferroplasma-spill-")
        warnings.warn(
            f"{prog}: external stores ({args.e}) are replaced by spilling: evicted objects "
            f"go to {spill} and come back on get (choose the directory with "
            "`ferroplasma store --spill-dir DIR`)",
            UserWarning,
            stacklevel=2,
        )
        cmd += ["--spill-dir", spill]
    try:
        return _run_native(cmd)
    finally:
        if spill is not None:
            shutil.rmtree(spill, ignore_errors=True)


def plasma_store_main() -> None:
    """The ``plasma_store`` and ``plasma-store-server`` console scripts."""
    sys.exit(plasma_store(sys.argv[1:], os.path.basename(sys.argv[0])))


if __name__ == "__main__":
    main()
