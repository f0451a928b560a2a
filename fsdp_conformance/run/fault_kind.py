"""The fault kind of case (P15): save, damage what was written, load, judge the rejection.

Rules
- The save side runs as in a round trip; a save that raised on a rank is "error" (nothing
  to damage).
- The controller damages the files (run/faults.py); a damage that cannot be applied is an
  error of the suite. Then the load side runs with ``fault_timeout`` and its outcome, a
  result or the pool's ``RankError`` (which ranks raised, died, were left waiting or hung),
  is judged by properties/fault_props.py. Only P15 is decided.
"""
from __future__ import annotations

from ..cases import Case
from ..properties.catalogue import PROPS
from ..properties.fault_props import p15_verdict
from ..properties.verdict import Verdict, error, na, suite_error
from ..sut.records import error_of
from ..api_paths import api_path
from ..sut.asks import SideAsks
from .faults import apply_fault
from .lifecycle import Outcome, StepFailed, Step

ASKS = SideAsks(load_raises=True, keeps_training=False)
"""A fault case's load is let raise on every rank (P15 judges each rank's outcome), and its
save side keeps no training (its files are damaged after the save)."""

ONLY_P15 = "fault case: only P15 is checked"


class FaultKind:
    """Damaged input must be rejected (module rules)."""

    name = "fault"

    def decides(self, case: Case) -> tuple[str, ...]:
        return ("P15",)

    def undecided(self, case: Case) -> dict[str, Verdict]:
        return {p: na(ONLY_P15) for p in PROPS if p != "P15"}

    def run(self, step: Step) -> Outcome:
        import traceback

        case, path = step.case, api_path(step.case.api)
        save_obs = step.on_pool("save side", case.world_size, path.save_side, after=(ASKS,))
        step.timings["save"] = max(o.timings.get("save", 0.0) for o in save_obs)
        failed = [o for o in save_obs if error_of(o.saved)]
        if failed:
            return Outcome(verdicts={"P15": error(
                f"torch raised in the {case.api} save call on rank {failed[0].rank}, so "
                f"nothing could be damaged and loaded:\n{error_of(failed[0].saved)}")})
        try:
            what = apply_fault(case, step.workdir)
        except Exception:  # noqa: BLE001  (the suite's own damage step failed)
            return Outcome(verdicts={"P15": suite_error(
                "could not apply the fault:\n" + traceback.format_exc())})
        try:
            outcome: object = step.on_pool("load side", case.dst_world_size, path.load_side,
                                           timeout=step.env.options.fault_timeout,
                                           after=(ASKS,))
        except StepFailed as exc:
            outcome = exc.exc
        return Outcome(verdicts={"P15": p15_verdict(case, what, outcome)})
