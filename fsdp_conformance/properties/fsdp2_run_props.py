"""The FSDP2 side of the conformance run's properties (``sut.fsdp2_paths`` round trips): the
reference layouts (``reference.fsdp2_layout``) and P9 of the sharded path. P0, P1 and P3 are
written once for both families (properties/sharding.py, saved.py, loaded.py, with
``families.FSDP2``); everything else is ``run_props``' (given ``reference.fsdp2_gather``
where it gathers).

Rules
- Params outside FSDP2 (ignored params: plain tensors, per rank): the saved full dict holds
  rank 0's state for them (what ``fsdp2_gather`` takes); what a load gives them is P3's rule
  (properties/families.py).
"""
from __future__ import annotations

from typing import Sequence

from .. import reference as ref
from ..cases import Case
from .statediff import diff_state_dicts, format_diff
from .layouts import fsdp2_reference_layout
from .run_props import assemble_sharded
from ..sut.records import SaveRecord, error_of
from .verdict import Verdict, error, fail, passed

gather = ref.fsdp2_gather


def layouts(case: Case):
    """(save-side, load-side) ``Fsdp2Layout`` of the case."""
    return fsdp2_reference_layout(case), fsdp2_reference_layout(case, load_side=True)


def p9_sharded(full: dict, save_obs: Sequence[SaveRecord]) -> Verdict:
    """fsdp2.sharded: ``cpu_offload=True`` puts every tensor of the sharded dict on CPU (a
    check that can fail only where the ranks compute on another device) and changes
    nothing else (assembled, bitwise equal to the dict saved without it)."""
    problems = []
    on_device = any(o.device != "cpu" for o in save_obs)
    for o in save_obs:
        e = error_of(o.offloaded)
        if e:
            return error(f"cpu_offload=True raised on rank {o.rank}:\n{e}")
        devs = [d for d in o.offloaded_devices or [] if d != "cpu"]
        if devs:
            problems.append(f"rank {o.rank}: cpu_offload=True left tensors on {devs}")
    try:
        off = assemble_sharded([o.offloaded for o in save_obs])
    except ValueError as exc:
        return fail(f"cpu_offload=True: the ranks' shards do not tile the params: {exc}")
    diffs = diff_state_dicts(full, off)
    if diffs:
        problems.append("cpu_offload=True gives another dict than cpu_offload=False:\n"
                        + format_diff(diffs))
    if problems:
        return fail("\n".join(problems))
    if not on_device:
        return passed("cpu_offload=True gives the same dict; whether it moves tensors to the "
                      "CPU is not observable on CPU (every tensor is there either way)")
    return passed("cpu_offload=True: every tensor on CPU, the same dict otherwise")
