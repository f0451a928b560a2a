"""The FSDP2 side of the conformance run's properties (``sut.fsdp2_paths`` round trips): the
reference layouts (``reference.fsdp2_layout``) and what P9 (properties/flags.py) judges of
the sharded path's save (``flags_seen``). P0, P1 and P3 are
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
from .layouts import fsdp2_reference_layout
from .run_props import assemble_sharded
from ..sut.records import SaveRecord, error_of
from .expectation import EXACT, Expectation
from .flags import FlagSeen, FlagsSeen
from .verdict import error, fail

gather = ref.fsdp2_gather


def layouts(case: Case, exp: Expectation = EXACT):
    """(save-side, load-side) ``Fsdp2Layout`` of the case (the case it runs as under
    ``exp``)."""
    return (fsdp2_reference_layout(case, exp=exp),
            fsdp2_reference_layout(case, load_side=True, exp=exp))


def flags_seen(full: dict, save_obs: Sequence[SaveRecord]) -> FlagsSeen:
    """What P9 (properties/flags.py) judges of fsdp2.sharded's save: ``cpu_offload=True``
    puts every tensor of the sharded dict on CPU (a check that can fail only where the ranks
    compute on another device) and changes nothing else (assembled, bitwise equal to the
    dict saved without it)."""
    on_device = any(o.device != "cpu" for o in save_obs)
    seen = []
    for o in save_obs:
        e = error_of(o.flipped)
        if e:
            seen.append(FlagSeen(problem=error(f"cpu_offload=True raised on rank {o.rank}:\n{e}")))
            break
        devs = [d for d in o.flipped_devices or [] if d != "cpu"]
        if devs:
            seen.append(FlagSeen(found=f"rank {o.rank}: cpu_offload=True left tensors on {devs}"))
    if not any(s.problem for s in seen):
        try:
            off = assemble_sharded([o.flipped for o in save_obs])
            seen.append(FlagSeen(what="cpu_offload=True gives another dict than cpu_offload=False",
                                 want=full, got=off))
        except ValueError as exc:
            seen.append(FlagSeen(problem=fail(f"cpu_offload=True: the ranks' shards do not tile "
                                              f"the params: {exc}")))
    return FlagsSeen(seen=tuple(seen), checked=(
        "cpu_offload=True: every tensor on CPU, the same dict otherwise" if on_device else
        "cpu_offload=True gives the same dict",), note="" if on_device else (
        "whether it moves tensors to the CPU is not observable on CPU (every tensor is there "
        "either way)"))
