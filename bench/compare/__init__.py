"""ferroplasma side by side with the stores its users would otherwise pick.

    make bench-compare [QUICK=1]

Modules:
    run        the driver: peer venvs, worker processes, interleaved rounds
    worker     the process that drives one system inside its own venv
    adapters   one adapter per system (ferroplasma, plasma, ray, vineyard,
               shm, pickle) over the same small interface
    workloads  latency, the ThymesisFlow Plasma paper's microbenchmarks, put/get,
               the Ray serialization post's objects, limits
    objects    the data: the Ray serialization post's objects, the ThymesisFlow
               Plasma paper's shapes, read_all (sources: docs/references.md)
    stats      percentiles, median with min-max, ratios, run order
    report     JSON, Markdown and PNG charts
"""
