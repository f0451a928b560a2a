"""fsdp1.dsd_sharded: ``get_optimizer_state_dict()`` (ShardedTensor values under FSDP1) ->
``dcp.save({"model", "optim"})`` at N -> at M the documented resume recipe: the template
``get_optimizer_state_dict()`` of the fresh model and optimizer, filled by
``dcp.load({"optim": template})``, then ``set_optimizer_state_dict``."""
from __future__ import annotations

from ..files import write_dcp
from ...api_paths import DCP_DIR
from ..roundtrip import Flip

# saved with cpu_offload=True (what P9 checks on a device: every saved tensor on CPU); the
# flip saves without it, which must give the same sharded dict
FLIP = Flip(name="unoffloaded", flags={"offload": False})


def save(case, model, optim, *, rank0_only: bool = True, offload: bool = True):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optim, options=StateDictOptions(
        full_state_dict=False, cpu_offload=offload))


def write(ctx, case, live, saved, out) -> None:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    write_dcp(ctx, get_model_state_dict(live.model), saved, out)


def load(ctx, case, live, saved, workdir):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_optimizer_state_dict,
                                                         set_optimizer_state_dict)

    template = get_optimizer_state_dict(live.model, live.optim)
    dcp.load({"optim": template}, checkpoint_id=str(workdir / DCP_DIR), process_group=ctx.group)
    set_optimizer_state_dict(live.model, live.optim, template)
    return None
