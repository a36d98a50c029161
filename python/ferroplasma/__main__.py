"""``python -m ferroplasma``: the same as the ``ferroplasma`` command."""

from ._cli import main

main()
