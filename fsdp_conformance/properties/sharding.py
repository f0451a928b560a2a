"""P0, written once: how torch lays the optimizer's params out on every rank equals the
reference's layout. Every observer (the conformance run's paths of either family, a user's
own path, the FSDP1 and FSDP2 differential observers) hands it the family's reference
(properties/families.py) and one ``LayoutSide`` per side it saw (save, load).

Rules
- On every rank the optimizer's keys equal the reference's ``optimizer_keys()``: in the same
  order when the optimizer has one param group (``ordered``), as a set otherwise (several
  groups list their params group by group).
- What else a rank's layout must equal is the family's (``FamilyReference.layout_problems``):
  FSDP1's flat units (FQNs, shapes, padding, per-rank shard ranges), FSDP2's per-parameter
  DTensors (placements, local shapes, offsets).
- Sides are judged in order and the first side with a difference gives the verdict (every
  difference of every rank on it, named by side and rank): a later side is judged only
  where the earlier ones pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .family import FamilyReference
from .verdict import Verdict, fail, passed


@dataclass(frozen=True, kw_only=True)
class LayoutSide:
    """What one side of a case (its save or its load) showed of its layout."""

    label: str = ""
    """How a verdict names the side (``"save side"``, ``"load side"``; "" for the only one)."""
    layout: Any
    """The reference layout of that side (FSDP1 ``ModelLayout`` / ``Fsdp2Layout``)."""
    observations: Sequence[dict]
    """One per rank: ``rank``, the optimizer's ``keys``, the family's ``meta`` (and
    ``mesh_shape`` where FSDP2 ran on a mesh)."""


def p0_layout(family: FamilyReference, sides: Sequence[LayoutSide], *,
              ordered: bool = True) -> Verdict:
    """P0 of every side (module rules)."""
    seen = []
    for side in sides:
        prefix = f"{side.label}: " if side.label else ""
        want = list(side.layout.optimizer_keys())
        problems = []
        for obs in side.observations:
            keys = list(obs["keys"])
            if (keys != want) if ordered else (sorted(keys) != sorted(want)):
                problems.append(f"rank {obs['rank']}: optimizer keys {keys} != reference "
                                f"{want}{'' if ordered else ' (as sets)'}")
            problems += family.layout_problems(side.layout, obs)
        if problems:
            return fail("\n".join(prefix + p for p in problems))
        seen.append(f"{side.label + ' ' if side.label else ''}"
                    f"{family.layout_size(side.layout)} on {len(side.observations)} rank(s)")
    return passed("; ".join(seen))
