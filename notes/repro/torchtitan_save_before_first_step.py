"""Reproducer (torchtitan 0.3.0, torch 2.13, one process, CPU, no FSDP needed): a checkpoint
taken before the first optimizer step changes the optimizer, and the training that follows
in the same process. ``OptimizersContainer.state_dict()`` runs ``init_optim_state``
(torchtitan/components/optimizer/optimizer.py ``state_dict``, optimizer/utils.py:29-67): a
zero-gradient, lr=0 ``step()``. Parameters stay as they are (documented), but AdamW now
holds step=1 and zero moments, so the first real step bias-corrects as step 2: its update
differs from a run that did not save.
Run: .venv/bin/python notes/repro/torchtitan_save_before_first_step.py"""
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


def train_step(model, optims, scheds):
    optims.zero_grad(); model(torch.ones(3, 4)).pow(2).sum().backward()
    optims.step(); scheds.step()


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    weights = {}
    for save_first in (False, True):
        model, optims, scheds = build()
        (inner,) = optims.optimizers
        if save_first:
            CheckpointManager.Config(enable=True, folder=tempfile.mkdtemp(), interval=1,
                                     keep_latest_k=0).build(
                dataloader=None, model_parts=[model], optimizers=optims,
                lr_schedulers=scheds, states={}, sd_adapter=None).save(0)
            w = model[0].weight
            print("after save(0): state of 0.weight: step", float(inner.state[w]["step"]),
                  "| exp_avg all zero:", bool((inner.state[w]["exp_avg"] == 0).all()))
        train_step(model, optims, scheds)
        weights[save_first] = model[0].weight.detach().clone()
        print(f"save(0) first={save_first}: after 1 training step: step "
              f"{float(inner.state[model[0].weight]['step'])}")
    print("weights after 1 step differ by (max abs):",
          float((weights[True] - weights[False]).abs().max()))
