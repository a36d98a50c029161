"""Jobs that run on the store: worker processes pass object ids, not bytes.

Modules:

- :mod:`~ferroplasma.jobs.pool` — :class:`Pool` (worker processes connected
  to one store) and :func:`job_store` (the store a job runs on, private if
  none is running);
- :mod:`~ferroplasma.jobs.dask_pool` — :class:`DaskPool`: the same tasks on
  the workers of a Dask cluster, each talking to the store of its host
  (pass a ``distributed.Client`` as ``workers``);
- :mod:`~ferroplasma.jobs.dataframe` — :func:`sort_dataframe`, the parallel
  sample sort of a DataFrame in the store ("Plasma In-Memory Object Store",
  Moritz and Nishihara, 2017);
- :mod:`~ferroplasma.jobs.records` — the map/reduce sort of text records
  ("Plasma Map/Reduce Slightly Faster Than Hadoop", Stolpmann, 2012),
  :func:`~ferroplasma.jobs.records.sort_records`; the module
  also gives the functions of the three below;
- :mod:`~ferroplasma.jobs.record_format` — the 100-byte record: checking
  lines (with file and line number on error), keys, sizes, splits;
- :mod:`~ferroplasma.jobs.record_gen` — seeded input files (``records gen``);
- :mod:`~ferroplasma.jobs.record_validate` — checking an output against its
  input (``records validate``);
- :mod:`~ferroplasma.jobs.cli` — ``ferroplasma records gen|sort|validate``.

Both jobs need numpy and pandas: ``pip install numpy pandas pyarrow tqdm``
(or ``pip install '.[jobs]'`` in a ferroplasma checkout).
"""

from __future__ import annotations

from .._optional import require

require("ferroplasma.jobs", "jobs", "numpy", "pandas")

from .dask_pool import DaskPool  # noqa: E402
from .dataframe import sort_dataframe  # noqa: E402 - after the dependency check
from .pool import Pool, default_socket, job_store  # noqa: E402

__all__ = ["DaskPool", "Pool", "default_socket", "job_store", "sort_dataframe"]
