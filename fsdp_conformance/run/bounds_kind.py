"""The bounds kind of case (P13/P14): measure a path's save and load, judge them against the
calibration.

Rules
- The path's save and load are measured (``measure.measure_case``, ``BOUNDS_REPEATS``
  repeats) and judged against the calibration file (bounds/rules.py). Noise only ever adds
  time, a real slowdown or extra copy persists: a case whose first measurement fails P13 or
  P14 is measured once more and judged on that second measurement alone (the first failure
  is kept in the detail). A case still failing after that is measured again after every
  other case of the run (``again``; load on a shared machine comes in bursts of seconds to
  minutes), and that later result stands.
- The run's bounds cases run alone, one at a time (run/kinds.py). Once every case is
  decided (``finish``), the scaling fit of each path and phase over the run's measured cases
  is computed, once (``Run.scaling``), and folds into P13 of the path's largest-world-size
  bounds case of the bounds model; the report stores the same block.
- A calibration file that cannot be read makes P13/P14 "error" naming it. Every other
  property is n/a.
"""
from __future__ import annotations

import dataclasses

from ..cases import Case
from ..properties.catalogue import PROPS
from ..properties.verdict import Verdict, error, na
from .lifecycle import Outcome, Step, StepFailed

BOUNDS_ONLY = "bounds case: only P13/P14"
REMEASURED = "measured twice: the first measurement failed"


class BoundsKind:
    """Measure and judge P13/P14 (module rules)."""

    name = "bounds"

    def decides(self, case: Case) -> tuple[str, ...]:
        return ("P13", "P14")

    def undecided(self, case: Case) -> dict[str, Verdict]:
        return {p: na(BOUNDS_ONLY) for p in PROPS if p not in ("P13", "P14")}

    def run(self, step: Step) -> Outcome:
        from ..harness.errors import RankError
        from ..properties import bounds_props
        from ..bounds import rules
        from ..bounds.measure import measure_case

        case = step.case
        try:
            cal = rules.load_calibration(step.env.options.calibration)
        except rules.CalibrationError as exc:
            return Outcome(verdicts={"P13": error(str(exc)), "P14": error(str(exc))})
        first = ""
        for attempt in (1, 2):
            try:
                meas = measure_case(case, step.workdir, repeats=rules.BOUNDS_REPEATS,
                                    backend=step.env.options.backend,
                                    timeout=step.env.options.timeout)
            except RankError as exc:
                raise StepFailed("measuring the path", exc, hung=False) from exc
            meas, p13, p14 = bounds_props.verdicts(case, meas, cal)
            failed = [(p, v) for p, v in (("P13", p13), ("P14", p14)) if v.status == "fail"]
            if not failed or attempt == 2:
                break
            first = "\n".join(f"first measurement, {p}: {v.detail}" for p, v in failed)
        if first:  # the verdicts are the second measurement's; say what the first saw
            p13, p14 = (Verdict(v.status, f"{v.detail}\n({REMEASURED})\n{first}")
                        for v in (p13, p14))
        for ph in ("save", "load"):
            if ph in meas:
                step.timings[ph] = meas[ph]["time_s"]
        return Outcome(verdicts={"P13": p13, "P14": p14}, measurements=meas)

    def again(self, result) -> bool:
        """Whether the run measures ``result``'s case once more (module rules)."""
        return any(result.properties[p].status == "fail" for p in ("P13", "P14"))

    def finish(self, results: list, options) -> tuple[list, dict]:
        """The run's results with each path's scaling fit folded into P13 of its
        largest-world-size bounds case, and the fit (module rules)."""
        from ..bounds import rules
        from ..properties.bounds_props import scaling_verdict

        block = rules.scaling_of(results, options.calibration)
        out = list(results)
        for key, s in block.items():
            api = key.rsplit("/", 1)[0]
            idx = [i for i, r in enumerate(out) if r.case.bounds and r.case.api == api
                   and r.case.model == rules.BOUNDS_MODEL and r.measurements]
            if not idx:
                continue
            i = max(idx, key=lambda j: out[j].case.world_size)
            p13 = scaling_verdict(out[i].properties["P13"], s)
            out[i] = dataclasses.replace(out[i], properties={**out[i].properties, "P13": p13})
        return out, block
