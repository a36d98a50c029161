"""Costs against the object count: a store of millions.

    make bench-scale [QUICK=1]

Modules:
    run       the driver: grows every system through 10^3..10^7 objects,
              taking turns, measures at each count, stops a system that
              would take too long or too much memory, and says why
    worker    the process that grows one system inside its own venv
              (bench/compare's venvs, workers and their JSON-line protocol)
    systems   each system's put, get, contains, batched get and delete of
              numbered small objects (starting a store is bench/compare's
              adapter), its store's processes, its limits
    procmem   a process's memory from /proc: VmRSS, RssAnon, RssShmem, and
              its largest shared mapping (the data area) apart
    report    JSON, Markdown with the ratios and the scale targets, one PNG
"""
