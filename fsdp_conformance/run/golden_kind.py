"""The golden-fixture kind of case (P12): load a stored checkpoint instead of saving one.

Rules
- The fixture's files are copied into the case's work directory (never loaded in place,
  never written under the fixtures root) and every file's sha256 and size is checked first:
  a missing, truncated or altered file makes P12 "error" naming the file, of origin
  "suite" (damaged data is not a torch failure, so no known limitation applies).
- Then the path's load side runs on a pool of the destination world size and P12 is judged
  (properties/golden_props.py). Only P12 is decided; every other property is n/a.
"""
from __future__ import annotations

from ..cases import Case
from ..properties.catalogue import PROPS
from ..properties.expectation import EXACT, Expectation
from ..properties.golden_props import p12_verdict
from ..properties.verdict import Verdict, error, na, suite_error
from .lifecycle import Outcome, Step
from ..api_paths import api_path
from ..sut.asks import SideAsks
from ..golden.case import copy_verified, find_fixture
from ..golden.manifest import EXPECTED_FILE
from ..golden.manifest import FixtureError

ASKS = SideAsks(load_only=True)
"""A golden case's load side stops after the load (P12 judges the loaded state alone)."""

ONLY_P12 = "golden-fixture case: only P12 (loading a stored checkpoint) is checked"


class GoldenKind:
    """P12: a stored fixture through a load path (module rules)."""

    name = "golden"

    def decides(self, case: Case) -> tuple[str, ...]:
        return ("P12",)

    def undecided(self, case: Case) -> dict[str, Verdict]:
        return {p: na(ONLY_P12) for p in PROPS if p != "P12"}

    def run(self, step: Step) -> Outcome:
        import torch

        case = step.case
        try:
            fx = find_fixture(case)
        except FixtureError as exc:
            return Outcome(verdicts={"P12": error(str(exc))})
        problems = copy_verified(fx, step.workdir)
        if problems:
            return Outcome(verdicts={"P12": suite_error(
                "\n".join(problems) + "\n(the fixture is damaged: this is not a torch "
                                      "failure; restore it from version control)")})
        expected = torch.load(step.workdir / EXPECTED_FILE, weights_only=True)
        obs = step.on_pool("load side", case.dst_world_size, api_path(case.api).load_side,
                           after=(ASKS,))
        step.timings["load"] = max(o.timings.get("load", 0.0) for o in obs)
        def judge(exp: Expectation) -> dict[str, Verdict]:
            return {"P12": p12_verdict(case, fx, expected, obs, exp=exp)}

        verdicts = judge(EXACT)
        return Outcome(verdicts=verdicts, judge=judge)
