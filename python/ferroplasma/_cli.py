"""The ``ferroplasma`` console script: the store and its commands, from the
native module (so ``pip install ferroplasma`` alone gives a working store)."""

from __future__ import annotations

import sys


def main() -> None:
    """Runs ``ferroplasma`` with the process's arguments."""
    from . import _native

    sys.exit(_native.run_cli(["ferroplasma", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
