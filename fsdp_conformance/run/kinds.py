"""Which kind of case a ``Case`` is (run/lifecycle.py ``CaseKind``).

Rule: a bounds case (``case.bounds``) measures; a golden case (``case.golden``) loads a
stored fixture; a fault case (``case.fault``) damages what was saved; every other case is a
round trip. The one place that reads those flags.
"""
from __future__ import annotations

from ..cases import Case
from ..properties.verdict import Verdict
from .lifecycle import CaseKind, all_props


def kind_of(case: Case) -> CaseKind:
    """The kind that runs ``case`` (module rule)."""
    if case.bounds:
        from ..bounds.kind import BoundsKind

        return BoundsKind()
    if case.golden:
        from ..golden.kind import GoldenKind

        return GoldenKind()
    if case.fault:
        from .fault_kind import FaultKind

        return FaultKind()
    from .roundtrip_kind import RoundTripKind

    return RoundTripKind()


def failed_verdicts(case: Case, v: Verdict, kind: CaseKind | None = None) -> dict[str, Verdict]:
    """The verdicts of a case of ``kind`` (default ``kind_of(case)``) that could not run:
    ``v`` for every property it decides, its usual n/a for the others (before known
    limitations)."""
    kind = kind or kind_of(case)
    return {**kind.undecided(case), **all_props(v, kind.decides(case))}
