"""P13 (time) and P14 (memory) of a bounds case: its measurements, annotated with their
bounds under the calibration (bounds/rules.py ``annotate``), judged.

Rules
- P13: every phase's work (CPU time) and wall time (slowest rank, min of the repeats) <=
  its bound ``a x floor + c x speed`` (the floor's CPU time, resp. wall time; ``speed``
  this machine's interpreter and dispatch speed against the calibrating machine's, measured
  in the same run: bounds/rules.py); after the run, the path's time growth with world size must stay
  within the calibrated allowance above the floor's (``scaling_verdict``).
- P14: every rank's peak memory during the call <= its bound (the DESIGN bound of the rank's
  role, times the factor calibrated for the path and phase, plus a fixed allowance).
- A calibration key missing makes both verdicts errors naming it.
"""
from __future__ import annotations

from ..bounds.rules import PHASES, Calibration, CalibrationError, annotate, mb_text, ms_text
from ..cases import Case
from .verdict import Verdict, error, fail, passed


def p13_time(case: Case, meas: dict) -> Verdict:
    """P13 (time part) from annotated measurements: in both phases the work (CPU time) and
    the wall time within their bounds; the detail has a line per phase and clock, the
    failing ones first."""
    lines = []
    for phase in PHASES:
        m = meas[phase]
        for clock, t, bound, a, floor, c, reps in (
                ("work", m["cpu_s"], m["work_bound_s"], m["work_a"], m["floor_cpu_s"],
                 m["work_c_s"], m["cpu_times_s"]),
                ("time", m["time_s"], m["time_bound_s"], m["time_a"], m["floor_s"],
                 m["time_c_s"], m["times_s"])):
            ok = t <= bound
            ratio = f"{t / floor:.1f}" if floor > 0 else "n/a"
            what = "CPU" if clock == "work" else "wall"
            lines.append((ok, (
                f"{case.api} {phase}: {clock} ({what}) {ms_text(t)} {'<=' if ok else '>'} bound "
                f"{ms_text(bound)} = a {a:.3g} x floor {ms_text(floor)} + c {ms_text(c)} x "
                f"speed {m.get('speed', 1.0):.2f} ({clock}/floor {ratio}, {clock}/bound "
                f"{t / bound:.2f}); floor ops: {m['floor']}; repeats "
                f"{', '.join(ms_text(x) for x in reps)}")))
    lines += [(True, f"{case.api} {ph}: {meas[ph]['speed_detail']} (probes, CPU time here / "
                     f"at calibration)") for ph in PHASES if meas[ph].get("speed_detail")]
    detail = "\n".join(line for ok, line in sorted(lines, key=lambda x: x[0]))
    return passed(detail) if all(ok for ok, _ in lines) else fail(detail)


def p14_memory(case: Case, meas: dict) -> Verdict:
    """P14 from annotated measurements: every rank's peak within its bound in both phases."""
    lines, bad = [], False
    for phase in PHASES:
        m = meas[phase]
        for r, (peak, bound) in enumerate(zip(m["peak_bytes"], m["mem_bound_bytes"])):
            ok = peak <= bound
            bad |= not ok
            lines.append(f"{case.api} {phase} rank {r}: peak {mb_text(peak)} {'<=' if ok else '>'} "
                         f"bound {mb_text(bound)} = {m['mem_bound_made_of'][r]} "
                         f"(peak/bound {peak / bound:.2f}; {m['peak_method']})")
    detail = "\n".join(lines)
    return fail(detail) if bad else passed(detail)


def verdicts(case: Case, meas: dict, cal: Calibration) -> tuple[dict, Verdict, Verdict]:
    """(annotated measurements, P13, P14) of a bounds case; a calibration key missing makes
    both verdicts errors naming it (the measurements come back unannotated)."""
    try:
        ann = annotate(case, meas, cal)
    except CalibrationError as e:
        return meas, error(str(e)), error(str(e))
    return ann, p13_time(case, ann), p14_memory(case, ann)


def scaling_verdict(p13: Verdict, s: dict) -> Verdict:
    """P13 of a path's largest-world-size case with its scaling fit ``s`` folded in."""
    if s.get("status") == "fail":
        return fail(f"scaling: {s['detail']}\n\n{p13.detail}")
    if s.get("status") == "error" and p13.status == "pass":
        return error(s["detail"])
    return p13


__all__ = ["p13_time", "p14_memory", "scaling_verdict", "verdicts"]
