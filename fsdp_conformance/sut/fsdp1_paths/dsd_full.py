"""fsdp1.dsd_full: the migration path torch recommends, on the same FSDP1 model:
``get_optimizer_state_dict(full_state_dict=True, cpu_offload=True)`` (rank 0 gets the full
dict, the others ``{}``) -> torch.save on rank 0 -> every rank loads ->
``set_optimizer_state_dict(full_state_dict=True)`` (which loads the optimizer itself)."""
from __future__ import annotations

from ..files import write_full
from ..roundtrip import ALL_RANKS

FLIP = ALL_RANKS


def save(case, model, optim, *, rank0_only: bool = True, offload: bool = True):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    # full: cpu_offload=True is DSD's rank0_only form
    return get_optimizer_state_dict(model, optim, options=StateDictOptions(
        full_state_dict=True, cpu_offload=rank0_only and offload))


def write(ctx, case, live, saved, out) -> None:
    write_full(ctx, saved, out)


def load(ctx, case, live, saved, workdir):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(live.model, live.optim, saved, options=StateDictOptions(full_state_dict=True))
    return None
