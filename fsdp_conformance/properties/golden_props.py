"""P12: a golden fixture (a checkpoint stored by some torch version) loaded through a load
path gives the recorded state, bitwise.

Rule: the ranks' loaded states, gathered by the reference (FSDP1 flat layout or FSDP2
per-parameter layout, by the case's family), equal ``expected.pt`` bitwise (param groups
compared as mappings, a group's ``params`` as a set). A load that raised on a rank is a
failure of torch (the files were hash-checked before the load).
"""
from __future__ import annotations

from typing import Any, Sequence

from .. import reference as ref
from ..cases import Case
from .layouts import fsdp2_reference_layout, reference_layout
from ..sut.records import LoadRecord, error_of
from .expectation import EXACT, Expectation
from .groups import canon_groups
from .statediff import diff_state_dicts, format_diff
from .verdict import Verdict, fail, passed


def _gather(case: Case, load_obs: Sequence[LoadRecord], exp: Expectation):
    """(full dict the ranks hold, per the reference; its layout's owner function)."""

    if case.family == "fsdp2":
        layout = fsdp2_reference_layout(case, load_side=True, exp=exp)
        full = ref.fsdp2_gather(layout, [o.loaded for o in load_obs])
    else:
        layout = reference_layout(case, load_side=True, exp=exp)
        full = ref.gather_full(layout, [o.loaded for o in load_obs])
    return full, (lambda fqn, i: layout.owner(fqn, i))


def p12_verdict(case: Case, fx: Any, expected: dict, load_obs: Sequence[LoadRecord], *,
                exp: Expectation = EXACT) -> Verdict:
    """The loaded state, gathered by the reference, == the recorded state, bitwise.
    ``fx``: the fixture (golden.manifest.Fixture), named in the detail."""

    origin = (f"fixture {fx.key} (saved by torch {fx.torch_version_full} through "
              f"{fx.save_path} at {fx.case.get('world_size')} rank(s))")
    how = f"loaded through {case.api} at {case.dst_world_size} rank(s)"
    for o in load_obs:
        e = error_of(o.loaded)
        if e:
            return fail(f"{origin}: torch raised while it was {how}, on rank {o.rank}:\n{e}")
    try:
        got, owner = _gather(case, load_obs, exp)
    except ref.StateDictMismatch as exc:
        return fail(f"{origin} {how}: the ranks' loaded states do not form one state: {exc}")
    diffs = diff_state_dicts(canon_groups(exp.loaded(expected)), canon_groups(got), owner=owner)
    if diffs:
        return fail(f"{origin} {how} differs from its recorded state:\n" + format_diff(diffs))
    notes = sorted({o.weights_only_refused for o in load_obs} - {""})
    return passed(f"{origin} {how}: {len(expected['state'])} params bitwise equal to the "
                  f"recorded state" + "".join(f"; note: {n}" for n in notes[:1]))
