"""Time and memory measured inside a rank: the primitives behind P13, P14 and the benchmarks.

Rules
- Time of a call: every rank enters each repeat together (a barrier), times the call with
  ``time.perf_counter`` (after synchronising the device), and the repeat's time is the
  slowest rank's (an all-reduce MAX). Over repeats the estimate is the **minimum**: noise
  on a shared machine (another process, a page fault, the scheduler) only ever adds time,
  so the minimum is the cost of the work itself and the most repeatable statistic; every
  repeat is kept for noise estimates.
- Work of a call: in the same repeats, the CPU time the rank's process spent in the call
  (``time.process_time``: every thread of the rank, gloo's and the intra-op pool's
  included, user and system), the slowest rank's. Wall time on a shared 2-core machine
  moves 2-4x with what else runs (the rank waits for a core); CPU time counts only what
  the rank itself computed and copied, so it moves little with load, and a path that does
  3x the work shows it on every machine state. Waiting (for a peer, a sleep) is not work:
  the wall time keeps seeing that.
- Floor: the same run, the same process group, the same bytes, moved by the raw
  collective a path needs at least (all-gather, gather, broadcast, scatter) and by one
  local copy; measured with the same repeat rule, so that machine load hits path and floor
  alike and their ratio stays put.
- Peak memory of a call: the peak resident set size during it minus the resident size just
  before it, per rank. On Linux the kernel's own high-water mark is reset before the call
  (``/proc/self/clear_refs`` with "5") and read after (``VmHWM``): exact, no sampling.
  Where that reset is refused, a thread samples ``VmRSS`` every millisecond (a lower bound
  of the peak; ``peak_method`` says which was used). glibc keeps freed blocks below its
  (self-raising) mmap threshold in the heap, where a later call reuses them without the
  resident size moving: so before measuring, the threshold is pinned at 64 KiB
  (``mallopt``), and every block that size or larger is mapped on allocation and returned
  on free. That alone is not enough where the heap already holds large free chunks (the
  rank served other calls before the threshold was pinned, when glibc's own threshold had
  risen to megabytes): malloc serves a large block from a free chunk before it maps new
  memory, and a free chunk's pages are still resident, so a held 1 MB copy read as a peak of
  0 on one rank process (its self-test failed 2 of about 13 runs in a pytest session). So
  the heaps are also trimmed before every measured call (``malloc_trim(0)``: free pages go
  back to the kernel), and reusing them faults pages in, which the peak counts. Before the
  trim, the cyclic garbage of earlier work is collected (``gc.collect()``): a collection
  that the interpreter starts during the call would otherwise free memory that the resident
  size read before the call includes, and the call's own allocations would refill it unseen
  (a held 4 MB copy read as a 2 MB peak, under the clean path's own, in one CI run whose
  rank processes had served a whole pytest session). The peak then counts the call's own
  large allocations. On a CUDA device the allocator's peak
  (``torch.cuda.max_memory_allocated``, reset before the call) is reported beside it.
"""
from __future__ import annotations

import functools
import gc
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"
FLOOR_KINDS = ("all_gather", "gather", "broadcast", "scatter", "copy")


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (``VmRSS``, ``VmHWM``)."""
    with open(_STATUS) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{_STATUS} has no {field} line")


def rss_bytes() -> int:
    """Resident set size of this process now."""
    return status_kib("VmRSS") * 1024


def reset_hwm() -> bool:
    """Reset the kernel's RSS high-water mark (``VmHWM``); False where it cannot be reset."""
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class RssSampler(threading.Thread):
    """Samples this process's RSS every ``period`` seconds; ``stop()`` returns the peak
    seen (bytes), the RSS at that moment included."""

    def __init__(self, period: float = 0.001) -> None:
        super().__init__(daemon=True)
        self.period, self.peak, self._halt = period, rss_bytes(), threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self.period)

    def stop(self) -> int:
        self._halt.set()
        self.join()
        return max(self.peak, rss_bytes())


@dataclass(frozen=True)
class PeakMemory:
    """Memory of one call on one rank, in bytes. ``peak_bytes`` = peak RSS during the call
    minus RSS before it (never negative); ``device_peak_bytes`` likewise for the CUDA
    allocator (None on CPU)."""

    before_bytes: int
    peak_bytes: int
    peak_method: str  # "hwm" (kernel high-water mark) or "sampled"
    device_peak_bytes: int | None = None


_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 64 * 1024


@functools.cache
def _glibc() -> Any:
    """glibc's ``mallopt`` and ``malloc_trim`` (loaded once per process), or None where the
    C library is not glibc."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


@functools.cache
def pin_malloc() -> bool:
    """Pin glibc's mmap threshold (module docstring) once per process; False where there
    is no glibc (the measurement then keeps the allocator's own behaviour)."""
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD))


def trim_malloc() -> bool:
    """Give every free page of glibc's heaps back to the kernel (``malloc_trim(0)``); False
    where there is no glibc. A later allocation carved from a free heap chunk then faults
    its pages in again and shows in the resident size (module docstring)."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))


def measure_peak(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, PeakMemory]:
    """Run ``fn(*args, **kwargs)`` once and return its result and its :class:`PeakMemory`."""
    pin_malloc()
    gc.collect()
    trim_malloc()
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        dev_before = torch.cuda.memory_allocated()
    before = rss_bytes()
    sampler = None
    if not reset_hwm():
        sampler = RssSampler()
        sampler.start()
    try:
        out = fn(*args, **kwargs)
        if cuda:
            torch.cuda.synchronize()
    finally:
        peak = sampler.stop() if sampler is not None else status_kib("VmHWM") * 1024
    dev = max(0, torch.cuda.max_memory_allocated() - dev_before) if cuda else None
    return out, PeakMemory(before, max(0, peak - before), "sampled" if sampler else "hwm", dev)


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def _max_over_ranks(xs: Sequence[float], group, device: torch.device | None) -> list[float]:
    """Each of ``xs``, maxed over the ranks of ``group`` (one all-reduce for all of them)."""
    if group is None or dist.get_world_size(group) == 1:
        return list(xs)
    t = torch.tensor(list(xs), dtype=torch.float64,
                     device=device if device is not None and device.type == "cuda" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


@dataclass(frozen=True)
class Repeats:
    """Every repeat of one timed call, in seconds (module rules)."""

    wall_s: list[float]
    """Per repeat, the slowest rank's wall time (``time.perf_counter``)."""
    cpu_s: list[float]
    """Per repeat, the slowest rank's CPU time in the call (``time.process_time``)."""


def timed_repeats(fn: Callable[[], Any], repeats: int, *, group=None,
                  device: torch.device | None = None,
                  setup: Callable[[], Any] | None = None) -> Repeats:
    """Every repeat's slowest-rank wall and CPU time of ``fn()``, all ranks starting
    together. ``setup()`` runs before each repeat, untimed (e.g. rebuilding what ``fn``
    consumes). Every rank of ``group`` must call this with the same ``repeats`` (it is
    collective)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    wall, cpu = [], []
    for _ in range(repeats):
        if setup is not None:
            setup()
        _sync(device)
        if group is not None and dist.get_world_size(group) > 1:
            dist.barrier(group=group)
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        _sync(device)
        t1, c1 = time.perf_counter(), time.process_time()
        w, c = _max_over_ranks((t1 - t0, c1 - c0), group, device)
        wall.append(w)
        cpu.append(c)
    return Repeats(wall, cpu)


def _floor_call(kind: str, nbytes: int, group, device: torch.device) -> Callable[[], Any]:
    """A closure moving ``nbytes`` in total with collective ``kind`` (buffers made once)."""
    ws = dist.get_world_size(group) if group is not None else 1
    rank = dist.get_rank(group) if group is not None else 0
    n = max(1, math.ceil(nbytes / ws))  # bytes per rank: the total is what gets moved
    if kind == "copy":
        src = torch.ones(max(1, nbytes), dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)
    if ws == 1:  # a 1-rank collective moves nothing: its floor is the copy it amounts to
        return _floor_call("copy", nbytes, None, device)
    mine = torch.ones(n, dtype=torch.uint8, device=device)
    if kind == "all_gather":
        out = torch.empty(n * ws, dtype=torch.uint8, device=device)
        return lambda: dist.all_gather_into_tensor(out, mine, group=group)
    root = dist.get_global_rank(group, 0) if group is not None else 0
    if kind == "gather":
        bufs = [torch.empty_like(mine) for _ in range(ws)] if rank == 0 else None
        return lambda: dist.gather(mine, bufs, dst=root, group=group)
    if kind == "broadcast":
        full = torch.ones(n * ws, dtype=torch.uint8, device=device)
        return lambda: dist.broadcast(full, src=root, group=group)
    if kind == "scatter":
        parts = [torch.ones_like(mine) for _ in range(ws)] if rank == 0 else None
        return lambda: dist.scatter(mine, parts, src=root, group=group)
    raise ValueError(f"floor kind must be one of {FLOOR_KINDS}, got {kind!r}")


def floor_times(ops: Sequence[tuple[str, int]], repeats: int, *, group=None,
                device: torch.device | None = None) -> Repeats:
    """Every repeat's slowest-rank wall and CPU time of doing each ``(kind, nbytes)`` of
    ``ops`` in turn (e.g. ``[("all_gather", n), ("copy", n)]``, see ``floors.floor_ops``):
    the floor of a path that must do at least that. Collective (every rank of ``group``
    calls it)."""
    dev = device if device is not None else torch.device("cpu")
    calls = [_floor_call(k, n, group, dev) for k, n in ops]
    return timed_repeats(lambda: [c() for c in calls], repeats, group=group, device=dev)


def fit_exponent(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log(y) against log(x): y ~ x**k gives k. Needs two or more
    distinct positive xs and positive ys."""
    if any(x <= 0 for x in xs) or any(y <= 0 for y in ys):
        raise ValueError(f"need positive values to fit on a log scale, got {list(xs)}, {list(ys)}")
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys)]
    if len(pts) < 2 or len({p[0] for p in pts}) < 2:
        raise ValueError(f"need two or more distinct x values to fit, got {list(xs)}")
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    num = sum((p[0] - mx) * (p[1] - my) for p in pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return num / den
