"""Two optimizers from outside torch, as a user brings them to the plugin (our own code around
them; both installed by the set-up's ``trainers`` extra beside the pinned torch):

- ``make_lion``: ``lion_pytorch.Lion`` (lion-pytorch 0.2.5): one param-shaped state
  (``exp_avg``) and a ``betas`` tuple.
- ``make_schedulefree``: ``schedulefree.AdamWScheduleFree`` (schedulefree 1.4.1), put in
  train mode by the factory, as its documentation asks before the first step. Its
  ``train()`` / ``eval()`` read ``self.state[p]`` for every param (schedulefree's
  adamw_schedulefree.py:84, :97), and ``Optimizer.state`` is a defaultdict: an optimizer
  that has never stepped then holds an empty state entry per param.
"""
from __future__ import annotations

import torch
from torch import nn


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def data(step: int, n: int) -> torch.Tensor:
    return torch.randn(n, 6)


def make_lion(named_params):
    from lion_pytorch import Lion

    return Lion([p for _, p in named_params], lr=1e-3, weight_decay=0.01)


def make_schedulefree(named_params):
    from schedulefree import AdamWScheduleFree

    optimizer = AdamWScheduleFree([p for _, p in named_params], lr=0.01)
    optimizer.train()
    return optimizer
