"""fsdp1.full: ``optim_state_dict`` under FULL_STATE_DICT (rank0_only, offload_to_cpu) ->
torch.save on rank 0 -> every rank loads -> ``optim_state_dict_to_load``."""
from __future__ import annotations

from ..files import write_full
from ..roundtrip import ALL_RANKS

FLIP = ALL_RANKS


def save(case, model, optim, *, rank0_only: bool = True, offload: bool = True):
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType

    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(rank0_only=rank0_only, offload_to_cpu=offload),
                              FullOptimStateDictConfig(rank0_only=rank0_only,
                                                       offload_to_cpu=offload)):
        return FSDP.optim_state_dict(model, optim)


def write(ctx, case, live, saved, out) -> None:
    write_full(ctx, saved, out)


def load(ctx, case, live, saved, workdir):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType

    with FSDP.state_dict_type(live.model, StateDictType.FULL_STATE_DICT):
        return FSDP.optim_state_dict_to_load(live.model, live.optim, saved)
