"""What a kind of case asks of the one round trip (sut/roundtrip.py) beyond a plain save and
load: passed by the kind to the rank functions, so the rank side reads no kind flag of the
case (run/kinds.py is the one place that does). Imports nothing heavy: the controller's kinds
build it, the ranks receive it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class SideAsks:
    """What the case's kind asks of the one round trip beyond a plain round trip's save and
    load (each kind passes its own: run/fault_kind.py, run/golden_kind.py); the rank side
    reads no kind flag of the case."""

    load_raises: bool = False
    """The load is let raise on every rank, and a damaged file's own error is not read past
    (a fault case: P15 judges every rank's outcome)."""
    load_only: bool = False
    """Stop after the load: no re-save, no resume (a golden case: P12 judges the loaded
    state alone)."""
    save_next: str = ""
    """A chain (``Case.links``): after the resumed training the load side saves again
    through the path into this directory, as ``Case.next_link``'s save side, and records it
    (``LoadRecord.next_save``); "" = no next link."""
    kill: Any = None
    """A crash case (P16): the ``sut.crash_points.KillPlan`` armed around the save's write
    (its ranks are SIGKILLed at its point); None = no kill."""
    keeps_training: bool = True
    """The save side may reuse a training kept from an earlier case that trains alike, and
    keep its own (sut/trained.py); False where the kind does more to the trained state than
    save it."""


ROUND_TRIP_ASKS = SideAsks()
"""A plain round trip's asks (the run's round-trip kind, the bounds' measurement)."""
