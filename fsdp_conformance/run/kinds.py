"""Which kind of case a ``Case`` is (run/lifecycle.py ``CaseKind``): the kinds are
registered, like the API paths (api_paths.py).

Rules
- ``KINDS`` lists every kind once: its name, the ``Case`` flag that selects it and the class
  that runs it (``"module:Class"``, imported when a case of that kind runs). The first kind
  whose flag is set on the case runs it: a bounds case (``case.bounds``) measures; a golden
  case (``case.golden``) loads a stored fixture; a fault case (``case.fault``) damages what
  was saved; a crash case (``case.crash``) kills a save at a chosen point; a case with none of them is a round trip (the kind without a flag, last).
- Adding a kind is its module and one line here; this is the one place that reads those
  flags. How the run schedules a kind's cases is the record's (``alone``) and the kind's
  (its optional ``again`` and ``finish``, run/lifecycle.py ``CaseKind``): the run itself
  knows no kind by name.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from ..cases import Case
from ..properties.verdict import Verdict
from .lifecycle import CaseKind, all_props


@dataclass(frozen=True, kw_only=True)
class KindRecord:
    """One kind of case."""

    name: str
    """The kind's name (reports and errors say it)."""
    flag: str
    """The ``Case`` field that selects it when set; "" for the round trip, the default."""
    impl: str
    """``"module:Class"`` of its ``CaseKind``, imported on first use."""
    alone: bool = False
    """Its cases run one at a time after every other case, on lane 0 with the other lanes
    idle (run/execute.py): the bounds cases measure time and memory."""
    shares: bool = False
    """Its cases may share a save and a training with the cases that save alike
    (run/saves.py): what its save side does is a plain save (the round trip)."""

    def load(self) -> CaseKind:
        """A new instance of the kind's class."""
        module, _, cls = self.impl.partition(":")
        return getattr(importlib.import_module(module), cls)()


KINDS: tuple[KindRecord, ...] = (
    KindRecord(name="bounds", flag="bounds", impl="fsdp_conformance.run.bounds_kind:BoundsKind",
               alone=True),
    KindRecord(name="golden", flag="golden", impl="fsdp_conformance.run.golden_kind:GoldenKind"),
    KindRecord(name="fault", flag="fault", impl="fsdp_conformance.run.fault_kind:FaultKind"),
    KindRecord(name="crash", flag="crash", impl="fsdp_conformance.run.crash_kind:CrashKind"),
    KindRecord(name="round trip", flag="", shares=True,
               impl="fsdp_conformance.run.roundtrip_kind:RoundTripKind"),
)


def kind_record(case: Case) -> KindRecord:
    """The record of the kind that runs ``case`` (module rules)."""
    return next(k for k in KINDS if not k.flag or getattr(case, k.flag))


def kind_of(case: Case) -> CaseKind:
    """The kind that runs ``case`` (module rules)."""
    return kind_record(case).load()


def failed_verdicts(case: Case, v: Verdict, kind: CaseKind | None = None) -> dict[str, Verdict]:
    """The verdicts of a case of ``kind`` (default ``kind_of(case)``) that could not run:
    ``v`` for every property it decides, its usual n/a for the others (before known
    limitations)."""
    kind = kind or kind_of(case)
    return {**kind.undecided(case), **all_props(v, kind.decides(case))}


def finish_kinds(results: list, options) -> tuple[list, dict]:
    """``results`` passed through the ``finish`` of every kind that has one, in ``KINDS``
    order, and what they add for the run (their blocks merged)."""
    block: dict = {}
    for k in KINDS:
        finish = getattr(k.load(), "finish", None)
        if finish is not None:
            results, more = finish(results, options)
            block.update(more)
    return results, block
