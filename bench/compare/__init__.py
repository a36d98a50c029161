"""ferroplasma side by side with the stores its users would otherwise pick.

    make bench-compare [QUICK=1]

Modules:
    run        the driver: peer venvs, worker processes, interleaved rounds
    worker     the process that drives one system inside its own venv
    adapters   one adapter per system (ferroplasma, plasma, ray, vineyard,
               shm, pickle) over the same small interface
    workloads  latency, seed 002 microbenchmarks, put/get, seed 003, limits
    objects    the data: seed 003's objects, seed 002's shapes, read_all
    stats      percentiles, median with min-max, ratios, run order
    report     JSON, Markdown and PNG charts
"""
