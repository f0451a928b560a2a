"""fsdp1.rekey: ``full_optim_state_dict`` -> ``rekey_optim_state_dict(PARAM_ID)`` for the
unwrapped model (a checkpoint a plain model can load) -> torch.save -> every rank: rekey
back to PARAM_NAME with the unwrapped model -> ``shard_full_optim_state_dict``."""
from __future__ import annotations

from ..files import atomic_save
from ...api_paths import FULL_FILE
from ..rekey import to_param_ids, to_param_names
from .legacy_full import FLIP, save  # noqa: F401 (legacy full_optim_state_dict)


def write(ctx, case, live, saved, out) -> None:
    if ctx.rank == 0:
        atomic_save(to_param_ids(case, saved), out / FULL_FILE)


def load(ctx, case, live, saved, workdir):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return FSDP.shard_full_optim_state_dict(to_param_names(case, saved), live.model)
