"""Reproducer (torchtitan 0.3.0, torch 2.13, one process, CPU, no FSDP needed): a trainable
param that has no optimizer state at the save (it got no gradient yet: a head or branch the
steps so far did not use) makes ``CheckpointManager.load()`` raise
``RuntimeError: Missing key in checkpoint state_dict: optimizer.state.<fqn>.step``.
At the save the state exists, so ``init_optim_state`` is a no-op (optimizer/utils.py:40) and
the checkpoint has no state for that param; on the fresh optimizer of the load it creates
state for every trainable param (utils.py:48-51 zero grads, then a step), so DCP is asked for
keys the checkpoint lacks (torch default_planner.py:495).
Run: .venv/bin/python notes/repro/torchtitan_load_partial_state.py"""
import tempfile
import warnings

import torch
from torch import nn
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.optimizer import (LRSchedulersContainer, OptimizersContainer,
                                             ParamGroupConfig)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.aux_head = nn.Linear(4, 2)  # trainable, not used by these steps

    def forward(self, x):
        return self.body(x)


def build():
    torch.manual_seed(0)
    model = Net()
    optims = OptimizersContainer.Config(
        param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="AdamW",
                                       optimizer_kwargs={"lr": 1e-2})],
        implementation="for-loop").build(model_parts=[model])
    scheds = LRSchedulersContainer.Config(warmup_steps=1).build(optimizers=optims,
                                                                training_steps=10)
    return model, optims, scheds


def manager(folder, model, optims, scheds):
    return CheckpointManager.Config(enable=True, folder=folder, interval=1,
                                    keep_latest_k=0).build(
        dataloader=None, model_parts=[model], optimizers=optims, lr_schedulers=scheds,
        states={}, sd_adapter=None)


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    folder = tempfile.mkdtemp()
    model, optims, scheds = build()
    for _ in range(2):
        optims.zero_grad(); model(torch.ones(3, 4)).pow(2).sum().backward()
        optims.step(); scheds.step()
    (inner,) = optims.optimizers
    print("params with state at the save:",
          sorted(n for n, p in model.named_parameters() if p in inner.state))
    manager(folder, model, optims, scheds).save(2)
    model, optims, scheds = build()
    try:
        print("load() ->", manager(folder, model, optims, scheds).load())
    except BaseException as exc:  # DCP wraps it: CheckpointException is a BaseException
        print("load() raised:", type(exc).__name__, str(exc).strip().splitlines()[-1])
