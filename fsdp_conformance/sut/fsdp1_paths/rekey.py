"""fsdp1.rekey: ``full_optim_state_dict`` -> ``rekey_optim_state_dict(PARAM_ID)`` for the
unwrapped model (a checkpoint a plain model can load) -> torch.save -> every rank: rekey
back to PARAM_NAME with the unwrapped model -> ``shard_full_optim_state_dict``."""
from __future__ import annotations

from ..paths import (ALL_RANKS_FLIP, atomic_save, full_optim, load_side, save_side,  # noqa: F401
                     to_param_ids, to_param_names, FULL_FILE)

P9_FLIP = ALL_RANKS_FLIP


def save(case, model, optim, *, rank0_only: bool = True, offload: bool = True):
    return full_optim(model, optim, rank0_only)


def write(ctx, case, model, saved, out) -> None:
    if ctx.rank == 0:
        atomic_save(to_param_ids(case, saved), out / FULL_FILE)


def load(ctx, case, model, optim, saved, workdir):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return FSDP.shard_full_optim_state_dict(to_param_names(case, saved), model)
