"""``fsdp-conformance bounds``: calibrate the P13/P14 bounds and prove they hold.

- ``bounds calibrate [--runs N] [--out PATH] [--tier quick|full] [--world-sizes 1,2,3,4]``:
  measures the tier's bounds cases N times (``measure.measure_case``) and writes the
  calibration file (bounds.calibration_data: the fits of bounds.py's rules with every observed
  point), atomically; default this machine's own (``rules.calibration_dir``), never the
  packaged file. A case whose
  path raises (a torch bug with this model at this world size) is not measured: the file
  lists it under ``unmeasured`` with torch's error, and the run's bounds case then shows that
  error (a known torch limitation where one explains it exactly). ``--refit`` measures
  nothing: it refits the file's own observations under the current rules. ``-k EXPR --add``
  measures only the bounds cases EXPR selects (a new path's) and adds their fits to the
  existing file, keeping every other entry: the file must have been measured on this machine
  (same fingerprint), since one file's bounds are one machine's.
- ``bounds stability [--runs N] [--calibration PATH] [--out reports/bounds-stability.json]``:
  runs the tier's bounds cases N times in a row through the conformance runner (P13 with the
  scaling fits, P14) and writes JSON and Markdown: per run whether every P13/P14 verdict
  passed, and per path/phase the worst work/bound, time/bound and peak/bound over all
  runs, plus how often 3x the work, a 3x slower wall time, a doubled peak and an extra
  copy of the rank's share of the state would have exceeded the bound.

Exit codes: 0 written (stability: every run passed), 1 some stability run failed, 2 usage
error (bad world sizes, unreadable calibration).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

STABILITY_SCHEMA = "fsdp-conformance/bounds-stability/1"

HELP = """\
Calibrate the timing and memory bounds (P13, P14) on this machine, or prove they hold.

  bounds calibrate   measure the tier's bounds cases --runs times and write this machine's
                     calibration (by default where `fsdp-conformance run` finds it by
                     itself: $FSDPC_CALIBRATION_DIR or ~/.cache/fsdp-conformance/bounds/,
                     one file per machine fingerprint). A case whose path raises is listed
                     as unmeasured with torch's error. --refit measures nothing and refits
                     the file's own observations. -k EXPR --add measures only the cases
                     EXPR selects (a new path's) and adds them to the file, which must come
                     from this machine.
  bounds stability   run the bounds cases --runs times in a row as the conformance run
                     does, and write JSON and Markdown: whether every run passed, the worst
                     time, work and peak against their bounds per path and phase, and how
                     often 3x the work, a 3x slower wall time, a doubled peak or an extra
                     copy of the state would have been caught. --slow-python slows every
                     rank's interpreter; --load N runs N busy processes beside the runs.

Exit codes: 0 written (stability: every run passed), 1 a stability run failed, 2 usage
error (bad world sizes, an unreadable calibration).

Examples:
  fsdp-conformance bounds calibrate --runs 5
  fsdp-conformance bounds calibrate -k fsdp1.dsd_full_broadcast --add --runs 8 \
      --out fsdp_conformance/data/bounds.json
  fsdp-conformance bounds stability --runs 3 --load 3
"""


def add_parser(sub) -> None:
    b = sub.add_parser("bounds", help="calibrate the timing/memory bounds (P13/P14) or prove "
                                      "they hold N runs in a row",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    bsub = b.add_subparsers(dest="bounds_command", required=True)
    for name, help_ in (("calibrate", "measure the bounds cases N times and fit the bounds"),
                        ("stability", "run the bounds cases N times against the calibration")):
        p = bsub.add_parser(name, help=help_)
        p.add_argument("--runs", type=int, default=5 if name == "calibrate" else 20,
                       help="how many runs of every bounds case")
        p.add_argument("--tier", choices=["quick", "full"], default="quick")
        p.add_argument("--world-sizes", default="1,2,3,4", help="comma-separated")
        p.add_argument("--backend", choices=["gloo", "nccl"], default=None)
        p.add_argument("--timeout", type=float, default=300.0,
                       help="seconds one case may take on the ranks")
    bsub.choices["calibrate"].add_argument(
        "--out", default=None, help="calibration file (default: this machine's own, "
                                    "<calibration dir>/<machine fingerprint>.json, which the "
                                    "run finds by itself; the directory is "
                                    "$FSDPC_CALIBRATION_DIR, else ~/.cache/fsdp-conformance/"
                                    "bounds)")
    bsub.choices["calibrate"].add_argument(
        "-k", dest="keyword", default=None, metavar="EXPR",
        help="only the bounds cases this expression selects (run -k's grammar)")
    bsub.choices["calibrate"].add_argument(
        "--add", action="store_true",
        help="add the selected cases' fits to the existing calibration file (measured on this "
             "machine), keeping its other entries; with -k, to calibrate a new path alone")
    bsub.choices["calibrate"].add_argument(
        "--refit", action="store_true", help="refit the existing file's observations under "
                                             "bounds.py's current rules; measure nothing")
    st = bsub.choices["stability"]
    st.add_argument("--calibration", default=None,
                    help="calibration file (default: this machine's own if there is one, "
                         "else the packaged one, as the run chooses)")
    st.add_argument("--out", default="reports/bounds-stability.json",
                    help="JSON output; the Markdown goes beside it (.md)")
    st.add_argument("--slow-python", action="store_true",
                    help="slow every rank's interpreter (bounds/slowdown.py) while memcpy keeps "
                         "its speed: the bounds must still hold")
    st.add_argument("--load", type=int, default=0, metavar="N",
                    help="run N busy processes beside the runs (competing load)")


def _cases(args) -> list:
    from . import matrix

    from ..usage import parse_world_sizes

    ws = parse_world_sizes(args.world_sizes)
    if args.runs < 1:
        raise ValueError(f"--runs must be >= 1, got {args.runs}")
    cases = [c for c in matrix.TIERS[args.tier](matrix.default_paths()) if c.bounds]
    cases = matrix.select(cases, world_sizes=ws, keyword=getattr(args, "keyword", None))
    if not cases:
        raise ValueError(f"no bounds case of the {args.tier} tier is selected by "
                         f"-k {args.keyword!r} and --world-sizes {args.world_sizes}")
    return cases


def _facts(args, cases) -> dict:
    import torch

    from ..report.io import machine_info

    return {"torch_version": torch.__version__, "machine_info": machine_info(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": "fsdp-conformance " + " ".join(sys.argv[1:]),
            "tier": args.tier, "cases": [c.id for c in cases]}


def _last_error_line(exc) -> str:
    """The exception line of the first failing rank's traceback (what torch raised)."""
    for f in exc.failures:
        for ln in reversed([ln for ln in f.detail.splitlines() if ln.strip()]):
            if not ln.startswith((" ", "\t")) and ":" in ln:
                return f"rank {f.rank}: {ln.strip()}"
    return exc.summary


def _existing_for_add(out: Path) -> dict:
    """The calibration file ``--add`` adds to: readable, and measured on this machine (one
    file's bounds are one machine's); a CalibrationError naming what is wrong otherwise."""
    import json

    from ..report.io import machine_info
    from ..bounds.rules import CalibrationError, parse_calibration

    try:
        data = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CalibrationError(f"{out}: --add needs an existing calibration file ({e})") from None
    parse_calibration(data, str(out))
    theirs = (data.get("machine_info") or {}).get("fingerprint")
    mine = machine_info().get("fingerprint")
    if theirs != mine:
        raise CalibrationError(f"{out} was measured on machine {theirs}, this is {mine}: "
                               f"--add would mix two machines' bounds in one file; calibrate "
                               f"every path here instead (without --add)")
    return data


def add_to(base: dict, new: dict) -> dict:
    """``base`` (a calibration file's JSON) with ``new``'s fits added: its time, work,
    memory and scaling entries and unmeasured cases replace those of the same key, every
    other entry of ``base`` is kept; the cases are the union, and ``added`` records the
    command, date and cases of every addition."""
    if base.get("rules") != new.get("rules"):
        from ..bounds.rules import CalibrationError

        raise CalibrationError("the calibration file was fitted under other rules than this "
                               "version's: refit it first (bounds calibrate --refit)")
    out = dict(base)
    for section in ("time", "work", "memory", "scaling", "unmeasured"):
        out[section] = dict(sorted({**base.get(section, {}), **new.get(section, {})}.items()))
    old = list(base.get("cases", []))
    out["cases"] = old + [c for c in new["cases"] if c not in old]
    out["added"] = list(base.get("added", [])) + [
        {"command": new["command"], "created": new["created"], "runs": new["runs"],
         "cases": new["cases"]}]
    return out


def calibrate(args) -> int:
    import tempfile

    from ..bounds.rules import BOUNDS_REPEATS, calibration_data, machine_calibration
    from ..harness import close_pools
    from ..bounds.measure import measure_case
    from ..report.io import write_json_atomic

    out = Path(args.out) if args.out else machine_calibration()
    if args.refit:
        import json

        from ..bounds.rules import CalibrationError, refit

        try:
            data = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise CalibrationError(f"{out}: cannot read the calibration to refit ({e})") from None
        write_json_atomic(out, refit(data, str(out)))
        print(f"refitted {out} under the current rules")
        return 0
    from ..harness.errors import RankError

    base = _existing_for_add(out) if args.add else None
    cases = _cases(args)
    runs = []
    unmeasured: dict[str, str] = {}
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="fsdpc-cal-") as tmp:
            for i in range(args.runs):
                run = []
                for c in cases:
                    if c.id in unmeasured:
                        continue
                    try:
                        run.append((c, measure_case(c, Path(tmp) / f"{i}",
                                                    repeats=BOUNDS_REPEATS,
                                                    backend=args.backend,
                                                    timeout=args.timeout)))
                    except RankError as exc:  # torch raised in the path: nothing to time
                        unmeasured[c.id] = _last_error_line(exc)
                        print(f"[calibrate] not measured: {c.id}: {unmeasured[c.id]}",
                              file=sys.stderr, flush=True)
                runs.append(run)
                print(f"[calibrate] run {i + 1}/{args.runs}: {len(cases)} cases, "
                      f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    finally:
        close_pools()
    data = calibration_data(runs, **_facts(args, cases), repeats=BOUNDS_REPEATS)
    data["unmeasured"] = unmeasured
    if base is not None:
        data = add_to(base, data)
    write_json_atomic(out, data)
    print(f"wrote {out}: {len(data['time'])} time keys, {len(data['memory'])} memory keys, "
          f"{len(data['scaling'])} scaling keys from {args.runs} runs")
    return 0


def bound_failures(results) -> list[tuple]:
    """``(result, property)`` for every P13/P14 verdict of one run that is neither a pass nor
    a known torch limitation (a path that raises an exactly modelled bug has no bound to
    break)."""
    return [(r, p) for r in results for p in ("P13", "P14")
            if r.properties[p].status not in ("pass", "known")]


def stability_summary(runs: list[list], calibration: str) -> dict:
    """The stability report from N runs' CaseResults (module docstring)."""
    from .bounds_kind import REMEASURED

    per_run, worst = [], {}
    for i, results in enumerate(runs):
        bad = [f"{r.case.id} {p}: {r.properties[p].detail.splitlines()[0] if r.properties[p].detail else ''}"
               for r, p in bound_failures(results)]
        known = sorted({f"{r.case.id}: {r.properties[p].known}" for r in results
                        for p in ("P13", "P14") if r.properties[p].status == "known"})
        again = sorted({r.case.id for r in results for p in ("P13", "P14")
                        if REMEASURED in r.properties[p].detail})
        per_run.append({"run": i + 1, "passed": not bad, "cases": len(results),
                        "remeasured": again, "failures": bad, "known": known})
        for r in results:
            for phase, m in r.measurements.items():
                w = worst.setdefault(f"{r.case.api}/{phase}", {
                    "time_over_bound": 0.0, "work_over_bound": 0.0, "peak_over_bound": 0.0,
                    "measurements": 0, "slow3x_exceeds": 0, "work3x_exceeds": 0,
                    "peak2x_exceeds": 0, "copy_exceeds": 0, "peak2x_checked": 0,
                    "peaks": 0, "negligible_peaks": 0, "speed_max": 1.0})
                if not m.get("time_bound_s"):
                    continue
                w["measurements"] += 1
                w["speed_max"] = max(w["speed_max"], float(m.get("speed", 1.0)))
                w["time_over_bound"] = max(w["time_over_bound"], m["time_s"] / m["time_bound_s"])
                w["work_over_bound"] = max(w["work_over_bound"], m["cpu_s"] / m["work_bound_s"])
                w["slow3x_exceeds"] += 3 * m["time_s"] > m["time_bound_s"]
                w["work3x_exceeds"] += 3 * m["cpu_s"] > m["work_bound_s"]
                shard = -(-int(m["state_bytes"]) // int(m["world_size"]))
                for peak, bound, q in zip(m["peak_bytes"], m["mem_bound_bytes"],
                                          m["mem_negligible"]):
                    w["peak_over_bound"] = max(w["peak_over_bound"], peak / bound)
                    w["peaks"] += 1
                    w["copy_exceeds"] += peak + shard > bound
                    if q:  # a call that allocates almost nothing (bounds/rules.py)
                        w["negligible_peaks"] += 1
                        continue
                    w["peak2x_checked"] += 1
                    w["peak2x_exceeds"] += 2 * peak > bound
    return {"schema": STABILITY_SCHEMA, "calibration": calibration, "runs": len(runs),
            "runs_passed": sum(r["passed"] for r in per_run),
            "all_passed": all(r["passed"] for r in per_run), "per_run": per_run,
            "worst": dict(sorted(worst.items()))}


def _machine(s: dict) -> str:
    m = s.get("machine_info") or {}
    return (f"{m.get('node', '?')} ({m.get('cpu_model', '?')}, {m.get('cpu_count', '?')} CPUs, "
            f"fingerprint {m.get('fingerprint', '?')})")


def stability_markdown(s: dict) -> str:
    out = ["# Bounds stability (P13, P14)", "",
           f"**{s['runs_passed']} of {s['runs']} runs passed** (every P13 and P14 verdict of "
           f"every bounds case, scaling fits included); calibration `{s['calibration']}`.", "",
           f"- command: `{s.get('command', '')}`", f"- torch {s.get('torch_version', '?')}, "
           f"{s.get('created', '')}, {s.get('wall_time_s', 0):.0f} s in all, "
           f"load average at start {s.get('loadavg_start', '?')}; interpreter slowed "
           f"(--slow-python): {'yes' if s.get('slow_python') else 'no'}; competing busy "
           f"processes: {s.get('competing_processes', 0)}",
           f"- machine: {_machine(s)}", "",
           "| run | passed | cases | measured twice (first measurement failed) | failures |",
           "|---:|---|---:|---|---|"]
    for r in s["per_run"]:
        fails = "; ".join(r["failures"]).replace("|", "\\|")[:300]
        again = ", ".join(f"`{c}`" for c in r.get("remeasured", [])) or "none"
        out.append(f"| {r['run']} | {'yes' if r['passed'] else 'NO'} | {r['cases']} | {again} "
                   f"| {fails} |")
    known = sorted({k for r in s["per_run"] for k in r.get("known", [])})
    if known:
        out += ["", "Not timed, in every run: the path raises a known torch limitation there "
                "(P13/P14 \"known\", not a failure of the bounds):", "",
                *(f"- `{k}`" for k in known)]
    out += ["", "Worst over all runs (above 1 exceeds the bound); the last three columns: of "
            "the measurements, how many 3x the work (CPU time) / a 3x slower wall time / a "
            "doubled peak / an extra copy of the rank's share of the state (state / world "
            "size) on top of its peak would have failed. Peaks are per rank; \"2x peak\" "
            "counts the ranks whose calibrated peak is 5% of their base or more, the others "
            "(\"negligible\": a call that allocates almost nothing, bounded at +512 KiB) "
            "are counted apart:", "",
            "| path/phase | worst work/bound | worst time/bound | worst peak/bound "
            "| 3x work fails | 3x wall fails | 2x peak fails | negligible peaks "
            "| extra shard fails | largest speed |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, w in s["worst"].items():
        out.append(f"| {key} | {w['work_over_bound']:.2f} | "
                   f"{w['time_over_bound']:.2f} | {w['peak_over_bound']:.2f} | "
                   f"{w['work3x_exceeds']}/{w['measurements']} | "
                   f"{w['slow3x_exceeds']}/{w['measurements']} | "
                   f"{w['peak2x_exceeds']}/{w['peak2x_checked']} | "
                   f"{w['negligible_peaks']}/{w['peaks']} | "
                   f"{w['copy_exceeds']}/{w['peaks']} | {w.get('speed_max', 1.0):.2f} |")
    return "\n".join(out) + "\n"


def _busy(n: int) -> list:
    """``n`` busy processes (competing load), each ending by itself after an hour at most."""
    import subprocess

    if n < 0:
        raise ValueError(f"--load must be >= 0, got {n}")
    code = "import time\nend = time.time() + 3600\nwhile time.time() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def stability(args) -> int:
    import os

    from ..bounds.rules import find_calibration, load_calibration
    from ..harness import close_pools
    from ..report.io import write_json_atomic, write_text_atomic
    from .execute import run_cases

    cases = _cases(args)
    cal = str(find_calibration(args.calibration)[0])
    load_calibration(cal)
    if args.slow_python:
        from ..harness.worker import RANK_SETUP_ENV
        from ..bounds.slowdown import SETUP

        os.environ[RANK_SETUP_ENV] = SETUP
    busy = _busy(args.load)
    load0 = open("/proc/loadavg").read().split()[0] if os.path.exists("/proc/loadavg") else "?"
    runs = []
    t0 = time.perf_counter()
    try:
        for i in range(args.runs):
            results = run_cases(cases, backend=args.backend, timeout=args.timeout,
                                calibration=cal)
            runs.append(results)
            ok = not bound_failures(results)
            print(f"[stability] run {i + 1}/{args.runs}: {'pass' if ok else 'FAIL'}, "
                  f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    finally:
        close_pools()
        for p in busy:
            p.kill()
            p.wait(timeout=10)
    s = stability_summary(runs, cal)
    s.update(_facts(args, cases), wall_time_s=time.perf_counter() - t0, loadavg_start=load0,
             slow_python=bool(args.slow_python), competing_processes=args.load)
    out = Path(args.out)
    write_json_atomic(out, s)
    write_text_atomic(out.with_suffix(".md"), stability_markdown(s))
    print(f"{s['runs_passed']}/{s['runs']} runs passed; wrote {out}, {out.with_suffix('.md')}")
    return 0 if s["all_passed"] else 1


def main(args) -> int:
    from ..bounds.rules import CalibrationError

    try:
        return calibrate(args) if args.bounds_command == "calibrate" else stability(args)
    except (ValueError, CalibrationError) as e:
        print(f"fsdp-conformance bounds {args.bounds_command}: error: {e}", file=sys.stderr)
        return 2
