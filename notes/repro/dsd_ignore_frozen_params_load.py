"""torch 2.13: a model state saved with StateDictOptions(ignore_frozen_params=True) does not
load back with the same options: get_state_dict leaves the frozen params out (as
documented), but set_state_dict / set_model_state_dict still load the model strictly, so
model.load_state_dict raises "Missing key(s) in state_dict" for every frozen param. Only
strict=False as well loads it.

Run: python notes/repro/dsd_ignore_frozen_params_load.py   (2 processes, gloo, CPU)

Mechanism: ignore_frozen_params is read by _get_model_state_dict only (state_dict.py:549-555);
_load_model_state_dict passes info.strict to model.load_state_dict (:623-625) whatever
ignore_frozen_params says.
"""
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def run(rank: int, world_size: int, port: int, tmp: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,
                                                         set_state_dict)
    from torch.distributed.fsdp import fully_shard

    def build():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
        model[0].requires_grad_(False)  # a frozen backbone, as in fine-tuning
        fully_shard(model)
        return model, torch.optim.Adam([p for p in model.parameters() if p.requires_grad])

    model, optim = build()
    model(torch.randn(3, 4)).sum().backward()
    optim.step()
    for strict in (True, False):
        opts = StateDictOptions(ignore_frozen_params=True, strict=strict)
        msd, osd = get_state_dict(model, optim, options=opts)
        path = os.path.join(tmp, f"strict{strict}")
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
        model2, optim2 = build()
        msd2, osd2 = get_state_dict(model2, optim2, options=opts)
        sd = {"model": msd2, "optim": osd2}
        dcp.load(sd, checkpoint_id=path)
        try:
            set_state_dict(model2, optim2, model_state_dict=sd["model"],
                           optim_state_dict=sd["optim"], options=opts)
            print(f"rank {rank} strict={strict}: loaded; model keys saved {sorted(msd)}",
                  flush=True)
        except RuntimeError as exc:
            print(f"rank {rank} strict={strict}: RuntimeError {str(exc).splitlines()[1].strip()}",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(run, args=(2, port, tmp), nprocs=2)
