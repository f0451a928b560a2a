"""Reproducer (plain torch 2.13, world size 1, gloo, CPU): DSD and frozen params.
(1) Adagrad, a param frozen from the start, full path: unfreezing after the load raises
nothing (Adagrad creates missing state in its step). (2) Adam, a param trained and then
frozen before the save: after set_optimizer_state_dict(full_state_dict=True) its state is
{}, and after unfreezing its step restarts at 1 (uninterrupted: 3).
Run: python notes/repro/dsd_frozen_state_dropped.py"""
import os, torch, torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.checkpoint.state_dict import (get_optimizer_state_dict, set_optimizer_state_dict,
                                                     StateDictOptions)
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29533")
dist.init_process_group("gloo", rank=0, world_size=1)
torch.manual_seed(0)

def build(opt_cls, frozen_from_start):
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    if frozen_from_start:
        m[0].weight.requires_grad_(False)
    fully_shard(m[0]); fully_shard(m)
    return m, opt_cls(m.parameters(), lr=0.1)

def step(m, o):
    o.zero_grad(); m(torch.ones(2, 4)).pow(2).sum().backward(); o.step()

full = StateDictOptions(full_state_dict=True, cpu_offload=True)
print("torch", torch.__version__)
# (1) Adagrad, frozen from the start: does unfreezing after a load raise KeyError 'sum'?
m, o = build(torch.optim.Adagrad, True); step(m, o)
sd = get_optimizer_state_dict(m, o, options=full)
print("(1) saved state keys:", sorted(sd["state"]))
m2, o2 = build(torch.optim.Adagrad, True)
set_optimizer_state_dict(m2, o2, sd, options=full)
w = m2[0].weight
print("(1) after load, frozen param state:", dict(o2.state[w]) if w in o2.state else "<absent>")
w.requires_grad_(True)
try:
    step(m2, o2); print("(1) unfreeze + step: OK, state keys now", sorted(o2.state[w]))
except KeyError as e:
    print("(1) unfreeze + step: KeyError", e)
# (2) Adam, trained then frozen before the save, full path
m, o = build(torch.optim.Adam, False); step(m, o); step(m, o)
m[0].weight.requires_grad_(False)
sd = get_optimizer_state_dict(m, o, options=full)
print("(2) saved state of 0.weight:", {k: (v.tolist() if k == "step" else tuple(v.shape)) for k, v in sd["state"]["0.weight"].items()})
m2, o2 = build(torch.optim.Adam, False); m2[0].weight.requires_grad_(False)
set_optimizer_state_dict(m2, o2, sd, options=full)
w = m2[0].weight
print("(2) after load, its state:", dict(o2.state[w]) if w in o2.state and o2.state[w] else "{} / <absent>")
w.requires_grad_(True); step(m2, o2)
print("(2) unfreeze + step: step =", float(o2.state[w]["step"]), "(an uninterrupted run would be at 3)")
dist.destroy_process_group()
