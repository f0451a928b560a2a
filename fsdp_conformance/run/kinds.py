"""Which kind of case a ``Case`` is (run/lifecycle.py ``CaseKind``).

Rule: a bounds case (``case.bounds``) measures; a golden case (``case.golden``) loads a
stored fixture; a fault case (``case.fault``) damages what was saved; every other case is a
round trip. The one place that reads those flags.
"""
from __future__ import annotations

from ..cases import Case
from .lifecycle import CaseKind


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
