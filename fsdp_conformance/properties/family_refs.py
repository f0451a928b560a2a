"""The references a round trip is judged against, picked by the case's FSDP family: the
save side's and the load side's reference layouts, and the family's P0/P1/P3 functions.

Rules
- ``fsdp2`` cases use ``fsdp2_run_props``'s layouts and the FSDP2 family reference; FSDP1
  cases the flat-unit ``ModelLayout`` (properties/layouts.py) and the FSDP1 reference.
- Everything else a round trip judges is the same for every family.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..cases import Case
from . import run_props as rp
from .expectation import EXACT, Expectation
from .families import FSDP1, FSDP2
from .family import FamilyReference
from .layouts import reference_layout
from .loaded import p3_loaded, run_states
from .saved import SavedDict, p1_saved
from .sharding import LayoutSide, p0_layout
from .verdict import Verdict


@dataclass(frozen=True, kw_only=True)
class FamilyRefs:
    """The references and family-specific property functions of one case."""

    layout: Any
    """The save side's reference layout (FSDP1 ``ModelLayout`` or ``Fsdp2Layout``)."""
    dst: Any
    """The load side's (its world size and plan)."""
    family: FamilyReference
    """The family's reference (properties/families.py): what P3 (properties/loaded.py)
    judges with."""
    exp: Expectation = EXACT
    """The expectation judged against (properties/expectation.py)."""

    @property
    def gather(self) -> Callable[..., dict]:
        """The reference's gather of the ranks' local dicts."""
        return self.family.gather

    def p0(self, save_obs, load_obs, ordered: bool) -> Verdict:
        """P0 (properties/sharding.py) of the save side's records and, where the load side
        ran (``load_obs`` not empty), the load side's."""
        sides = [LayoutSide(label="save side", layout=self.layout,
                            observations=rp.layout_view(save_obs))]
        if load_obs:
            sides.append(LayoutSide(label="load side", layout=self.dst,
                                    observations=rp.layout_view(load_obs)))
        return p0_layout(self.family, sides, ordered=ordered)

    def p1(self, full: dict, save_obs, api: str) -> Verdict:
        """P1 of the full dict ``full`` a round trip's path ``api`` saved (rank 0's, or
        the ranks' shards assembled) against the gather of the save side's local dicts."""
        return p1_saved(self.family, self.layout, [o.local for o in save_obs],
                        [SavedDict(rank=0, label=api, got=full)], exp=self.exp)

    def p3(self, full: dict, load_obs, own=None, per_rank: dict | None = None) -> Verdict:
        """P3 of a round trip's load side that loaded ``full`` (``own``: the save side's
        records where the load is at the save's world size and plan; ``per_rank``: the dict
        each rank's own files make, where the ranks read different files)."""
        return p3_loaded(self.family, self.dst,
                         run_states(self.family, self.dst, full, load_obs, own=own,
                                    exp=self.exp, per_rank=per_rank), exp=self.exp)


def family_refs(case: Case, exp: Expectation = EXACT) -> FamilyRefs:
    """The references of the case's FSDP family (``fsdp2_run_props`` for ``fully_shard``,
    ``run_props`` for FSDP1), of the case it runs as under ``exp``."""
    if case.family == "fsdp2":
        from . import fsdp2_run_props as f2

        layout, dst = f2.layouts(case, exp)
        return FamilyRefs(layout=layout, dst=dst, family=FSDP2, exp=exp)
    return FamilyRefs(layout=reference_layout(case, exp=exp),
                      dst=reference_layout(case, load_side=True, exp=exp), family=FSDP1, exp=exp)
