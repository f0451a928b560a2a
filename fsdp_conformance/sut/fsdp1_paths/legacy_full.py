"""fsdp1.legacy_full: ``full_optim_state_dict(rank0_only)`` -> torch.save on rank 0 -> every
rank ``torch.load(weights_only=True)`` -> ``shard_full_optim_state_dict``."""
from __future__ import annotations

from ..files import write_full
from ..fsdp1 import full_optim
from ..roundtrip import ALL_RANKS

FLIP = ALL_RANKS


def save(case, model, optim, *, rank0_only: bool = True, offload: bool = True):
    return full_optim(model, optim, rank0_only)


def write(ctx, case, live, saved, out) -> None:
    write_full(ctx, saved, out)


def load(ctx, case, live, saved, workdir):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return FSDP.shard_full_optim_state_dict(saved, live.model)
