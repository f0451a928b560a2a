"""Summary statistics in pytest-benchmark's vocabulary.

Rules (the ``stats`` object of a pytest-benchmark JSON entry):
- ``min``, ``max``, ``mean``, ``median``, ``stddev`` (sample standard deviation, 0 for one
  sample), ``rounds`` (number of samples), ``data`` (the samples, sorted), ``total`` (their
  sum) and ``iterations`` (1: every sample is one call).
- ``q1``/``q3``: pytest-benchmark's quartiles (one sample: that sample; an even count: the
  median of the lower / upper half; an odd count: a weighted interpolation, Wikipedia's
  "method 3"), ``iqr`` = q3 - q1.
- ``ops``: calls per second, 1 / mean (0 when the mean is 0).
"""
from __future__ import annotations

import statistics
from typing import Sequence


def _quartiles(xs: Sequence[float]) -> tuple[float, float]:
    """(q1, q3) of the sorted ``xs`` by pytest-benchmark's rule (module docstring)."""
    n = len(xs)
    if n == 1:
        return xs[0], xs[0]
    if n % 2 == 0:
        return statistics.median(xs[:n // 2]), statistics.median(xs[n // 2:])
    k, r = n // 4, n % 4
    if r == 1:
        return 0.25 * xs[k - 1] + 0.75 * xs[k], 0.75 * xs[3 * k] + 0.25 * xs[3 * k + 1]
    return 0.75 * xs[k] + 0.25 * xs[k + 1], 0.25 * xs[3 * k + 1] + 0.75 * xs[3 * k + 2]


def summarize(samples: Sequence[float]) -> dict:
    """The statistics of ``samples`` (seconds), module docstring's fields; ValueError when
    there are none."""
    xs = sorted(float(x) for x in samples)
    if not xs:
        raise ValueError("no samples to summarize")
    mean = statistics.fmean(xs)
    q1, q3 = _quartiles(xs)
    return {
        "min": xs[0], "max": xs[-1], "mean": mean,
        "median": statistics.median(xs),
        "stddev": statistics.stdev(xs) if len(xs) > 1 else 0.0,
        "rounds": len(xs), "iterations": 1,
        "q1": q1, "q3": q3, "iqr": q3 - q1,
        "ops": 1.0 / mean if mean > 0 else 0.0,
        "total": sum(xs), "data": xs,
    }
