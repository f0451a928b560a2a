"""torch 2.13: a model state saved with StateDictOptions(ignore_frozen_params=True) does not
always load back with the same options. get_state_dict / get_model_state_dict leave the frozen
params out (all the docstring promises, state_dict.py:106-108), and the load side reads the
option only in _verify_state_dict's empty-dict check (:419, called from set_model_state_dict
:1434 and set_state_dict :1540). Whether the load is strict about the missing frozen keys
depends on the path:
  - sharded, through dcp.save / dcp.load and set_state_dict: strict=True (the default) raises
    "Missing key(s) in state_dict" for every frozen param; strict=False as well loads;
  - set_model_state_dict(full_state_dict=True) without broadcast_from_rank0 (every rank its
    own full dict): loads with strict=True: _distribute_state_dict (:617) fills the rank's
    local dict (every key of the local model) and state_dict.update(local_state_dict) (:618)
    adds the frozen keys from it, so the frozen params keep the values the local model has
    (a frozen weight set to 7.0 before the load is 7.0 after it); the caller's dict is changed
    in place (it holds the frozen keys afterwards);
  - set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True): strict=True raises
    the same "Missing key(s)" on every rank: _broadcast_state_dict(strict=True) first removes
    from the local dict the keys the broadcast dict lacks (_state_dict_utils.py:687-690), so
    :618 adds nothing back; strict=False loads.

Run: python notes/repro/dsd_ignore_frozen_params_load.py   (2 processes, gloo, CPU)

Output seen on torch 2.13.0+cpu (rank 0's lines; rank 1 prints the same, with saved keys []
in the broadcast strict=False line, since it passes {}):
  rank 0 dcp strict=True: RuntimeError Missing key(s) in state_dict: "0.weight", "0.bias".
  rank 0 dcp strict=False: loaded; model keys saved ['1.bias', '1.weight']
  rank 0 full broadcast_from_rank0=False strict=True: loaded; saved keys ['1.bias', '1.weight']; frozen weight all 7.0: True; head equal to saved: True
  rank 0 full broadcast_from_rank0=False strict=False: loaded; saved keys ['1.bias', '1.weight']; frozen weight all 7.0: True; head equal to saved: True
  rank 0 full broadcast_from_rank0=True strict=True: RuntimeError Missing key(s) in state_dict: "0.weight", "0.bias".
  rank 0 full broadcast_from_rank0=True strict=False: loaded; saved keys ['1.bias', '1.weight']; frozen weight all 7.0: True; head equal to saved: True

Mechanism (2.13, torch/distributed/checkpoint/state_dict.py): _load_model_state_dict passes
strict=info.strict (StateDictOptions.strict, default True, :135) to model.load_state_dict
(:624) whatever ignore_frozen_params says.
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
            print(f"rank {rank} dcp strict={strict}: loaded; model keys saved {sorted(msd)}",
                  flush=True)
        except RuntimeError as exc:
            print(f"rank {rank} dcp strict={strict}: RuntimeError "
                  f"{str(exc).splitlines()[1].strip()}", flush=True)
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         set_model_state_dict)

    for broadcast in (False, True):
        for strict in (True, False):
            full = get_model_state_dict(model, options=StateDictOptions(
                full_state_dict=True, cpu_offload=broadcast, ignore_frozen_params=True))
            model2, _ = build()
            with torch.no_grad():
                model2[0].weight.fill_(7.0)  # the frozen param, before the load
            what = f"full broadcast_from_rank0={broadcast} strict={strict}"
            keys = sorted(full)  # before the load, which adds the local frozen keys to it
            try:
                set_model_state_dict(model2, full if rank == 0 or not broadcast else {},
                                     options=StateDictOptions(
                                         full_state_dict=True, broadcast_from_rank0=broadcast,
                                         ignore_frozen_params=True, strict=strict))
                frozen = model2[0].weight.full_tensor()
                head = torch.equal(model2[1].weight.full_tensor(), model[1].weight.full_tensor())
                print(f"rank {rank} {what}: loaded; saved keys {keys}; frozen weight "
                      f"all 7.0: {bool((frozen == 7.0).all())}; head equal to saved: {head}",
                      flush=True)
            except RuntimeError as exc:
                print(f"rank {rank} {what}: RuntimeError {str(exc).splitlines()[1].strip()}",
                      flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(run, args=(2, port, tmp), nprocs=2)
