"""fsdp1.legacy_sharded: ``sharded_optim_state_dict`` -> one torch.save file per rank ->
``flatten_sharded_optim_state_dict`` (same world size and wrapping only)."""
from __future__ import annotations

from ..files import atomic_save
from ...api_paths import rank_file

FLIP = None  # sharded_optim_state_dict has no rank0_only / offload_to_cpu flags


def save(case, model, optim, *, rank0_only: bool = True, offload: bool = True):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return FSDP.sharded_optim_state_dict(model, optim)


def write(ctx, case, live, saved, out) -> None:
    atomic_save(saved, out / rank_file(ctx.rank))


def load(ctx, case, live, saved, workdir):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return FSDP.flatten_sharded_optim_state_dict(saved, live.model, live.optim)
