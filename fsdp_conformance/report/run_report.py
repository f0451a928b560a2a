"""The report of ``fsdp-conformance run`` (schema ``fsdp-conformance/run/1``): one JSON
document with every case's verdicts and timings plus a summary, and its renderings (a
``rich`` matrix for the terminal, Markdown for humans and CI artefacts).

Rules:
- Two verdicts, apart: **correctness** (every property but the bounds ones: what torch
  computes, the same on any machine) holds when none of its (case, property) verdicts is
  ``fail`` or ``error``; **bounds** (P13 time, P14 memory: judged against a calibration and
  this machine's measured speed) holds when none of theirs is. ``bounds_mode`` says whether
  the bounds verdict gates the run ("gate"), is reported only ("advisory"), or no bounds
  case ran ("off": the run is a slice of its tier, report/diff_runs.py ``slice_of``).
- A run is ``ok`` when correctness holds, the bounds hold or are advisory, and the run is
  complete. Exit status of ``fsdp-conformance run`` (``exit_code``): 0 ok; 1 correctness
  failed (or both); 3 correctness held and bounds failed under "gate"; 2 usage error;
  130 / 143 interrupted.
- Counts in the summary and in the matrix are over (case, property) pairs, except
  ``summary.known``, which counts *cases* per known-limitation key.
- Everything here renders from the JSON dict alone, so a report loaded from disk renders
  exactly like a fresh one.
- Bounds cases carry ``measurements`` ({save, load}: time, floor, ratio, bounds, peaks per
  rank; bounds.py), and a run with any has a top-level ``scaling`` block (per path/phase:
  the world-size fit of time and floor); both as report/diff.py reads them.
"""
from __future__ import annotations

import json
import os
import re
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterable

from ..known.declared import declared_reason
from .detail import first_lines, readable
from ..properties.verdict import STATUSES
from .io import machine_info, write_json_atomic, write_text_atomic
from .result import CaseResult  # noqa: F401  (re-exported: the report's record)

SCHEMA = "fsdp-conformance/run/1"
_SCHEMA_PREFIX, _SCHEMA_MAJOR = SCHEMA.rsplit("/", 1)

SYMBOLS = {"pass": "✓", "fail": "✗", "known": "k", "n/a": "–", "error": "E", "removed": "R"}
LEGEND = ("N✓ pass · N✗ fail · NE error · Nk known torch limitation · N– not applicable · "
          "NR API removed from this torch; counts are (case, property) pairs")
FAILING = ("fail", "error")
DETAIL_LINES_MD = 80  # lines of a failure's detail shown in Markdown (all of it is in the JSON)
DETAIL_LINES_TERM = 4  # lines shown in the terminal
FIXED_UPSTREAM = ("the torch under test no longer shows it. For one of this package's entries, "
                  "confirm with the entry's reproducer and report it upstream of this package "
                  "(a clone retires it in fsdp_conformance/known/entries.py); for one your "
                  "tests declare (fsdp_known), drop the declaration")


class ReportFormatError(ValueError):
    """A file that is not a run report of a schema this package reads."""


def prop_key(prop: str) -> tuple[int, str]:
    """Sort key putting P2 before P10 (numeric), anything unexpected last."""
    m = re.fullmatch(r"P(\d+)", prop)
    return (int(m.group(1)), "") if m else (1 << 30, prop)


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _case_entry(r: CaseResult) -> dict:
    out = {"id": r.case.id, **r.case.to_dict(),
           "properties": {p: r.properties[p].to_json() for p in sorted(r.properties, key=prop_key)},
           "timings": {k: float(v) for k, v in r.timings.items()}}
    if r.measurements:
        out["measurements"] = r.measurements
    if getattr(r, "rerun", ""):
        out["rerun"] = r.rerun
    if getattr(r, "setup", None):
        out["setup"] = r.setup
    return out


def _speeds(cases: list[dict]) -> list[float]:
    """The speed (bounds/rules.py) every measured phase was judged at."""
    return [float(m["speed"]) for c in cases for m in (c.get("measurements") or {}).values()
            if isinstance(m, dict) and isinstance(m.get("speed"), (int, float))]


def summarize(cases: list[dict]) -> dict:
    """Summary of case entries (as in ``report["cases"]``).

    ``by_status``: verdicts per status (every status listed, zeros included);
    ``by_path``: {api: {Pn: {status: count}}} (non-zero counts only);
    ``failing_cases``: sorted ids with any fail/error; ``known``: {key: number of cases with
    a "known" verdict under that key}; ``fixed_upstream``: [case id, Pn, key] for every
    verdict that passes although a known limitation is recorded for it; ``removed``: {api:
    the first "removed" verdict's detail} for every path whose torch API is gone
    (run/removal.py); ``removed_fixtures``: the golden fixtures ("<torch>/<name>") whose every
    load path is removed, so this torch cannot read them at all."""
    from ..properties.catalogue import BOUNDS_PROPS

    by_status = Counter({s: 0 for s in STATUSES})
    by_kind = {kind: Counter({s: 0 for s in STATUSES}) for kind in ("correctness", "bounds")}
    by_path: dict[str, dict[str, Counter]] = {}
    failing, fixed = set(), []
    known: dict[str, set[str]] = {}
    removed: dict[str, str] = {}
    for c in cases:
        path = by_path.setdefault(c["api"], {})
        for prop, v in c["properties"].items():
            by_status[v["status"]] += 1
            by_kind["bounds" if prop in BOUNDS_PROPS else "correctness"][v["status"]] += 1
            path.setdefault(prop, Counter())[v["status"]] += 1
            if v["status"] in FAILING:
                failing.add(c["id"])
            if v["status"] == "known" and v.get("known"):
                known.setdefault(v["known"], set()).add(c["id"])
            if v.get("fixed_upstream"):
                fixed.append([c["id"], prop, v.get("known", "")])
            if v["status"] == "removed":
                removed.setdefault(c["api"], v.get("detail", ""))
    speeds = _speeds(cases)
    bounds = {s: by_kind["bounds"][s] for s in STATUSES}
    return {
        "cases": len(cases),
        "by_status": {s: by_status[s] for s in STATUSES},
        "correctness": {s: by_kind["correctness"][s] for s in STATUSES},
        "bounds": {**bounds, "judged": bounds["pass"] + bounds["fail"] + bounds["known"],
                   "over": bounds["fail"],
                   "cases": sum(1 for c in cases if c.get("measurements")),
                   "speed_min": min(speeds) if speeds else None,
                   "speed_max": max(speeds) if speeds else None},
        "by_path": {api: {p: {s: cnt[s] for s in STATUSES if cnt[s]}
                          for p, cnt in sorted(props.items(), key=lambda kv: prop_key(kv[0]))}
                    for api, props in sorted(by_path.items())},
        "failing_cases": sorted(failing),
        "known": {k: len(ids) for k, ids in sorted(known.items())},
        "fixed_upstream": sorted(fixed),
        "removed": dict(sorted(removed.items())),
        "removed_fixtures": _unreadable_fixtures(cases, set(removed)),
        "rerun": sorted(c["id"] for c in cases if c.get("rerun")),
    }


def _unreadable_fixtures(cases: list[dict], removed: set[str]) -> list[str]:
    """The golden fixtures of ``cases`` whose format no load path outside ``removed`` reads
    (the registered paths that write a format read it: golden/formats.py)."""
    from ..api_paths import api_path, paths_writing

    return sorted({c["golden"] for c in cases if c.get("golden") and removed
                   and set(paths_writing(api_path(c["api"]).file_format)) <= removed})


def build_report(results: Iterable[CaseResult], *, tier: str, backend: str, seed: int,
                 world_sizes: Iterable[int], wall_time_s: float, argv: list[str],
                 selection: str | None = None, selected_ids: Iterable[str] = (),
                 tolerances: dict[str, dict[str, float]] | None = None,
                 calibration: str | os.PathLike | None = None,
                 scaling: dict | None = None, incomplete: str = "",
                 planned: int | None = None, bounds_mode: str = "gate") -> dict:
    """The run report as a JSON-ready dict; cases sorted by id. ``started`` is ``finished``
    (now, UTC) minus ``wall_time_s``; ``ok`` is false iff any verdict is fail or error, or
    the run is incomplete. ``scaling`` (only when some case has measurements) is the run's
    own block (run/execute.py ``Run.scaling``, computed once); when not given it is
    computed here under the bounds ``calibration`` file (default: the packaged one).
    ``incomplete``: why the run stopped early ("" = it did not); then the report holds the
    ``planned`` count beside the decided cases. ``bounds_mode``: "gate", "advisory" or "off"
    (module rules); the report says which calibration the bounds were judged by.
    ``selection`` / ``selected_ids``: the run's ``-k`` expression and ``--case`` ids."""
    import torch

    from .paths import portable

    results = list(results)
    # files named as a reader elsewhere finds them (report/paths.py): torch/..., not the
    # writer's site-packages; argv stays as the user typed it
    cases = portable(sorted((_case_entry(r) for r in results), key=lambda c: c["id"]))
    extra: dict = {}
    if scaling is None and any(c.get("measurements") for c in cases):
        from ..bounds.rules import scaling_of

        scaling = scaling_of(results, calibration)
    if scaling:
        extra["scaling"] = scaling
    if incomplete:
        extra["incomplete"] = incomplete
        extra["planned_cases"] = planned if planned is not None else len(cases)
    summary = summarize(cases)
    if summary["bounds"]["cases"]:
        from ..bounds.rules import calibration_facts

        extra["bounds_calibration"] = portable(calibration_facts(calibration))
    finished = _now()
    started = finished - timedelta(seconds=float(wall_time_s))
    return {
        "schema": SCHEMA,
        "torch_version": torch.__version__,
        "backend": backend,
        "tier": tier,
        "seed": seed,
        "world_sizes": sorted(world_sizes),
        "selection": selection,
        "selected_ids": list(selected_ids),
        "argv": list(argv),
        "machine_info": machine_info(),
        "started": started.isoformat(timespec="seconds"),
        "finished": finished.isoformat(timespec="seconds"),
        "wall_time_s": float(wall_time_s),
        "tolerances": dict(tolerances or {}),
        **verdict_flags(summary, bounds_mode, incomplete),
        "bounds_mode": bounds_mode,
        "summary": summary,
        **extra,
        "cases": cases,
    }


def verdict_flags(summary: dict, bounds_mode: str, incomplete: str) -> dict:
    """``ok``, ``correctness_ok`` and ``bounds_ok`` of a report with this ``summary``
    (module rules): a run of one job and the parts of a run merged (report/merge.py) alike."""
    correct = summary["correctness"]["fail"] == 0 and summary["correctness"]["error"] == 0
    bounds_ok = summary["bounds"]["fail"] == 0 and summary["bounds"]["error"] == 0
    return {"ok": correct and (bounds_ok or bounds_mode == "advisory") and not incomplete,
            "correctness_ok": correct, "bounds_ok": bounds_ok}


def check_schema(data: Any, source: str | os.PathLike = "<report>") -> dict:
    """``data`` if it is a run report of major version 1 (``fsdp-conformance/run/1`` or
    ``.../run/1.x``), else ReportFormatError naming ``source`` and both schemas."""
    got = data.get("schema") if isinstance(data, dict) else None
    prefix, _, version = str(got).rpartition("/")
    if not (isinstance(got, str) and prefix == _SCHEMA_PREFIX
            and version.split(".", 1)[0] == _SCHEMA_MAJOR):
        what = f"schema {got!r}" if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        raise ReportFormatError(f"{source}: not a run report this version reads: expected "
                                f"schema {SCHEMA!r} (major {_SCHEMA_MAJOR}), got {what}")
    return data


def load_report(path: str | os.PathLike) -> dict:
    """Read a run report; ReportFormatError (naming the file) if it is not valid JSON or not
    of schema ``fsdp-conformance/run/1``."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ReportFormatError(f"{path}: not valid JSON ({e}); expected a run report of "
                                f"schema {SCHEMA!r}") from None
    return check_schema(data, path)


def write_run_report(report: dict, json_path: str | os.PathLike,
                     md_path: str | os.PathLike) -> tuple[Path, Path]:
    """Write the JSON and its Markdown rendering, each atomically, parents created."""
    return write_json_atomic(json_path, report), write_text_atomic(md_path, render_markdown(report))


# --- rendering -----------------------------------------------------------------------------

def format_counts(counts: dict[str, int]) -> str:
    """A matrix cell: "12✓ 1✗ 2k 3–" (statuses in STATUSES order, zeros omitted)."""
    return " ".join(f"{counts[s]}{SYMBOLS[s]}" for s in STATUSES if counts.get(s))


def summary_rows(report: dict) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the matrix: one row per API path (sorted), a "cases" column, then one
    column per property that appears in the run (P0..P16 order); empty cell = not run."""
    by_path = report["summary"]["by_path"]
    props = sorted({p for v in by_path.values() for p in v}, key=prop_key)
    n_cases = Counter(c["api"] for c in report["cases"])
    rows = [[api, str(n_cases[api])] + [format_counts(by_path[api].get(p, {})) for p in props]
            for api in sorted(by_path)]
    return ["path", "cases", *props], rows


def property_names(props) -> str:
    """"P0 layout, P1 save, ..." for the matrix's property columns (catalogue names)."""
    from ..properties.catalogue import CATALOGUE

    names = {p.id: p.name for p in CATALOGUE}
    return ", ".join(f"{p} {names.get(p, '?')}" for p in props)


def failures(report: dict) -> list[tuple[str, str, dict]]:
    """Every failing (case id, property, verdict json), in case-id then property order."""
    return [(c["id"], p, v) for c in report["cases"]
            for p, v in sorted(c["properties"].items(), key=lambda kv: prop_key(kv[0]))
            if v["status"] in FAILING]


def failing_ids(report: dict) -> tuple[str, ...]:
    """The ids of the cases with a failing (case, property), in ``failures`` order."""
    return tuple(dict.fromkeys(cid for cid, _, _ in failures(report)))


def rerun_command(case_id: str) -> str:
    """The command that reruns exactly this case: ``fsdp-conformance run --case`` for a case
    of the conformance matrix (a full-tier case's id is in the full tier only); ``pytest --fsdp-case`` for a case a test of the user's made (its
    own save/load, ``custom:``, or its own model: no zoo model), which only their tests
    can build."""
    quoted = "'" + case_id.replace("'", "'\"'\"'") + "'"
    if _plugin_case(case_id):
        return f"pytest --fsdp-case {quoted}"
    return f"fsdp-conformance run --case {quoted}"


def _plugin_case(case_id: str) -> bool:
    from ..zoo import MODELS

    parts = case_id.split("/")
    if "custom:" in parts[0]:
        return True
    model = next((p.split(".")[0] for p in parts[1:] if "." in p), "")
    return bool(model) and model not in MODELS


def exit_code(report: dict) -> int:
    """The exit status of ``fsdp-conformance run`` for ``report`` (module rules)."""
    if report.get("ok"):
        return 0
    return 3 if _correct(report) and not report.get("incomplete") else 1


def _correct(report: dict) -> bool:
    """Whether the correctness verdict holds (reports before the split: every verdict)."""
    if "correctness_ok" in report:
        return bool(report["correctness_ok"])
    s = report["summary"]["by_status"]
    return s["fail"] == 0 and s["error"] == 0


def bounds_line(report: dict) -> str:
    """The bounds verdict in one line: judged, over, errors, the calibration and the speed
    they were judged at, and whether they gate; "" for a run without bounds cases."""
    b = report["summary"].get("bounds") or {}
    if not b.get("cases"):
        return ""
    cal = report.get("bounds_calibration") or {}
    over, err = b.get("fail", 0), b.get("error", 0)
    state = "OK" if not over and not err else (
        f"{over} over" + (f", {err} error" if err else "") + " on this machine")
    where = ("calibrated on this machine" if cal.get("same_machine")
             else f"calibrated on another machine ({_machine_text(cal.get('fitted_on') or {})})"
             if cal.get("fitted_on") else "calibration unreadable")
    lo, hi = b.get("speed_min"), b.get("speed_max")
    speed = (f", judged at speed {lo:.2f}-{hi:.2f} (this machine's probes against the "
             f"calibration's)" if lo is not None else "")
    mode = report.get("bounds_mode", "gate")
    tail = "" if state == "OK" else (" (advisory: does not fail the run)" if mode == "advisory"
                                     else "; see the P13/P14 lines below")
    return (f"bounds {state}: {b.get('judged', 0)} P13/P14 verdicts of {b['cases']} bounds "
            f"cases, {where}{speed}{tail}")


def _machine_text(m: dict) -> str:
    return (f"{m.get('node', '?')}: {m.get('cpu_model', 'CPU not recorded')}, "
            f"{m.get('cpu_count', '?')} CPUs, fingerprint {m.get('fingerprint', 'none')}")


def headline(report: dict) -> str:
    """One line: OK/FAILED, cases, verdicts per status, fixed-upstream count; then the
    correctness and the bounds verdicts apart (``verdict_lines``)."""
    s = report["summary"]
    counts = ", ".join(f"{s['by_status'].get(k, 0)} {k}" for k in STATUSES)
    if report.get("incomplete"):  # never OK; say what the decided cases showed
        bad = s["by_status"]["fail"] or s["by_status"]["error"]
        return (f"INCOMPLETE ({report['incomplete']}; {report.get('planned_cases', '?')} "
                f"planned): {'failing' if bad else 'no failure'} so far: {s['cases']} cases; "
                f"{counts}; {len(s['fixed_upstream'])} fixed upstream?")
    word = "OK" if report["ok"] else ("FAILED (bounds only)" if exit_code(report) == 3
                                      else "FAILED")
    return (f"{word}: {s['cases']} cases; {counts}; "
            f"{len(s['fixed_upstream'])} fixed upstream?{removed_line(s)}")


def next_steps(report: dict) -> list[str]:
    """What to do after a run that did not pass, one line each ([] after an OK run): where
    the details are, how to rerun one failing case, and, for bounds that failed alone, the
    two ways on (calibrate this machine, or gate on correctness)."""
    if report.get("ok") and not report.get("incomplete"):
        return []
    out = []
    fails = failures(report)
    if not _correct(report) and fails:
        cid = fails[0][0]
        out += [f"next: read each failure's detail in the HTML/Markdown report beside the "
                f"JSON; rerun one case alone: {rerun_command(cid)}",
                "next: a known torch limitation that no longer explains a failure names what "
                "it does not explain; a new torch? compare with a baseline: fsdp-conformance "
                "compare <baseline.json> <this report>"]
    elif exit_code(report) == 3:
        out.append("next: only the timing/memory bounds failed; they come from a calibration "
                   "(the bounds line names it). On a new machine: fsdp-conformance bounds "
                   "calibrate, then run again; or gate on correctness alone: --bounds advisory")
    if report.get("incomplete"):
        out.append("next: the run was stopped; the report holds the cases decided so far: "
                   "run again to decide the rest")
    return out


def verdict_lines(report: dict) -> list[str]:
    """The two verdicts apart, a line each: correctness, then bounds (where measured)."""
    s = report["summary"]
    c = s.get("correctness") or s["by_status"]
    ok = _correct(report)
    lines = [f"correctness {'OK' if ok else 'FAILED'}: {s['cases']} cases; {c.get('fail', 0)} "
             f"fail, {c.get('error', 0)} error, {c.get('known', 0)} known, {c.get('pass', 0)} "
             f"pass, {c.get('n/a', 0)} n/a"]
    b = bounds_line(report)
    rerun = s.get("rerun") or []
    r = ([f"rerun: {len(rerun)} case{'s' if len(rerun) != 1 else ''} where a rank died in the "
          f"first attempt (verdicts from the second; see \"Reruns\"): {', '.join(rerun)}"]
         if rerun else [])
    return lines + ([b] if b else []) + r


def removed_line(summary: dict) -> str:
    """"; API removed: N paths (a, b); fixtures only removed paths read: x, y", or ""."""
    removed = summary.get("removed") or {}
    if not removed:
        return ""
    fixtures = summary.get("removed_fixtures") or []
    return (f"; API removed: {len(removed)} path{'s' if len(removed) != 1 else ''} "
            f"({', '.join(removed)})"
            + (f"; fixtures only removed paths read: {', '.join(fixtures)}" if fixtures else ""))


def machine_line(report: dict) -> str:
    """The machine in one line: node (arch, CPU model, CPUs, GPUs, fingerprint, load)."""
    m = report.get("machine_info", {})
    gpus = ", ".join(m.get("cuda_devices") or []) or "no GPU"
    extra = "".join(f", {k} {m[k]}" for k in ("fingerprint",) if m.get(k))
    load = f", load {m['load_avg_1m']}" if m.get("load_avg_1m") is not None else ""
    cpu = f"{m['cpu_model']}, " if m.get("cpu_model") else ""
    return (f"{m.get('node', '?')} ({m.get('machine', '?')}, {cpu}{m.get('cpu_count', '?')} "
            f"CPUs, {gpus}{extra}{load})")


def render_table(report: dict, console=None) -> None:
    """Print the matrix (fail/error red, known yellow), then the failing (case, property)
    pairs with the first lines of each detail, then the "fixed upstream?" list."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    styles = {"fail": "bold red", "error": "bold red", "known": "yellow", "n/a": "dim"}
    header, rows = summary_rows(report)
    by_path = report["summary"]["by_path"]
    console.print(Text(f"fsdp-conformance run: torch {report['torch_version']}, {report['backend']}, "
                       f"tier {report['tier']}, {report['wall_time_s']:.1f} s", style="bold"))
    table = Table()
    for col in header:
        table.add_column(col, justify="left" if col == "path" else "right",
                         no_wrap=col == "path")
    for api, ncases, *_ in rows:
        cells = [Text(api), Text(ncases)]
        for p in header[2:]:
            counts = by_path[api].get(p, {})
            cell = Text()
            for s in STATUSES:
                if counts.get(s):
                    cell.append(("" if not cell else " ") + f"{counts[s]}{SYMBOLS[s]}",
                                style=styles.get(s, ""))
            cells.append(cell)
        table.add_row(*cells)
    console.print(table)
    console.print(Text(LEGEND, style="dim"))
    fails = failures(report)
    if fails:
        console.print(Text(f"Failures ({len(fails)}):", style="bold red"))
        for cid, p, v in fails:
            console.print(Text(f"  {cid}  {p}  {v['status']}", style="red"))
            lines, more = first_lines(readable(v.get("detail", "")), DETAIL_LINES_TERM)
            for line in lines:
                console.print(Text("      " + line))
            if more:
                console.print(Text(f"      ... {more} more lines in the JSON report", style="dim"))
            console.print(Text(f"      rerun: {rerun_command(cid)}", style="dim"))
    fixed = report["summary"]["fixed_upstream"]
    if fixed:
        console.print(Text(f"Fixed upstream? ({len(fixed)}): a recorded limitation no longer "
                           "reproduces: " + FIXED_UPSTREAM, style="bold yellow"))
        for cid, p, key in fixed:
            console.print(Text(f"  {cid}  {p}  {key}", style="yellow"))
    for line in verdict_lines(report):
        bad = line.startswith("correctness FAILED") or (line.startswith("bounds") and
                                                       not line.startswith("bounds OK"))
        style = "bold yellow" if line.startswith("rerun") else "bold red" if bad else "bold green"
        console.print(Text(line, style=style))
    console.print(Text(headline(report), style="bold green" if report["ok"] else "bold red"))
    for line in next_steps(report):
        console.print(Text(line, style="bold"))


def _fence(text: str) -> str:
    """A code fence longer than any backtick run in ``text``."""
    runs = [len(m) for m in re.findall(r"`+", text)]
    return "`" * max(3, max(runs, default=0) + 1)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def known_limitations(report: dict) -> list[tuple[str, int, list[str], Any]]:
    """(key, number of cases, properties it is "known" on, its ``KnownLimitation`` or None
    when ``fsdp_conformance/known/entries.py`` no longer records it) per key of
    ``summary.known``, in key order."""
    from ..known.entries import KNOWN

    by_key = {k.key: k for k in KNOWN}
    return [(key, n, sorted({p for c in report["cases"] for p, v in c["properties"].items()
                             if v["status"] == "known" and v.get("known") == key}, key=prop_key),
             by_key.get(key))
            for key, n in report["summary"]["known"].items()]


def _declared_reason(report: dict, key: str) -> str:
    """The user's reason for a limitation their tests declared (known/declared.py), or ""
    when none is."""
    return next((declared_reason(v.get("detail", ""), key) for c in report["cases"]
                 for v in c["properties"].values() if v.get("known") == key
                 and declared_reason(v.get("detail", ""), key)), "")


def bounds_markdown(report: dict) -> list[str]:
    """The "Timing and memory bounds" section: per bounds case and phase the time against its
    floor and P13 bound and the worst rank's peak against its P14 bound, then the scaling
    fits; nothing when the run has no measurements."""
    rows = [(c["api"], c["world_size"], phase, m) for c in report["cases"]
            for phase, m in sorted((c.get("measurements") or {}).items(), reverse=True)]
    scaling = report.get("scaling") or {}
    if not rows and not scaling:
        return []
    out = ["## Timing and memory bounds", "",
           "P13: work (CPU time) and wall time (min over repeats, slowest rank) each <= a x "
           "floor + c; P14: peak memory per rank <= factor x (DESIGN bound) + fixed "
           "(fsdp_conformance/bounds/rules.py). Above 1 in a /bound column exceeds the bound.", "",
           "| path | ws | phase | work ms | work/bound | time ms | floor ms | time/floor "
           "| bound ms | time/bound | max peak MB | peak/bound |",
           "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for api, ws, phase, m in rows:
        tb, wb, w = m.get("time_bound_s"), m.get("work_bound_s"), m.get("cpu_s")
        pk = [(p / b, p) for p, b in zip(m.get("peak_bytes") or [], m.get("mem_bound_bytes") or [])
              if b]
        ratio, t = m.get("ratio"), m["time_s"]
        cells = [api, str(ws), phase, f"{w * 1e3:.2f}" if w is not None else "",
                 f"{w / wb:.2f}" if wb and w is not None else "",
                 f"{t * 1e3:.2f}", f"{m['floor_s'] * 1e3:.2f}",
                 f"{ratio:.1f}" if ratio else "", f"{tb * 1e3:.2f}" if tb else "",
                 f"{t / tb:.2f}" if tb else "", f"{max(m.get('peak_bytes') or [0]) / 1e6:.2f}",
                 f"{max(pk)[0]:.2f}" if pk else ""]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    if scaling:
        out += ["Scaling with world size (work ~ ws^exponent; its floor's beside it):", "",
                "| path/phase | world sizes | exponent | floor exponent | status |",
                "|---|---|---:|---:|---|"]
        for key, s in sorted(scaling.items()):
            out.append(f"| {key} | {', '.join(map(str, s.get('world_sizes', [])))} "
                       f"| {s.get('exponent', 0.0):.2f} | {s.get('floor_exponent', 0.0):.2f} "
                       f"| {s.get('status', '')} |")
        out.append("")
    return out


def render_markdown(report: dict) -> str:
    """The report for humans: title and run facts, the matrix with its legend, Failures
    (detail and rerun command each), API removed (when any), Known torch limitations, Fixed
    upstream?, Not
    applicable (distinct reasons with counts), Tolerances."""
    s = report["summary"]
    out = [f"# fsdp-conformance run: torch {report['torch_version']}, {report['backend']}, "
           f"tier {report['tier']}", ""]
    out += [f"**{headline(report)}**", ""]
    out += [f"- {line}" for line in verdict_lines(report) + next_steps(report)] + [""]
    out += [f"- wall time: {report['wall_time_s']:.1f} s ({report['started']} -> {report['finished']})",
            f"- machine: {machine_line(report)}",
            f"- world sizes: {', '.join(map(str, report['world_sizes']))}; seed {report['seed']}",
            f"- selection: {report['selection'] or 'all cases of the tier'}",
            f"- command: `{' '.join(report['argv'])}`", ""]

    header, rows = summary_rows(report)
    out += ["## Matrix", "", "| " + " | ".join(header) + " |",
            "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    out += ["", f"Legend: {LEGEND}. Properties: {property_names(header[2:])}.", ""]

    fails = failures(report)
    out += [f"## Failures ({len(fails)})", ""]
    if not fails:
        out += ["None.", ""]
    for cid, p, v in fails:
        lines, more = first_lines(readable(v.get("detail", "")), DETAIL_LINES_MD)
        body = "\n".join(lines) + (f"\n... {more} more lines in the JSON report" if more else "")
        fence = _fence(body)
        out += [f"### `{cid}` {p}: {v['status']}", "", fence, body, fence, "",
                f"Rerun: `{rerun_command(cid)}`", ""]

    reruns = [c for c in report["cases"] if c.get("rerun")]
    if reruns:
        out += [f"## Reruns ({len(reruns)})", "",
                "A rank process died in the first attempt of these cases (a signal, an OOM "
                "kill): each ran once more on a fresh pool and its verdicts are the second "
                "attempt's (run/lifecycle.py). The first death is below: a torch crash that "
                "does not come every time is still worth reporting upstream.", ""]
        for c in reruns:
            lines, more = first_lines(c["rerun"], DETAIL_LINES_MD)
            body = "\n".join(lines) + (f"\n... {more} more lines in the JSON report"
                                       if more else "")
            fence = _fence(body)
            out += [f"### `{c['id']}`", "", fence, body, fence, ""]

    removed = s.get("removed") or {}
    if removed:
        out += [f"## API removed ({len(removed)} paths)", "",
                "The torch under test no longer has these paths' API (run/removal.py); their "
                "verdicts are \"removed\", not failures.", ""]
        out += [f"- **{api}**: {detail}" for api, detail in removed.items()]
        if s.get("removed_fixtures"):
            out += ["", "Golden fixtures that only removed paths read (this torch cannot load "
                    "them): " + ", ".join(f"`{f}`" for f in s["removed_fixtures"])]
        out.append("")

    out += ["## Known torch limitations", ""]
    if not s["known"]:
        out += ["None seen in this run.", ""]
    for key, n, props, k in known_limitations(report):
        out.append(f"- **{key}**: {n} case{'s' if n != 1 else ''} ({', '.join(props)})")
        declared = _declared_reason(report, key) if k is None else ""
        if declared:
            out.append(f"  declared by your tests (fsdp_known marker or known=): {declared}")
        elif k is None:
            out.append("  (no longer recorded in fsdp_conformance/known/entries.py)")
        else:
            out += [f"  torch {k.torch_versions}: {k.reason}", f"  Upstream: {k.upstream}"]
    out.append("")

    out += ["## Fixed upstream?", ""]
    if not s["fixed_upstream"]:
        out += ["None.", ""]
    else:
        out += [f"These pass although a known limitation is recorded for them: {FIXED_UPSTREAM}.",
                ""]
        out += [f"- `{cid}` {p}: {key}" for cid, p, key in s["fixed_upstream"]] + [""]

    reasons = Counter((p, v.get("detail") or "(no reason given)") for c in report["cases"]
                      for p, v in c["properties"].items() if v["status"] == "n/a")
    by_reason: dict[str, Counter] = {}
    for (p, reason), n in reasons.items():
        by_reason.setdefault(reason, Counter())[p] += n
    out += ["## Not applicable", ""]
    if not by_reason:
        out += ["None.", ""]
    else:
        out += ["| reason | count | properties |", "|---|---:|---|"]
        for reason, props in sorted(by_reason.items(), key=lambda kv: (-sum(kv[1].values()), kv[0])):
            out.append(f"| {_md_cell(' '.join(reason.split()))} | {sum(props.values())} | "
                       f"{', '.join(sorted(props, key=prop_key))} |")
        out.append("")

    out += bounds_markdown(report)

    out += ["## Tolerances", ""]
    tol = report.get("tolerances") or {}
    if not tol:
        out += ["None stated for this run.", ""]
    else:
        out += ["| dtype | rtol | atol |", "|---|---:|---:|"]
        out += [f"| {d} | {t.get('rtol', '')} | {t.get('atol', '')} |" for d, t in tol.items()]
        out.append("")
    return "\n".join(out)
