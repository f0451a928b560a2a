"""Timings and peak memory of one thing in BASE and NEW: when a change counts as slower or
faster, more or less memory (report/diff_runs.py and diff_bench.py apply these to run
measurements and benchmarks), and the fixed minimums of every measured change.

Timings (run measurements per case and phase; benchmarks by name). A run measurement is
compared on its work (CPU time over the floor's CPU time, ``clock_of``) where it has one,
else on its wall time. The statistic is the minimum over repeats (timing.py: machine noise only ever adds time) divided by its floor, the
raw collective(s) and copy of the same bytes timed in the same run, so that a slower or busier
machine moves both and the ratio stays put. Noise: each side's ratio has a band
``[lo, hi]``: lo = min(time) / median(floor), hi = median(time) / min(floor) (for a
benchmark: stats.min and stats.median over extra_info.floor_min_s and floor_median_s). NEW
is *slower* only when its band lies wholly above BASE's band times ``max_slowdown``
(``new.lo > base.hi * max_slowdown``), i.e. the change exceeds the spread of both runs'
repeats, AND its raw time grew too (``new.min > base.median * max_slowdown``), AND the excess
time ``new.time - base.ratio * new.floor`` is above ``MIN_TIME_DELTA_S``. The raw-time test
is there because a floor is itself a measurement: a floor of a few microseconds that one run
caught 100x slower (a busy 2-core machine: a scheduler slice in every repeat) would
otherwise make an unchanged path look 100x slower or faster in the other. A path that really
got slower is slower in both. (The cost: a NEW machine more than ``max_slowdown`` times
faster than BASE's hides a regression of that size; gate on reports from the same machine
kind, as ``gate`` does.) Without a floor on either side the raw times are compared by the
same rule. *Faster* (improvement) is the same test with the roles swapped.

Memory (per rank ``peak_bytes``): NEW uses *more memory* on a rank when
``new > base * max_memory_growth`` and ``new - base`` is above ``MIN_MEMORY_DELTA_BYTES``
and above ``MIN_MEMORY_SHARE`` of the rank's share of the state (``state_bytes /
world_size``, when the measurement records them).

Constants (the scaling one is applied in report/diff_runs.py):
- ``MIN_TIME_DELTA_S`` = 2 ms: one scheduler time slice on Linux is 1-4 ms, so on a busy
  2-core machine a sub-millisecond call can lose a whole slice in every repeat; below 2 ms of
  excess a ratio is scheduling, not work.
- ``MIN_MEMORY_DELTA_BYTES`` = 4 MiB: the peaks are exact (kernel high-water mark with
  glibc's mmap threshold pinned at 64 KiB, timing.py), but whether a call's buffers land on
  pages the process already has (gloo's, the allocator's freed ones) is chance: between two
  identical benchmark runs here rank 1's peak in ``fsdp1.full/save/ws2/1e6`` was 0.02 MiB in
  one and 3.5 MiB in the other. A real extra copy of optimizer state is larger than that
  from about 1e6 state elements (8 MB in fp32 Adam) up.
- ``MIN_MEMORY_SHARE`` = 0.25: at larger states a rank's peak moved by up to 3 MiB (12% of
  its 27 MB share) between identical runs; an extra copy of anything the path holds is at
  least a whole share, four times this.
- ``MIN_SCALING_EXPONENT_DELTA`` = 0.2: a fit over 3-4 world sizes whose times carry the
  shared machine's noise (tens of percent for millisecond calls) moves its exponent by about
  0.1 between identical runs; twice that is a change.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Sequence

from .run_report import ReportFormatError

MIN_TIME_DELTA_S = 0.002
MIN_MEMORY_DELTA_BYTES = 4 << 20
MIN_MEMORY_SHARE = 0.25
MIN_SCALING_EXPONENT_DELTA = 0.2
PHASES = ("save", "load")


@dataclass(frozen=True)
class Timing:
    """One timed thing in one report: ``time_s`` the estimate (minimum over repeats),
    ``time_hi_s`` a typical repeat (median; == time_s without repeats), and the same for its
    floor (None: no floor)."""

    time_s: float
    time_hi_s: float
    floor_s: float | None = None
    floor_hi_s: float | None = None

    def normalised(self, use_floor: bool) -> tuple[float, float, float]:
        """(estimate, lo, hi) of time / floor (module docstring), or of the raw time."""
        if not use_floor:
            return self.time_s, self.time_s, max(self.time_s, self.time_hi_s)
        f_lo, f_hi = self.floor_s, max(self.floor_s, self.floor_hi_s or self.floor_s)
        return (self.time_s / f_lo, self.time_s / f_hi,
                max(self.time_s, self.time_hi_s) / f_lo)


def _median(xs: Any, default: float) -> float:
    vals = [float(x) for x in xs or () if isinstance(x, (int, float))]
    return statistics.median(vals) if vals else default


def clock_of(m: dict) -> str:
    """The clock a run measurement's timing is compared on: "work" (CPU time, ``cpu_s`` over
    ``floor_cpu_s``) where the measurement has it, else "wall". The work is what P13's
    sharp bound judges; the wall time of the same call moves 2-4x with what else runs on a
    2-core machine (the same commit beside 3 busy processes: 3 calls 2.6-3.6x "slower" on
    the wall clock, none on the work clock)."""
    return "work" if _positive(m.get("cpu_s")) and _positive(m.get("floor_cpu_s")) else "wall"


def timing_of_measurement(m: dict) -> Timing:
    """A run measurement (contract 1: time_s, times_s, floor_s, floor_times_s; or, where it
    has them, the work: cpu_s, cpu_times_s, floor_cpu_s, floor_cpu_times_s: ``clock_of``)."""
    if clock_of(m) == "work":
        t, floor = float(m["cpu_s"]), float(m["floor_cpu_s"])
        return Timing(t, _median(m.get("cpu_times_s"), t), floor,
                      _median(m.get("floor_cpu_times_s"), floor))
    t = float(m["time_s"])
    floor = m.get("floor_s")
    floor = float(floor) if isinstance(floor, (int, float)) and floor > 0 else None
    return Timing(t, _median(m.get("times_s"), t), floor,
                  _median(m.get("floor_times_s"), floor) if floor else None)


def _positive(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and x > 0 else None


def timing_of_benchmark(b: dict) -> Timing:
    """A benchmark (contract 2): stats.min / stats.median over extra_info.floor_min_s /
    floor_median_s (a report with only floor_median_s: that figure for both)."""
    s, extra = b["stats"], b.get("extra_info") or {}
    f_med = _positive(extra.get("floor_median_s"))
    f_min = _positive(extra.get("floor_min_s")) or f_med
    return Timing(float(s["min"]), float(s["median"]), f_min, f_med if f_min else None)


def ms_text(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 10 else f"{s:.2f} s"


def compare_timing(base: Timing, new: Timing, max_slowdown: float) -> tuple[str, str] | None:
    """("slower" | "faster", detail) when the change exceeds the threshold, the noise and
    MIN_TIME_DELTA_S (module docstring), else None."""
    use_floor = base.floor_s is not None and new.floor_s is not None
    b, b_lo, b_hi = base.normalised(use_floor)
    n, n_lo, n_hi = new.normalised(use_floor)
    if b <= 0 or n <= 0:
        return None
    # the raw times must move too (module docstring: a floor that got faster by chance is
    # not a slower path)
    raw_slower = new.time_s > max(base.time_s, base.time_hi_s) * max_slowdown
    raw_faster = base.time_s > max(new.time_s, new.time_hi_s) * max_slowdown
    if n_lo > b_hi * max_slowdown and raw_slower:
        label = "slower"
        excess = new.time_s - b * new.floor_s if use_floor else new.time_s - base.time_s
    elif b_lo > n_hi * max_slowdown and raw_faster:
        label = "faster"
        excess = base.time_s - n * base.floor_s if use_floor else base.time_s - new.time_s
    else:
        return None
    if excess <= MIN_TIME_DELTA_S:
        return None
    what = "time / floor" if use_floor else "time (no floor on both sides)"
    detail = (f"{what} {b:.3g} -> {n:.3g} (x{n / b:.2f}, threshold x{max_slowdown:g}; "
              f"noise bands {b_lo:.3g}-{b_hi:.3g} -> {n_lo:.3g}-{n_hi:.3g}); "
              f"time {ms_text(base.time_s)} -> {ms_text(new.time_s)}")
    if use_floor:
        detail += f"; floor {ms_text(base.floor_s)} -> {ms_text(new.floor_s)}"
    return label, detail


def mib_text(b: float) -> str:
    return f"{b / (1 << 20):.2f} MiB"


def min_memory_delta(obj: dict) -> int:
    """The smallest per-rank peak change that counts (module docstring): 1 MiB, or a quarter
    of one rank's share of the state (``state_bytes / world_size``) when the measurement
    says how big the state is."""
    state, ws = obj.get("state_bytes"), obj.get("world_size")
    share = (state / ws) if (isinstance(state, (int, float)) and isinstance(ws, int)
                            and ws > 0) else 0
    return int(max(MIN_MEMORY_DELTA_BYTES, MIN_MEMORY_SHARE * share))


def compare_peaks(base: Sequence[int], new: Sequence[int], max_growth: float,
                  min_delta: int = MIN_MEMORY_DELTA_BYTES) -> list[tuple[str, str]]:
    """[("more memory" | "less memory", detail)] over the ranks both list (module
    docstring's rule); one entry per direction, naming every rank that moved."""
    more, less = [], []
    for rank, (b, n) in enumerate(zip(base, new)):
        ratio = f"x{n / b:.2f}" if b > 0 else "from 0"
        line = f"rank {rank}: {mib_text(b)} -> {mib_text(n)} ({ratio})"
        if n > b * max_growth and n - b > min_delta:
            more.append(line)
        elif b > n * max_growth and b - n > min_delta:
            less.append(line)
    out = []
    if more:
        out.append(("more memory", f"threshold x{max_growth:g} and +{mib_text(min_delta)}; "
                                   + "; ".join(more)))
    if less:
        out.append(("less memory", "; ".join(less)))
    if len(base) != len(new):
        out.append(("changed", f"peaks for {len(base)} rank(s) in BASE, {len(new)} in NEW; "
                               f"compared the first {min(len(base), len(new))}"))
    return out


def peaks_of(obj: dict, where: str) -> list[int] | None:
    peaks = obj.get("peak_bytes")
    if peaks is None:
        return None
    if not isinstance(peaks, list) or not all(isinstance(p, (int, float)) for p in peaks):
        raise ReportFormatError(f"{where}: 'peak_bytes' must be a list of numbers (one per rank)")
    return [int(p) for p in peaks]
