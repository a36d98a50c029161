"""pytest plugin for running pyarrow 11.0.0's own Plasma tests
(``pyarrow/tests/test_plasma.py``, fetched from PyPI by ``make test-plasma``)
against ferroplasma.plasma.

sitecustomize.py beside this file maps ``pyarrow.plasma`` onto
ferroplasma.plasma in this process and in every interpreter the suite starts.
The tests below are the only ones not run, each because what it exercises
exists nowhere any more; everything else must pass.
"""

from __future__ import annotations

import pytest

#: Tests of test_plasma.py that are not run, and why (the one list).
EXCLUDED = {
    "test_put_and_get_serialization_context": (
        "pa.lib.SerializationContext and pa.ArrowSerializationError were removed from "
        "pyarrow (deprecated in 2.0)"
    ),
    "test_put_and_get_raw_buffer": (
        "decodes put() results with pa.deserialize, removed from pyarrow (deprecated in 2.0)"
    ),
    "test_use_huge_pages": "needs a hugetlbfs mount at /mnt/hugepages",
    "test_plasma_deprecated": (
        "checks the DeprecationWarning pyarrow 10-11 printed for Plasma; ferroplasma.plasma "
        "is not deprecated"
    ),
    "test_store_pandas_dataframe": (
        "pa.RecordBatch.from_pandas of this frame fails in current pyarrow with pandas 3, "
        "before the store is used"
    ),
}


def pytest_configure(config: pytest.Config) -> None:
    for name in ("plasma", "pandas"):
        config.addinivalue_line("markers", f"{name}: marker of pyarrow's test suite")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for name, why in EXCLUDED.items():
            if item.nodeid.endswith("::" + name):
                item.add_marker(pytest.mark.skip(reason=f"excluded: {why}"))
