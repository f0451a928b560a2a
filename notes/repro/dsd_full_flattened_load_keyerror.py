"""torch 2.13: set_optimizer_state_dict(full_state_dict=True, flatten_optimizer_state_dict=True)
raises KeyError on every rank for the flattened full dict that
get_optimizer_state_dict(full_state_dict=True, flatten_optimizer_state_dict=True) returned:
KeyError: 'state' with broadcast_from_rank0=True (rank 0 passes the dict, the others {}),
KeyError: 'param_groups.0.params.0' without it (every rank passes the dict).

Run: python notes/repro/dsd_full_flattened_load_keyerror.py   (2 processes, gloo, CPU)

Mechanism (torch/distributed/checkpoint/state_dict.py, 2.13): _load_optim_state_dict takes
the full_state_dict branch (:1140), gets the rank's *local* dict with _get_optim_state_dict
(:1141), which flattens it too because info.flatten_optimizer_state_dict is set (:974-977),
and rebuilds the dict to load from the local dict's structure (:1174-1176): the flattened
one, without "state". optim.load_state_dict then reads state_dict["state"] (:1186 ->
torch/optim/optimizer.py:997) and raises KeyError: 'state'. Without the flatten option the
same calls load (shown first).
"""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def run(rank: int, world_size: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         get_optimizer_state_dict,
                                                         set_optimizer_state_dict)
    from torch.distributed.fsdp import fully_shard

    def trained():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
        fully_shard(model)
        optim = torch.optim.Adam(model.parameters(), lr=0.1)
        model(torch.randn(3, 4)).sum().backward()
        optim.step()
        return model, optim

    import traceback

    for broadcast in (True, False):
        for flatten in (False, True):
            model, optim = trained()
            full = get_optimizer_state_dict(model, optim, options=StateDictOptions(
                full_state_dict=True, cpu_offload=broadcast,
                flatten_optimizer_state_dict=flatten))
            model2, optim2 = trained()
            opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=broadcast,
                                    flatten_optimizer_state_dict=flatten)
            what = f"broadcast_from_rank0={broadcast} flatten={flatten}"
            try:
                set_optimizer_state_dict(model2, optim2,
                                         full if rank == 0 or not broadcast else {},
                                         options=opts)
                print(f"rank {rank} {what}: loaded", flush=True)
            except KeyError as exc:
                last = traceback.extract_tb(exc.__traceback__)[-1]
                print(f"rank {rank} {what}: KeyError {exc} in {last.name} "
                      f"({os.path.basename(last.filename)}:{last.lineno})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(2, port), nprocs=2)
