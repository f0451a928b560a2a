"""torch 2.13 (CPU): FSDP1's full optimizer state dict with use_orig_params=True returns every
positive-dim tensor state of a param holding the values of the state whose name sorts last
(Adam: exp_avg holds exp_avg_sq; Adadelta: acc_delta holds square_avg), all views of one
storage, whenever the gather offloads to CPU: FullOptimStateDictConfig(offload_to_cpu=True)
(its default) with rank0_only True or False, and full_optim_state_dict (which always
offloads) with rank0_only True or False. offload_to_cpu=False returns a correct dict.

Run: python notes/repro/fsdp1_full_osd_offload_aliasing.py
     (Adam at 2 and 3 processes, Adadelta at 3; gloo, CPU; under a minute)

For FSDP.optim_state_dict under FULL_STATE_DICT with each FullOptimStateDictConfig(
offload_to_cpu, rank0_only), and FSDP.full_optim_state_dict(rank0_only), every rank that gets
a dict prints, for the first Linear's weight, which state of an unwrapped copy of the model
(same data, same optimizer) each of its tensor states equals (allclose, atol 1e-6), and how
many storages the states use.

Output seen on torch 2.13.0+cpu (PYTHONWARNINGS=ignore), Adam at 2 ranks:
  adam ws 2 rank 0 optim_state_dict offload_to_cpu=True rank0_only=True: exp_avg holds exp_avg_sq, exp_avg_sq holds exp_avg_sq; storages: 1 for 2 states
  adam ws 2 rank 0 optim_state_dict offload_to_cpu=True rank0_only=False: exp_avg holds exp_avg_sq, exp_avg_sq holds exp_avg_sq; storages: 1 for 2 states
  adam ws 2 rank 0 optim_state_dict offload_to_cpu=False rank0_only=True: exp_avg holds exp_avg, exp_avg_sq holds exp_avg_sq; storages: 2 for 2 states
  adam ws 2 rank 0 optim_state_dict offload_to_cpu=False rank0_only=False: exp_avg holds exp_avg, exp_avg_sq holds exp_avg_sq; storages: 2 for 2 states
  adam ws 2 rank 0 full_optim_state_dict rank0_only=True: exp_avg holds exp_avg_sq, exp_avg_sq holds exp_avg_sq; storages: 1 for 2 states
  adam ws 2 rank 0 full_optim_state_dict rank0_only=False: exp_avg holds exp_avg_sq, exp_avg_sq holds exp_avg_sq; storages: 1 for 2 states
  adam ws 2 rank 1 optim_state_dict offload_to_cpu=True rank0_only=False: exp_avg holds exp_avg_sq, exp_avg_sq holds exp_avg_sq; storages: 1 for 2 states
  adam ws 2 rank 1 optim_state_dict offload_to_cpu=False rank0_only=False: exp_avg holds exp_avg, exp_avg_sq holds exp_avg_sq; storages: 2 for 2 states
  adam ws 2 rank 1 full_optim_state_dict rank0_only=False: exp_avg holds exp_avg_sq, exp_avg_sq holds exp_avg_sq; storages: 1 for 2 states
  (rank 1 gets an empty dict with rank0_only=True). Adam at 3 ranks: the same on every rank.
  Adadelta at 3 ranks, e.g.:
  adadelta ws 3 rank 0 optim_state_dict offload_to_cpu=True rank0_only=False: acc_delta holds square_avg, square_avg holds square_avg; storages: 1 for 2 states
  adadelta ws 3 rank 0 optim_state_dict offload_to_cpu=False rank0_only=False: acc_delta holds acc_delta, square_avg holds square_avg; storages: 2 for 2 states

DSD: get_optimizer_state_dict(full_state_dict=True) on an FSDP1 model builds
FullOptimStateDictConfig(offload_to_cpu=options.cpu_offload, rank0_only=options.cpu_offload
or options.broadcast_from_rank0) (torch/distributed/checkpoint/state_dict.py:348-351), so
through DSD it happens with cpu_offload=True only.

Mechanism (2.13, torch/distributed/fsdp/_optim_utils.py): _allgather_orig_param_states
allocates one buffer per FlatParameter, gathered_tensor (:1555), and reuses it for every
state name, in sorted order (:1360, :1558); each state's values for the original params are
views of that buffer (_get_unflat_views_aligned, :1655-1666). _unflatten_orig_param_states
copies them with value.detach().clone() only when not cpu_offload (:1501-1503); with
cpu_offload it calls value.cpu() (:1505-1507), which on a CPU tensor returns the same tensor,
so every state's views end up holding what the last state name wrote into the buffer.
"""
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


OPTIMIZERS = {"adam": (torch.optim.Adam, {"lr": 0.01}),
              "adadelta": (torch.optim.Adadelta, {"lr": 0.5})}


def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))


def train(model, optim):
    torch.manual_seed(1)  # the same data on every rank
    for _ in range(2):
        model(torch.randn(3, 4)).sum().backward()
        optim.step()
        optim.zero_grad()


def run(rank, world_size, port, opt_name):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType

    cls, kw = OPTIMIZERS[opt_name]
    ref = build()
    ref_optim = cls(ref.parameters(), **kw)
    train(ref, ref_optim)
    ref_st = {n: v for n, v in ref_optim.state[ref[0].weight].items() if v.dim() > 0}

    model = FSDP(build(), device_id=torch.device("cpu"), use_orig_params=True)
    optim = cls(model.parameters(), **kw)
    train(model, optim)

    def check(what, osd):
        head = f"{opt_name} ws {world_size} rank {rank} {what}:"
        if not osd:
            print(f"{head} empty dict", flush=True)
            return
        st = {n: v for n, v in osd["state"]["0.weight"].items() if v.dim() > 0}
        held = []
        for n, v in st.items():  # which of the unwrapped optimizer's states it equals
            same = [m for m, r in ref_st.items() if torch.allclose(v, r, atol=1e-6)]
            held.append(f"{n} holds {same[0] if same else '?'}")
        ptrs = {v.untyped_storage().data_ptr() for v in st.values()}
        print(f"{head} {', '.join(held)}; storages: {len(ptrs)} for {len(st)} states",
              flush=True)

    for offload in (True, False):
        for rank0_only in (True, False):
            with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                                      FullStateDictConfig(),
                                      FullOptimStateDictConfig(offload_to_cpu=offload,
                                                               rank0_only=rank0_only)):
                osd = FSDP.optim_state_dict(model, optim)
            check(f"optim_state_dict offload_to_cpu={offload} rank0_only={rank0_only}", osd)
    for rank0_only in (True, False):
        osd = FSDP.full_optim_state_dict(model, optim, rank0_only=rank0_only)
        check(f"full_optim_state_dict rank0_only={rank0_only}", osd)
    dist.destroy_process_group()


if __name__ == "__main__":
    print(f"torch {torch.__version__}")
    for opt_name, ws in (("adam", 2), ("adam", 3), ("adadelta", 3)):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(run, args=(ws, port, opt_name), nprocs=ws)
