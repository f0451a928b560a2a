"""Summary statistics in pytest-benchmark's vocabulary (min/max/mean/median/stddev/rounds)."""
from __future__ import annotations

import statistics
from typing import Sequence


def summarize(samples: Sequence[float]) -> dict:
    xs = sorted(float(x) for x in samples)
    if not xs:
        raise ValueError("no samples to summarize")
    return {
        "min": xs[0], "max": xs[-1], "mean": statistics.fmean(xs),
        "median": statistics.median(xs),
        "stddev": statistics.stdev(xs) if len(xs) > 1 else 0.0,
        "rounds": len(xs), "data": xs,
    }
