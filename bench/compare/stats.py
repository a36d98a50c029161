"""Statistics and run order for the side-by-side benchmark (standard library only).

* `percentile` / `summarize_samples`: p50 and p99 of one repetition's samples.
* `across_reps`: median with min and max over repetitions, warm-up dropped.
* `ratio`: a system's figure over ferroplasma's.
* `interleaved`: the order in which systems take turns, rotated each round so
  that no system always runs first (or right after the noisy one).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between the two
    nearest ranks, as numpy's default method computes it."""
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    xs = sorted(samples)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize_samples(samples: Sequence[float]) -> dict:
    """p50 and p99 of one repetition's per-operation samples."""
    return {"p50": percentile(samples, 50), "p99": percentile(samples, 99), "n": len(samples)}


def across_reps(values: Sequence[float], warmup: int = 1) -> dict | None:
    """Median, min and max of per-repetition figures after dropping the first
    `warmup` ones; None when nothing is left (the system did not run)."""
    kept = [v for v in list(values)[warmup:] if v is not None]
    if not kept:
        return None
    return {"median": statistics.median(kept), "min": min(kept), "max": max(kept), "n": len(kept)}


def ratio(value: float | None, reference: float | None) -> float | None:
    """value / reference (a time ratio > 1 means slower than the reference);
    None when either side is missing or the reference is zero."""
    if value is None or reference is None or reference == 0:
        return None
    return value / reference


def interleaved(systems: Sequence[str], round_no: int) -> list[str]:
    """The systems in the order they take their turn in round `round_no`."""
    n = len(systems)
    if n == 0:
        return []
    k = round_no % n
    return list(systems[k:]) + list(systems[:k])
