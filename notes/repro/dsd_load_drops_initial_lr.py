"""torch 2.13: set_optimizer_state_dict drops a param-group key the loading optimizer does not
already have. An LR scheduler adds 'initial_lr' to every param group; a trainer that builds
its scheduler after loading the optimizer (then loads the scheduler's state) gets initial_lr
= the loaded, decayed lr instead of the checkpoint's.

Run: python notes/repro/dsd_load_drops_initial_lr.py   (2 processes, gloo, CPU)

Prints each rank's initial_lr after the load for
  - plain Optimizer.load_state_dict (keeps it: 0.1 on both ranks),
  - full_state_dict=True, broadcast_from_rank0=True (rank 0 keeps 0.1, rank 1 gets 0.081),
  - full_state_dict=True without broadcast, each rank its own full dict: no drop, every rank
    raises KeyError 'param_groups.0.initial_lr' (entry dsd-full-load-no-broadcast-group-key),
  - the sharded dict in memory, no DCP (keeps it: 0.1 on both ranks),
  - the sharded dict through dcp.save / dcp.load (both ranks 0.081).
So the drop is not set_optimizer_state_dict's in general: through DCP it is dcp.load, whose
template (the fresh optimizer's dict) has no such key; with broadcast it is the broadcast.

Mechanism (2.13): full: _broadcast_state_dict writes a non-tensor value only into keys the
rank's local dict has (torch/distributed/_state_dict_utils.py:670-673); rank 0 then adds the
keys its own full dict has and the local lacks (state_dict.py:1168-1176), the other ranks
pass {} there. Sharded: the template dcp.load fills is the fresh optimizer's dict, which has
no initial_lr key, so it is never read.
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
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         get_optimizer_state_dict,
                                                         set_optimizer_state_dict)
    from torch.distributed.fsdp import fully_shard

    def build(shard: bool):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
        if shard:
            fully_shard(model)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def trained(shard: bool):
        model, optim = build(shard)
        sched = torch.optim.lr_scheduler.ExponentialLR(optim, gamma=0.9)
        for _ in range(2):
            model(torch.randn(3, 4)).sum().backward()
            optim.step()
            sched.step()
        return model, optim

    def report(what: str, optim) -> None:
        sched = torch.optim.lr_scheduler.ExponentialLR(optim, gamma=0.9)  # built after the load
        del sched
        g = optim.param_groups[0]
        print(f"rank {rank} {what}: lr={g['lr']:.4g} initial_lr={g['initial_lr']:.4g}",
              flush=True)

    model, optim = trained(False)  # plain
    sd = optim.state_dict()
    _, optim2 = build(False)
    optim2.load_state_dict(sd)
    report("Optimizer.load_state_dict", optim2)

    model, optim = trained(True)
    full = get_optimizer_state_dict(model, optim, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))
    model2, optim2 = build(True)
    set_optimizer_state_dict(model2, optim2, full if rank == 0 else {},
                             options=StateDictOptions(full_state_dict=True,
                                                      broadcast_from_rank0=True))
    report("full, broadcast_from_rank0", optim2)

    model2, optim2 = build(True)  # every rank its own full dict, no broadcast
    full_everywhere = get_optimizer_state_dict(model, optim, options=StateDictOptions(
        full_state_dict=True))  # without cpu_offload every rank gets the full dict
    try:
        set_optimizer_state_dict(model2, optim2, full_everywhere,
                                 options=StateDictOptions(full_state_dict=True))
        report("full, no broadcast", optim2)
    except KeyError as exc:
        import traceback

        where = traceback.extract_tb(exc.__traceback__)
        inner = next(f for f in reversed(where) if "_state_dict_utils" in f.filename)
        outer = next(f for f in reversed(where) if f.filename.endswith("state_dict.py"))
        print(f"rank {rank} full, no broadcast: KeyError {exc} at "
              f"_state_dict_utils.py:{inner.lineno} ({inner.name}), from "
              f"state_dict.py:{outer.lineno} ({outer.name})", flush=True)

    sharded = get_optimizer_state_dict(model, optim)
    model2, optim2 = build(True)  # the sharded dict in memory, no DCP
    set_optimizer_state_dict(model2, optim2, sharded)
    report("sharded, in memory", optim2)

    dcp.save({"optim": sharded}, checkpoint_id=tmp)
    model2, optim2 = build(True)
    template = {"optim": get_optimizer_state_dict(model2, optim2)}
    dcp.load(template, checkpoint_id=tmp)
    set_optimizer_state_dict(model2, optim2, template["optim"])
    report("sharded, dcp.load", optim2)
    dist.destroy_process_group()


if __name__ == "__main__":
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(run, args=(2, port, tmp), nprocs=2)
