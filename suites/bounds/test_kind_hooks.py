"""The bounds kind schedules its cases through the kind hooks the run calls (run/kinds.py,
run/lifecycle.py ``CaseKind``), not through code of the run's own: its cases run alone, a
case still failing P13/P14 runs once more (``again``), and the scaling fit folds into P13
of each path's largest-world-size case (``finish``)."""
from __future__ import annotations

from fsdp_conformance.bounds import rules
from fsdp_conformance.run.bounds_kind import BoundsKind
from fsdp_conformance.cases import Case
from fsdp_conformance.options import RunOptions
from fsdp_conformance.properties.verdict import Verdict, fail, passed
from fsdp_conformance.report.result import CaseResult
from fsdp_conformance.run.kinds import finish_kinds, kind_record


def _result(ws: int, p13: Verdict = passed("fine"), p14: Verdict = passed("fine")):
    case = Case(api="fsdp1.full", model=rules.BOUNDS_MODEL, plan="nested", optimizer="adam",
                dtype="fp32", world_size=ws, steps=1, bounds=True)
    return CaseResult(case=case, properties={"P13": p13, "P14": p14},
                      measurements={"save": {"time_s": 0.01}})


def test_bounds_cases_run_alone_and_a_failing_one_runs_again():
    assert kind_record(_result(2).case).alone
    assert not kind_record(Case(api="fsdp1.full", world_size=2)).alone
    kind = BoundsKind()
    assert not kind.again(_result(2))
    assert kind.again(_result(2, p14=fail("over the bound")))
    assert kind.again(_result(2, p13=fail("slow")))


def test_finish_folds_a_failing_scaling_fit_into_p13_of_the_largest_world_size(monkeypatch):
    block = {"fsdp1.full/save": {"status": "fail", "detail": "exponent 2.9 > allowed 1.4"}}
    monkeypatch.setattr(rules, "scaling_of", lambda results, calibration=None: block)
    results = [_result(ws) for ws in (1, 2, 4, 3)]
    out, got = finish_kinds(results, RunOptions())
    assert got == block
    p13 = {r.case.world_size: r.properties["P13"] for r in out}
    assert p13[4].status == "fail" and p13[4].detail.startswith("scaling: exponent 2.9")
    assert all(p13[ws].status == "pass" for ws in (1, 2, 3))
    assert [r.case.world_size for r in out] == [1, 2, 4, 3]  # order kept


def test_finish_without_measured_cases_changes_nothing():
    plain = CaseResult(case=Case(api="fsdp1.full", world_size=2),
                       properties={"P13": passed("n/a here")})
    out, block = finish_kinds([plain], RunOptions())
    assert out == [plain] and block == {}
