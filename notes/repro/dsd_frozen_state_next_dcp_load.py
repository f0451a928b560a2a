"""Reproducer (plain torch 2.13, world size 1, gloo, CPU): after one DCP resume of a model with
a param frozen from the start and Adagrad, the next checkpoint cannot be loaded.
The first load drops the frozen param's state (set_optimizer_state_dict keeps state only for
params that require grad, state_dict.py:1032), so the checkpoint saved after resuming has
none for it, while the fresh Adagrad of the next load makes state for every param at
construction and dcp.load refuses the template key the checkpoint lacks
(default_planner.py:495). Known limitation dsd-dropped-frozen-state-breaks-next-dcp-load.
Run: python notes/repro/dsd_frozen_state_next_dcp_load.py"""
import os
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (get_optimizer_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import fully_shard

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29534")
dist.init_process_group("gloo", rank=0, world_size=1)
torch.manual_seed(0)


def build():
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    m[0].weight.requires_grad_(False)  # frozen from the start
    fully_shard(m[0])
    fully_shard(m)
    return m, torch.optim.Adagrad(m.parameters(), lr=0.1)


def step(m, o):
    o.zero_grad()
    m(torch.ones(2, 4)).pow(2).sum().backward()
    o.step()


def load(path):
    m, o = build()
    sd = get_optimizer_state_dict(m, o)
    dcp.load({"optim": sd}, checkpoint_id=path)
    set_optimizer_state_dict(m, o, sd)
    return m, o


print("torch", torch.__version__)
root = tempfile.mkdtemp()
m, o = build()
step(m, o)
dcp.save({"optim": get_optimizer_state_dict(m, o)}, checkpoint_id=os.path.join(root, "ckpt1"))
m, o = load(os.path.join(root, "ckpt1"))
print("after the first load, the frozen param has state:", m[0].weight in o.state
      and bool(o.state[m[0].weight]))
step(m, o)
dcp.save({"optim": get_optimizer_state_dict(m, o)}, checkpoint_id=os.path.join(root, "ckpt2"))
try:
    load(os.path.join(root, "ckpt2"))
    print("the second checkpoint loaded")
except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
    print("the second checkpoint does not load:", type(e).__name__, "...",
          str(e).strip().splitlines()[-1][:200])
dist.destroy_process_group()
