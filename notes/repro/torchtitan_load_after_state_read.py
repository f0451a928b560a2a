"""Reproducer (torchtitan 0.3.0, torch 2.13, one process, CPU, no FSDP needed): reading
``optimizer.state[p]`` on a fresh optimizer before ``CheckpointManager.load()`` makes the
load restore no per-param optimizer state, while ``load()`` returns True.
torch's ``Optimizer.state`` is a defaultdict: the read inserts ``{}``; torchtitan's
``init_optim_state`` (torchtitan/components/optimizer/utils.py:40, ``if optim.state:
return``) then skips materialising the state, so ``OptimizersContainer.state_dict()`` asks
DCP for no state tensors and ``_unflatten_optim_state_dict`` (utils.py:157-169) rebuilds an
empty state. The param groups (lr, ...) are restored.
Run: .venv/bin/python notes/repro/torchtitan_load_after_state_read.py"""
import tempfile
import warnings

import torch
from torch import nn
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.optimizer import (LRSchedulersContainer, OptimizersContainer,
                                             ParamGroupConfig)


def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
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
    manager(folder, model, optims, scheds).save(2)
    (inner,) = optims.optimizers
    print("saved: state entries", len(inner.state), "step", float(inner.state[model[0].weight]["step"]))

    for touch in (False, True):
        model, optims, scheds = build()
        (inner,) = optims.optimizers
        if touch:  # e.g. logging code: optimizer.state[p].get("step")
            for p in model.parameters():
                inner.state[p].get("step")
        ok = manager(folder, model, optims, scheds).load()
        keys = sorted(inner.state[model[0].weight])
        print(f"read state first={touch}: load() -> {ok}; state of 0.weight after load: {keys}; "
              f"lr {inner.param_groups[0]['lr']}")
