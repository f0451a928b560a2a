"""``fsdp-conformance merge``: the reports of a run's parts (``run --shard I/N``) as one
report, as if one run had decided every case.

Rules
- The parts must be of one run: the same schema, torch, backend, tier, seed, selection
  (``-k``), world sizes and bounds mode, and the same part count; each part once. Anything
  else is a usage error naming the file and the field.
- No case is in two parts (an error naming it). The merged report holds every part's cases
  (sorted by id), its summary counted again over them, the scaling blocks of the parts
  (each path's in one part: run/shards.py), the wall time of the slowest part and the sum
  of the parts' in ``parts_wall_time_s``; ``machine_info`` is the first part's and
  ``parts`` lists each part's file, machine and wall time.
- A part missing from the set, or a part whose report is incomplete or lacks a case it
  planned, makes the merged report incomplete (``incomplete`` says which): not ok.
- The merged report's selection is the run's (``-k``, world sizes, ``--case`` ids as the
  parts' ``shard.case_ids`` record them), not one part's: compare reads it as the whole
  run.
"""
from __future__ import annotations

import os
from typing import Sequence

from ..usage import UsageError
from .run_report import load_report, summarize, verdict_flags

SAME = ("torch_version", "backend", "tier", "seed", "selection", "world_sizes", "bounds_mode")
"""The fields every part of one run has alike."""


def merge_reports(paths: Sequence[str | os.PathLike]) -> dict:
    """One run report from the parts' reports at ``paths`` (module rules)."""
    if not paths:
        raise UsageError("merge needs the parts' reports")
    docs = [(str(p), load_report(p)) for p in paths]
    first_path, first = docs[0]
    for path, d in docs:
        if not d.get("shard"):
            raise UsageError(f"{path}: not a part of a run (no 'shard': written by run "
                             f"--shard I/N)")
        for k in SAME:
            if d.get(k) != first.get(k):
                raise UsageError(f"{path}: {k} is {d.get(k)!r}, {first_path} has "
                                 f"{first.get(k)!r}: not parts of one run")
        if d["shard"]["count"] != first["shard"]["count"]:
            raise UsageError(f"{path}: part of {d['shard']['count']}, {first_path} of "
                             f"{first['shard']['count']}")
    count = first["shard"]["count"]
    index: dict[int, str] = {}
    for path, d in docs:
        i = d["shard"]["index"]
        if i in index:
            raise UsageError(f"part {i}/{count} given twice: {index[i]} and {path}")
        index[i] = path
    seen: dict[str, str] = {}
    cases = []
    scaling: dict = {}
    why = []
    for path, d in docs:
        for c in d["cases"]:
            if c["id"] in seen:
                raise UsageError(f"case {c['id']!r} is in two parts: {seen[c['id']]} and {path}")
            seen[c["id"]] = path
            cases.append(c)
        scaling.update(d.get("scaling") or {})
        decided = {c["id"] for c in d["cases"]}
        lacking = [i for i in d.get("selected_ids") or () if i not in decided]
        if d.get("incomplete") or lacking:
            why.append(f"part {d['shard']['index']}/{count} ({path}): "
                       + (d.get("incomplete") or f"{len(lacking)} planned case(s) not decided"))
    missing = sorted(set(range(1, count + 1)) - set(index))
    if missing:
        why.append(f"part(s) {', '.join(f'{i}/{count}' for i in missing)} not given")
    cases.sort(key=lambda c: c["id"])
    summary = summarize(cases)
    planned = sum(len(d.get("selected_ids") or d["cases"]) for _, d in docs)
    out = {k: v for k, v in first.items() if k not in ("cases", "summary", "scaling", "shard",
                                                      "incomplete", "planned_cases")}
    out.update({
        "selected_ids": list(first["shard"].get("case_ids") or ()),
        "wall_time_s": max(float(d["wall_time_s"]) for _, d in docs),
        "parts_wall_time_s": round(sum(float(d["wall_time_s"]) for _, d in docs), 1),
        "parts": [{"file": path, "shard": f"{d['shard']['index']}/{count}",
                   "machine": (d.get("machine_info") or {}).get("fingerprint"),
                   "wall_time_s": d["wall_time_s"], "argv": d.get("argv")}
                  for path, d in sorted(docs, key=lambda pd: pd[1]["shard"]["index"])],
        "started": min(d["started"] for _, d in docs),
        "finished": max(d["finished"] for _, d in docs),
        **verdict_flags(summary, first.get("bounds_mode", "gate"), "; ".join(why)),
        "summary": summary,
    })
    if scaling:
        out["scaling"] = scaling
    if why:
        out["incomplete"] = "; ".join(why)
        out["planned_cases"] = planned
    out["cases"] = cases
    return out
