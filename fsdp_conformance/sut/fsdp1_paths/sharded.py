"""fsdp1.sharded: ``optim_state_dict`` under SHARDED_STATE_DICT (offload_to_cpu) -> DCP save
at N -> ``load_sharded_optimizer_state_dict`` at M -> ``optim_state_dict_to_load``."""
from __future__ import annotations

from ..paths import DCP_DIR, load_side, model_sharded_sd, save_side, write_dcp  # noqa: F401

P9_FLIP = ("unoffloaded", {"offload": False})


def save(case, model, optim, *, rank0_only: bool = True, offload: bool = True):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import (ShardedOptimStateDictConfig, ShardedStateDictConfig,
                                        StateDictType)

    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT,
                              ShardedStateDictConfig(offload_to_cpu=offload),
                              ShardedOptimStateDictConfig(offload_to_cpu=offload)):
        return FSDP.optim_state_dict(model, optim)


def write(ctx, case, model, saved, out) -> None:
    write_dcp(ctx, model_sharded_sd(model), saved, out)


def load(ctx, case, model, optim, saved, workdir):
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType

    loaded = load_sharded_optimizer_state_dict(
        model_state_dict=model_sharded_sd(model), optimizer_key="optim",
        storage_reader=FileSystemReader(str(workdir / DCP_DIR)))
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        return FSDP.optim_state_dict_to_load(model, optim, loaded["optim"])
