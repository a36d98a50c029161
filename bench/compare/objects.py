"""The data every system is measured on: the four objects of the Ray
serialization post, the six microbenchmark shapes of the ThymesisFlow Plasma
paper, and the one function that "reads every byte" (sources in
docs/references.md).

Only the standard library and numpy, so it imports in every peer's venv.
"""

from __future__ import annotations

import numpy as np

# The ThymesisFlow Plasma paper (Abrahamse, Hadnagy and Al-Ars, 2022), Table I:
# (number of objects, object size in bytes; 1 kB = 1000 B).
MICRO_SHAPES = [
    (1000, 1_000),
    (500, 10_000),
    (200, 100_000),
    (100, 1_000_000),
    (50, 10_000_000),
    (10, 100_000_000),
]

# Sizes of the numpy-array and bytes put/get workload (the same sizes).
PUT_GET_SIZES = [size for _, size in MICRO_SHAPES]


def ray_blog_objects():
    """The four objects of "Fast Python Serialization with Ray and Apache
    Arrow" (Moritz and Nishihara, 2017), as its benchmark builds them."""
    rng = np.random.default_rng(0)
    return [
        ("List of large numpy arrays", [rng.standard_normal(50000) for _ in range(100)]),
        (
            "Dictionary of large numpy arrays",
            {"weight-" + str(i): rng.standard_normal(50000) for i in range(100)},
        ),
        (
            "Large dictionary of small sets",
            {i: {"string1" + str(i), "string2" + str(i)} for i in range(100000)},
        ),
        ("Large list of strings", [str(i) for i in range(200000)]),
    ]


def payload(nbytes: int) -> np.ndarray:
    """Random bytes (uint8, length a multiple of 8), the same in every system."""
    return np.random.default_rng(nbytes).integers(0, 255, nbytes, dtype=np.uint8)


def read_all(view) -> int:
    """Reads every byte of a buffer (sums it as uint64 words) and returns the
    sum, so the read cannot be skipped. Every system's reader uses this, and
    the "sequential read" limit is this function over private memory."""
    return int(np.frombuffer(view, dtype=np.uint64).sum())
