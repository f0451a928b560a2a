"""An LR scheduler built after the optimizer's state is loaded resets every group's lr to the
schedule's step-0 value; its load_state_dict does not put the saved lr back. One process,
no FSDP: plain Optimizer.load_state_dict. (Entry scheduler-built-after-load-resets-lr.)

Run: python notes/repro/scheduler_built_after_load_resets_lr.py
Seen on torch 2.13.0+cpu:
  LambdaLR:   lr at the save 0.01, after optimizer load 0.01, after building the scheduler
              and loading its state 0.00333... (step-0 value); next step back on the curve
  OneCycleLR: lr 0.0388..., after 0.0016 (its step-0 value)
  ExponentialLR: 0.0081 -> 0.0081: chainable, immune at step 0
"""
import math

import torch
from torch.optim import lr_scheduler as lr


def warmup_cosine(step, warmup=2, total=8, floor=0.1):
    if step < warmup:
        return (step + 1) / (warmup + 1)
    t = min(1.0, (step - warmup) / (total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))


SCHEDULES = {
    "LambdaLR": lambda o: lr.LambdaLR(o, warmup_cosine),
    "OneCycleLR": lambda o: lr.OneCycleLR(o, max_lr=0.04, total_steps=8, cycle_momentum=False),
    "ExponentialLR": lambda o: lr.ExponentialLR(o, gamma=0.9),
}

for name, make in SCHEDULES.items():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(3))
    opt = torch.optim.AdamW([p], lr=0.01)
    sched = make(opt)
    for _ in range(2):
        p.grad = torch.randn(3)
        opt.step()
        sched.step()
    saved_opt, saved_sched = opt.state_dict(), sched.state_dict()
    at_save = opt.param_groups[0]["lr"]

    q = torch.nn.Parameter(torch.randn(3))
    opt2 = torch.optim.AdamW([q], lr=0.01)
    opt2.load_state_dict(saved_opt)
    after_load = opt2.param_groups[0]["lr"]
    sched2 = make(opt2)                  # built after the optimizer's load
    sched2.load_state_dict(saved_sched)
    after_build = opt2.param_groups[0]["lr"]
    print(f"{name}: lr at the save {at_save!r}, after the optimizer's load {after_load!r}, "
          f"after building the scheduler and loading its state {after_build!r}")
    assert after_load == at_save
    if name == "ExponentialLR":
        assert after_build == at_save
    else:
        assert after_build != at_save, "fixed upstream? the saved lr survives"
