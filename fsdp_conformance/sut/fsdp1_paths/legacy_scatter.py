"""fsdp1.legacy_scatter: ``full_optim_state_dict(rank0_only)`` -> torch.save on rank 0 ->
rank 0 alone loads the file -> ``scatter_full_optim_state_dict`` sends every rank its
share."""
from __future__ import annotations

from ..paths import ALL_RANKS_FLIP, full_optim, load_side, save_side, write_full  # noqa: F401

P9_FLIP = ALL_RANKS_FLIP


def save(case, model, optim, *, rank0_only: bool = True, offload: bool = True):
    return full_optim(model, optim, rank0_only)


def write(ctx, case, model, saved, out) -> None:
    write_full(ctx, saved, out)


def load(ctx, case, model, optim, saved, workdir):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return FSDP.scatter_full_optim_state_dict(saved if ctx.rank == 0 else None, model)
