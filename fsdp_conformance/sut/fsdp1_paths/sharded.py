"""fsdp1.sharded: ``optim_state_dict`` under SHARDED_STATE_DICT (offload_to_cpu) -> DCP save
at N -> ``load_sharded_optimizer_state_dict`` at M -> ``optim_state_dict_to_load``."""
from __future__ import annotations

from ..files import write_dcp
from ..fsdp1 import model_sharded_sd
from ...api_paths import DCP_DIR
from ..roundtrip import Flip

FLIP = Flip(name="unoffloaded", flags={"offload": False})


def save(case, model, optim, *, rank0_only: bool = True, offload: bool = True):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import (ShardedOptimStateDictConfig, ShardedStateDictConfig,
                                        StateDictType)

    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT,
                              ShardedStateDictConfig(offload_to_cpu=offload),
                              ShardedOptimStateDictConfig(offload_to_cpu=offload)):
        return FSDP.optim_state_dict(model, optim)


def write(ctx, case, live, saved, out) -> None:
    write_dcp(ctx, model_sharded_sd(live.model), saved, out)


def load(ctx, case, live, saved, workdir):
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType

    loaded = load_sharded_optimizer_state_dict(
        model_state_dict=model_sharded_sd(live.model), optimizer_key="optim",
        storage_reader=FileSystemReader(str(workdir / DCP_DIR)))
    with FSDP.state_dict_type(live.model, StateDictType.SHARDED_STATE_DICT):
        return FSDP.optim_state_dict_to_load(live.model, live.optim, loaded["optim"])
