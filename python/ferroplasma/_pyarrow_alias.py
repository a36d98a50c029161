"""Makes ``import pyarrow.plasma`` and ``from pyarrow._plasma import ...``
load :mod:`ferroplasma.plasma`, for code written for pyarrow <= 11 that
cannot be edited (third-party packages, test suites, subprocesses).

:func:`install` adds an import hook; nothing is imported until a program
imports one of the two names, and a real ``pyarrow.plasma`` already imported
stays as it is.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType

__all__ = ["ALIASED", "install"]

#: The module names that load ferroplasma.plasma once :func:`install` ran.
ALIASED = ("pyarrow.plasma", "pyarrow._plasma")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module("ferroplasma.plasma")

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: ferroplasma.plasma is already imported."""


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in ALIASED:
            return importlib.util.spec_from_loader(name, _Loader())
        return None


def install() -> None:
    """From now on, importing ``pyarrow.plasma`` or ``pyarrow._plasma`` gives
    :mod:`ferroplasma.plasma`. Idempotent."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
