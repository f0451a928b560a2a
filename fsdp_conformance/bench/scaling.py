"""``fsdp-conformance bench scaling``: every API path's save and load time against its floor,
and its per-rank peak memory, over optimizer-state sizes and world sizes.

What is measured: ``measure.measure_case`` of ``Case(api=path, optimizer="adam",
model=scaled<n>, plan="nested", world_size=ws, dtype="fp32", steps=1)`` with ``n`` = state
elements / 2 (Adam keeps two fp32 states per param), on the shared rank pool (gloo on CPU).
Per (path, phase, state size, world size) one benchmark: the path's time per repeat (slowest
rank, every rank starting together; see timing.py), its floor (floors.py: the raw
collective(s) and copy of the same bytes, timed right after, same group) and the peak
resident memory of one more call on each rank.

Grid (the default run must finish in about 15 minutes on a shared 2-core machine with
24 GiB; cost grows about linearly with state size and with world size, since 4 ranks share 2
cores):
- state elements 1e5, 1e6, 1e7 for all eight paths at world sizes 1-4 (96 cases, ~4 min):
  enough for the fit against world size at 1e7 and, with 1e8, against size at world size 4;
- 1e8 elements (400 MB of state, 50M params) only at world size 4 and only for the
  non-legacy paths fsdp1.full, fsdp1.sharded, fsdp2.full, fsdp2.sharded (15-60 s a case,
  ~2.5 min together: model build, one training step, and fsdp1.sharded's DCP load at 5-9 s
  a call; the whole default run measured 6.5-7 minutes with other work on the machine). These are the APIs users are told to use, and rank 0 consolidating the full state
  (fsdp1.full, fsdp2.full) is where host memory runs out. Peak memory is far below 24 GiB:
  the worst case (a full dict on each of 4 ranks) is under 2 GiB of state copies.
- repeats per case: 5 up to 1e6 elements, 3 at 1e7, 2 at 1e8 (the estimate is the minimum,
  noise only adds time; a call of seconds has little scheduling noise left to shed).
- ``--quick`` (the upgrade gate's smoke run, under ~3 minutes): 1e5 and 1e6 elements at world
  sizes 1, 2 and 4, 5 repeats (as the default grid at these sizes: the gate compares two
  quick runs, and their noise bands come from the repeats), all paths (48 cases).

Report (``write_report``; schema ``fsdp-conformance/bench/1``, read by ``fsdp-conformance
compare``; pytest-benchmark's layout): ``machine_info``, ``commit_info``, ``datetime``,
``version``, ``benchmarks``: one per (path, phase, size, world size) that was measured, named
``<path>/<phase>/ws<ws>/<size>`` (size as ``1e7``), ``group`` ``<path>/<phase>``, ``stats``
(bench/stats.py over the repeats' times) and ``extra_info`` (path, phase, world_size,
state_elements, state_bytes, unit_bytes, floor_min_s, floor_median_s, floor, ratio =
stats.min / floor_min_s, peak_bytes per rank, peak_method, gbps = state_bytes / stats.min).
A case that failed is listed under ``failed`` (same name, group, params, and ``error``), not
under ``benchmarks``: it has no times, and ``compare`` then reports it "missing in NEW", a
regression. ``scaling``: per ``<path>/<phase>``, the fitted exponent (``timing.fit_exponent``,
log-log least squares of the minimum time) against state bytes at the largest world size that
has two or more sizes, and against world size at the largest size that has two or more world
sizes, each beside its floor's exponent (null with a ``reason`` where there are fewer than two
points). Files: the JSON, ``<stem>-time-vs-bytes.png``, ``<stem>-time-vs-world-size.png``,
``<stem>-peak-memory.png`` and ``<stem>.html`` next to it, all written atomically.

Exit codes: 0 every case measured, 1 a case failed (the report is still written), 2 usage
error (bad path, size or world size; nothing is measured).
"""
from __future__ import annotations

import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from ..api_paths import PATHS as ALL_PATHS
from .summary import print_summary, size_label

SCHEMA = "fsdp-conformance/bench/1"
PATHS = tuple(p.name for p in ALL_PATHS if p.bench)  # ApiPath.bench
PHASES = ("save", "load")
SIZES = (10**5, 10**6, 10**7)
WORLD_SIZES = (1, 2, 3, 4)
BIG_SIZE = 10**8
BIG_WORLD_SIZES = (4,)
BIG_PATHS = tuple(p.name for p in ALL_PATHS if p.primary)  # ApiPath.primary
QUICK_SIZES = (10**5, 10**6)
QUICK_WORLD_SIZES = (1, 2, 4)
QUICK_REPEATS = 5
MIN_SIZE = 1_000  # state elements: the scaled model needs a few params per layer
MAX_SIZE = 10**9
MAX_WORLD_SIZE = 8
CASE_TIMEOUT_S = 1800.0


def default_repeats(state_elements: int) -> int:
    """Repeats of a case by size (module docstring): 5 up to 1e6, 3 up to 1e7, else 2."""
    return 5 if state_elements <= 10**6 else 3 if state_elements <= 10**7 else 2


@dataclass(frozen=True)
class Point:
    """One measured case of the grid: ``path`` at ``state_elements`` (Adam state elements,
    2 per param) on ``world_size`` ranks, ``repeats`` timed calls per phase."""

    path: str
    state_elements: int
    world_size: int
    repeats: int

    @property
    def n_params(self) -> int:
        return max(1, self.state_elements // 2)

    def name(self, phase: str) -> str:
        return f"{self.path}/{phase}/ws{self.world_size}/{size_label(self.state_elements)}"

    def weight(self) -> float:
        """Rough relative cost (seconds on this machine), for the progress bar's ETA."""
        return 0.5 + self.state_elements / 1e6 * self.world_size / 4 * self.repeats / 3



def build_grid(quick: bool, paths: Sequence[str] | None = None,
               sizes: Sequence[int] | None = None, world_sizes: Sequence[int] | None = None,
               repeats: int | None = None) -> list[Point]:
    """The cases to run (module docstring's grid), ordered by world size, size, path. Given
    ``sizes`` / ``world_sizes`` replace the default grid's (the 1e8 extras included); given
    ``paths`` restricts it; ValueError naming the bad value otherwise."""
    paths = tuple(paths) if paths else PATHS
    unknown = [p for p in paths if p not in PATHS]
    if unknown:
        raise ValueError(f"--paths: unknown path(s) {', '.join(unknown)}; known: {', '.join(PATHS)}")
    if sizes:
        for s in sizes:
            if not (isinstance(s, int) and MIN_SIZE <= s <= MAX_SIZE):
                raise ValueError(f"--sizes: state elements must be whole numbers from "
                                 f"{size_label(MIN_SIZE)} to {size_label(MAX_SIZE)}, got {s!r}")
    if world_sizes:
        for w in world_sizes:
            if not (isinstance(w, int) and 1 <= w <= MAX_WORLD_SIZE):
                raise ValueError(f"--world-sizes: world sizes must be 1-{MAX_WORLD_SIZE}, got {w!r}")
    if repeats is not None and not (isinstance(repeats, int) and repeats >= 1):
        raise ValueError(f"--repeats must be a whole number >= 1, got {repeats!r}")
    custom = bool(sizes or world_sizes)
    sizes = tuple(sorted(set(sizes or (QUICK_SIZES if quick else SIZES))))
    world_sizes = tuple(sorted(set(world_sizes or (QUICK_WORLD_SIZES if quick else WORLD_SIZES))))
    cells = {(p, s, w) for p in paths for s in sizes for w in world_sizes}
    if not quick and not custom:
        cells |= {(p, BIG_SIZE, w) for p in paths if p in BIG_PATHS for w in BIG_WORLD_SIZES}
    def reps(s: int) -> int:
        return repeats if repeats is not None else QUICK_REPEATS if quick else default_repeats(s)
    return [Point(p, s, w, reps(s))
            for p, s, w in sorted(cells, key=lambda c: (c[2], c[1], PATHS.index(c[0])))]


# --- measuring -----------------------------------------------------------------------------

def _case(point: Point):
    from ..cases import Case
    from ..zoo.models import scaled_name

    return Case(api=point.path, optimizer="adam", model=scaled_name(point.n_params),
                plan="nested", world_size=point.world_size, dtype="fp32", steps=1)


def benchmark_entry(point: Point, phase: str, m: dict) -> dict:
    """One pytest-benchmark entry from ``measure_case``'s figures of one phase."""
    from .stats import summarize

    stats = summarize(m["times_s"])
    floor_min = float(m["floor_s"])
    floor_median = summarize(m["floor_times_s"])["median"]
    name = point.name(phase)
    return {
        "name": name, "fullname": f"fsdp_conformance/bench/scaling.py::{name}",
        "group": f"{point.path}/{phase}",
        "params": {"path": point.path, "phase": phase, "world_size": point.world_size,
                   "state_elements": point.state_elements},
        "param": f"{point.path}-{phase}-ws{point.world_size}-{size_label(point.state_elements)}",
        "options": {"repeats": point.repeats, "timer": "time.perf_counter, slowest rank"},
        "stats": stats,
        "extra_info": {
            "path": point.path, "phase": phase, "world_size": point.world_size,
            "state_elements": point.state_elements, "n_params": point.n_params,
            "state_bytes": int(m["state_bytes"]), "unit_bytes": int(m["unit_bytes"]),
            "floor_min_s": floor_min, "floor_median_s": floor_median,
            "floor_times_s": list(m["floor_times_s"]), "floor": m["floor"],
            "ratio": stats["min"] / floor_min if floor_min > 0 else None,
            "peak_bytes": [int(b) for b in m["peak_bytes"]], "peak_method": m["peak_method"],
            "gbps": m["state_bytes"] / stats["min"] / 1e9 if stats["min"] > 0 else None,
        },
    }


def failed_entry(point: Point, phase: str, error: str) -> dict:
    """The ``failed`` list's entry of a case that raised (module docstring)."""
    name = point.name(phase)
    return {"name": name, "group": f"{point.path}/{phase}",
            "params": {"path": point.path, "phase": phase, "world_size": point.world_size,
                       "state_elements": point.state_elements},
            "error": error}


def run_grid(points: Sequence[Point], *, backend: str | None = None,
             on_start: Callable[[Point], None] = lambda p: None,
             on_done: Callable[[Point, str | None], None] = lambda p, e: None,
             ) -> tuple[list[dict], list[dict]]:
    """Measure every point (each in a fresh temporary work directory, deleted after);
    returns (benchmarks, failed). A case that raises is recorded with its error and the
    next one runs."""
    from ..bounds.measure import measure_case

    benches: list[dict] = []
    failed: list[dict] = []
    for point in points:
        on_start(point)
        error = None
        try:
            with tempfile.TemporaryDirectory(prefix="fsdpc-bench-") as work:
                res = measure_case(_case(point), work, repeats=point.repeats, backend=backend,
                                   timeout=CASE_TIMEOUT_S)
            benches += [benchmark_entry(point, ph, res[ph]) for ph in PHASES]
        except Exception as e:  # noqa: BLE001 - recorded in the report, the run goes on
            error = f"{type(e).__name__}: {e}".strip()
            tb = traceback.format_exc(limit=3)
            failed += [failed_entry(point, ph, f"{error}\n{tb}") for ph in PHASES]
        on_done(point, error)
    return benches, failed


# --- scaling fits --------------------------------------------------------------------------

def _fit(xs: list[float], ts: list[float], fs: list[float]) -> tuple[float | None, float | None]:
    from ..bounds.timing import fit_exponent

    if len(set(xs)) < 2:
        return None, None
    k = fit_exponent(xs, ts) if all(t > 0 for t in ts) else None
    kf = fit_exponent(xs, fs) if all(f > 0 for f in fs) else None
    return k, kf


def _fit_along(pts: list[dict], fixed: str, x: str, lists: dict[str, str]) -> dict:
    """The fit of time (and floor) against ``x`` over the points that share the largest
    value of ``fixed`` at which two or more distinct ``x`` were measured: {fixed: value,
    exponent, floor_exponent, times_s, floor_times_s, and per ``lists`` entry (output key ->
    point key) the points' values}; {exponent: None, floor_exponent: None, reason} when
    there is no such value."""
    at = [v for v in sorted({p[fixed] for p in pts})
          if len({p[x] for p in pts if p[fixed] == v}) >= 2]
    if not at:
        return {"exponent": None, "floor_exponent": None,
                "reason": f"no {fixed.replace('_', ' ')} was measured at two or more "
                          f"{x.replace('_', ' ')} values"}
    sel = sorted((p for p in pts if p[fixed] == at[-1]), key=lambda p: p[x])
    times, floors = [p["min"] for p in sel], [p["floor_min_s"] for p in sel]
    k, kf = _fit([p[x] for p in sel], times, floors)
    return {fixed: at[-1], "exponent": k, "floor_exponent": kf,
            **{key: [p[src] for p in sel] for key, src in lists.items()},
            "times_s": times, "floor_times_s": floors}


def _group_order(group: str) -> tuple[int, int, str]:
    """``<path>/<phase>`` in PATHS order, save before load."""
    path, _, phase = group.rpartition("/")
    return (PATHS.index(path) if path in PATHS else len(PATHS),
            PHASES.index(phase) if phase in PHASES else len(PHASES), group)


def scaling_block(benchmarks: Sequence[dict]) -> dict:
    """Per ``<path>/<phase>``: ``state_size`` (fit against state bytes at the largest world
    size with two or more sizes) and ``world_size`` (fit against world size at the largest
    size with two or more world sizes), each {exponent, floor_exponent, the points} or
    {exponent: null, reason} (module docstring)."""
    by_group: dict[str, list[dict]] = {}
    for b in benchmarks:
        by_group.setdefault(b["group"], []).append(b["extra_info"] | {"min": b["stats"]["min"]})
    out: dict[str, dict] = {}
    for group in sorted(by_group, key=_group_order):
        pts = by_group[group]
        entry: dict[str, Any] = {}
        entry["state_size"] = _fit_along(pts, "world_size", "state_bytes",
                                         {"state_elements": "state_elements",
                                          "state_bytes": "state_bytes"})
        entry["world_size"] = _fit_along(pts, "state_elements", "world_size",
                                         {"world_sizes": "world_size"})
        out[group] = entry
    return out


# --- the report ----------------------------------------------------------------------------

def _version() -> str:
    try:
        from importlib.metadata import version

        return version("fsdp-conformance")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "unknown"


def build_report(points: Sequence[Point], benchmarks: list[dict], failed: list[dict], *,
                 quick: bool, backend: str | None, wall_time_s: float) -> dict:
    """The report dict (module docstring)."""
    from ..report import machine_info

    info = machine_info()
    return {
        "schema": SCHEMA, "bench": "scaling", "machine_info": info, "commit_info": info.get("commit_info"),
        "datetime": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "version": _version(), "benchmark": "scaling", "quick": quick,
        "backend": backend or "gloo", "wall_time_s": wall_time_s,
        "grid": {"paths": sorted({p.path for p in points}, key=PATHS.index),
                 "cases": [{"path": p.path, "state_elements": p.state_elements,
                            "world_size": p.world_size, "repeats": p.repeats} for p in points]},
        "benchmarks": benchmarks, "failed": failed, "scaling": scaling_block(benchmarks),
    }


def artifact_paths(out: str | Path) -> dict[str, Path]:
    """The files written beside the JSON ``out``: PNGs and the HTML page, by kind."""
    out = Path(out)
    stem = out.with_suffix("")
    return {"time_vs_bytes": Path(f"{stem}-time-vs-bytes.png"),
            "time_vs_world_size": Path(f"{stem}-time-vs-world-size.png"),
            "peak_memory": Path(f"{stem}-peak-memory.png"),
            "html": Path(f"{stem}.html")}


def write_report(report: dict, out: str | Path) -> dict[str, Path]:
    """Write the JSON, the PNGs and the HTML page atomically; returns their paths."""
    from ..report import write_json_atomic
    from .plots import write_plots_and_html

    write_json_atomic(out, report)
    return {"json": Path(out), **write_plots_and_html(report, artifact_paths(out))}


# --- terminal ------------------------------------------------------------------------------

def _progress():
    """A progress bar on stderr: cases done / total, elapsed, ETA. The bar advances by each
    case's estimated cost (``Point.weight``), so the ETA allows for the big cases to come."""
    from rich.console import Console
    from rich.progress import (BarColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    return Progress(TextColumn("{task.description}"), BarColumn(),
                    TextColumn("cases {task.fields[done]}/{task.fields[cases]}"),
                    TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                    console=Console(stderr=True), speed_estimate_period=24 * 3600)


def main(out: str = "reports/bench-scaling.json", quick: bool = False,
         paths: Sequence[str] | None = None, sizes: Sequence[int] | None = None,
         world_sizes: Sequence[int] | None = None, repeats: int | None = None,
         backend: str | None = None) -> int:
    """Run the grid, print progress (stderr) and the summary (stdout), write the report.
    Returns 0 (all measured), 1 (a case failed) or 2 (usage error; nothing run)."""
    try:
        points = build_grid(quick, paths, sizes, world_sizes, repeats)
    except ValueError as e:
        print(f"fsdp-conformance bench scaling: error: {e}", file=sys.stderr)
        return 2
    from rich.markup import escape

    progress = _progress()
    total = sum(p.weight() for p in points)
    t0 = time.perf_counter()
    done = [0]
    with progress:
        task = progress.add_task("starting", total=total, done=0, cases=len(points))

        def start(p: Point) -> None:
            progress.update(task, description=f"{p.path} ws{p.world_size} "
                                              f"{size_label(p.state_elements)}")

        def finish(p: Point, error: str | None) -> None:
            done[0] += 1
            progress.update(task, advance=p.weight(), done=done[0])
            if not progress.console.is_terminal:  # a log file: one line per case instead
                t = progress.tasks[0]
                eta = t.time_remaining
                progress.console.print(
                    f"[{done[0]}/{len(points)}] {p.path} ws{p.world_size} "
                    f"{size_label(p.state_elements)} {'failed' if error else 'done'}; "
                    f"elapsed {time.perf_counter() - t0:.0f} s, ETA "
                    f"{'?' if eta is None else f'{eta:.0f} s'}", highlight=False)
            if error:
                progress.console.print(f"[red]failed[/red] {p.path} ws{p.world_size} "
                                       f"{size_label(p.state_elements)}: {escape(error.splitlines()[0])}")

        benches, failed = run_grid(points, backend=backend, on_start=start, on_done=finish)
    report = build_report(points, benches, failed, quick=quick, backend=backend,
                          wall_time_s=time.perf_counter() - t0)
    files = write_report(report, out)
    print_summary(report, files)
    return 1 if failed else 0
