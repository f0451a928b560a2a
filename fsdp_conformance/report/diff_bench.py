"""Comparing two benchmark reports (schema ``fsdp-conformance/bench/1``): benchmarks are
matched by name; one only in BASE is "missing in NEW" (a regression), one only in NEW
"added in NEW"; each pair's time (stats.min / stats.median over extra_info's floor) and
per-rank peaks (extra_info.peak_bytes) by report/diff_measure.py's rules.
"""
from __future__ import annotations

from .diff_measure import (compare_peaks, compare_timing, mib_text, min_memory_delta, ms_text,
                           peaks_of, timing_of_benchmark)
from .diff_model import Change, Comparison, Thresholds, facts_notes, sorted_changes
from .diff_read import bench_facts


def compare_benches(base: dict, new: dict, th: Thresholds = Thresholds(), *,
                    base_path: str = "BASE", new_path: str = "NEW") -> Comparison:
    """Compare two benchmark reports: benchmarks matched by name (module docstring)."""
    bb = {b["name"]: b for b in base["benchmarks"]}
    nb = {b["name"]: b for b in new["benchmarks"]}
    changes: list[Change] = []
    for name in sorted(bb.keys() | nb.keys()):
        if name not in nb:
            changes.append(Change("missing in NEW", name, "", "present", "absent"))
            continue
        if name not in bb:
            changes.append(Change("added in NEW", name, "", "absent", "present"))
            continue
        b, n = bb[name], nb[name]
        t = compare_timing(timing_of_benchmark(b), timing_of_benchmark(n), th.max_slowdown)
        if t:
            changes.append(Change(t[0], name, "time", ms_text(b["stats"]["min"]),
                                  ms_text(n["stats"]["min"]), t[1]))
        bp = peaks_of(b.get("extra_info") or {}, f"{base_path}: benchmark {name!r}: extra_info")
        np_ = peaks_of(n.get("extra_info") or {}, f"{new_path}: benchmark {name!r}: extra_info")
        if bp is not None and np_ is not None:
            for label, detail in compare_peaks(bp, np_, th.max_memory_growth,
                                               min_memory_delta(n.get("extra_info") or {})):
                changes.append(Change(label, name, "memory", mib_text(max(bp, default=0)),
                                      mib_text(max(np_, default=0)), detail))
    bf, nf = bench_facts(base), bench_facts(new)
    # the machine by its fingerprint: its line also holds the load, which differs every run
    notes = facts_notes(bf, nf, ("torch", "fingerprint"))
    notes.append(f"{len(bb.keys() & nb.keys())} benchmark(s) in both reports compared")
    return Comparison("bench", base_path, new_path, bf, nf, th, sorted_changes(changes), tuple(notes))
