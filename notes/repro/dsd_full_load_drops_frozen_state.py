"""Reproducer (plain torch 2.13, world size 1, gloo, CPU): DSD's FULL load drops the saved
state of a frozen param too. The saved Adagrad sum of the frozen weight is set to 7.0; after
set_optimizer_state_dict(full_state_dict=True) it is the fresh optimizer's 0.0
(state_dict.py:1032 keeps loaded state only for params that require grad).
Run: python notes/repro/dsd_full_load_drops_frozen_state.py"""
import os, torch, torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict, StateDictOptions
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29534")
dist.init_process_group("gloo", rank=0, world_size=1)
def build():
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1)); m[0].weight.requires_grad_(False)
    fully_shard(m[0]); fully_shard(m); return m, torch.optim.Adagrad(m.parameters(), lr=0.1)
full = StateDictOptions(full_state_dict=True, cpu_offload=True)
m, o = build(); o.zero_grad(); m(torch.ones(2, 4)).sum().backward(); o.step()
sd = get_optimizer_state_dict(m, o, options=full)
sd["state"]["0.weight"]["sum"] = torch.full((4, 4), 7.0)   # a value a fresh Adagrad never has
m2, o2 = build(); set_optimizer_state_dict(m2, o2, sd, options=full)
got = o2.state[m2[0].weight]["sum"]
got = got.full_tensor() if hasattr(got, "full_tensor") else got
print("frozen param's sum after the FULL load:", float(got.flatten()[0]), "(saved 7.0; a fresh Adagrad has 0.0)")
dist.destroy_process_group()
