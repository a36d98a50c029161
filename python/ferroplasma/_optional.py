"""Optional dependencies: a clear, one-line error naming what to install.

The core package (the store, the client, ``put``/``get`` of plain Python
objects and numpy arrays) needs nothing beyond Python. The scan client and
server and the jobs need more; they call :func:`require` before importing
it, so a missing package is a :class:`~ferroplasma.MissingDependency` that
says what to install, not a ``ModuleNotFoundError`` deep inside.
"""

from __future__ import annotations

import importlib.util

from .errors import MissingDependency

__all__ = ["EXTRAS", "require"]

#: The package's extras and what each installs (as in pyproject.toml).
EXTRAS = {
    "jobs": ("numpy", "pandas", "pyarrow", "tqdm"),
    "scan": ("pyarrow", "duckdb"),
    "dask": ("numpy", "pandas", "pyarrow", "tqdm", "dask[distributed,dataframe]"),
}


def require(what: str, extra: str, *modules: str) -> None:
    """Raises MissingDependency unless every module in ``modules`` can be
    imported. ``what`` names the feature (e.g. ``"ferroplasma records"``),
    ``extra`` the extra that installs them."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingDependency(
            f"{what} needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
            f"not installed: pip install {' '.join(EXTRAS[extra])} (or, in a ferroplasma "
            f"checkout, pip install '.[{extra}]')"
        )
