"""Compare two reports of the same kind, BASE and NEW (``fsdp-conformance compare``): what
changed, and whether any of it is a regression. This is what gates a torch upgrade: BASE is
the current torch's report, NEW the candidate's; different torch versions, backends, tiers
and machines are expected and named in the header, never refused.

Which module implements what (each states its rules):

- report/diff_read.py: reading a report, its kind and schema checks (ReportFormatError);
- report/diff_runs.py: run reports: verdict transitions (the regression table), scaling;
- report/diff_bench.py: benchmark reports, matched by name;
- report/diff_measure.py: timings against their floors, per-rank peaks, the minimums;
- report/diff_model.py: Change, Comparison (compare/1 JSON), Thresholds, output order;
- report/diff_render.py: text, rich and Markdown renderings.

This module reads two files and compares them (:func:`compare_files`: both of one kind, or
a :class:`ReportFormatError`, a usage error, exit code 2) and is the face the CLI and
callers import from.
"""
from __future__ import annotations

import os

from .diff_bench import compare_benches
from .diff_measure import (MIN_MEMORY_DELTA_BYTES, MIN_MEMORY_SHARE, MIN_SCALING_EXPONENT_DELTA,
                           MIN_TIME_DELTA_S, PHASES, Timing, compare_peaks, compare_timing,
                           min_memory_delta, timing_of_benchmark, timing_of_measurement)
from .diff_model import (BENCH_SCHEMA, CATEGORIES, COMPARE_SCHEMA, LABELS, RUN_SCHEMA, Change,
                         Comparison, Thresholds)
from .diff_read import bench_facts, load_any, run_facts
from .diff_render import header_lines, render_markdown, render_rich, render_text, sections
from .diff_runs import classify_status, compare_runs
from .run_report import ReportFormatError


def compare_files(base_path: str | os.PathLike, new_path: str | os.PathLike,
                  th: Thresholds = Thresholds()) -> Comparison:
    """Read and compare two reports of the same kind; ReportFormatError (a usage error)
    when either is unreadable or of another schema, or when their kinds differ."""
    bkind, base = load_any(base_path)
    nkind, new = load_any(new_path)
    if bkind != nkind:
        names = {"run": f"a run report ({RUN_SCHEMA})", "bench": f"a benchmark report ({BENCH_SCHEMA})"}
        raise ReportFormatError(f"{new_path}: is {names[nkind]} but BASE {base_path} is "
                                f"{names[bkind]}: compare two run reports or two benchmark reports")
    if bkind == "bench" and (base.get("bench") or "scaling") != (new.get("bench") or "scaling"):
        raise ReportFormatError(f"{new_path}: is the {new.get('bench') or 'scaling'} benchmark "
                                f"but BASE {base_path} the {base.get('bench') or 'scaling'} "
                                f"one: compare two reports of one benchmark")
    fn = compare_runs if bkind == "run" else compare_benches
    return fn(base, new, th, base_path=str(base_path), new_path=str(new_path))


__all__ = [
    "BENCH_SCHEMA", "CATEGORIES", "COMPARE_SCHEMA", "LABELS", "MIN_MEMORY_DELTA_BYTES",
    "MIN_MEMORY_SHARE", "MIN_SCALING_EXPONENT_DELTA", "MIN_TIME_DELTA_S", "PHASES", "RUN_SCHEMA",
    "Change", "Comparison", "ReportFormatError", "Thresholds", "Timing", "bench_facts",
    "classify_status", "compare_benches", "compare_files", "compare_peaks", "compare_runs",
    "compare_timing", "header_lines", "load_any", "min_memory_delta", "render_markdown",
    "render_rich", "render_text", "run_facts", "sections", "timing_of_benchmark",
    "timing_of_measurement",
]
