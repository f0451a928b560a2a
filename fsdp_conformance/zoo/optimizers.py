"""Optimizers by name, with one or several param groups.

Rule: ``build_optimizer(name, named_params, groups)`` puts every param in group 0 unless
``groups == 2``: then params whose name contains "head" or "out" or "block.2" go to a second
group with its own hyperparameters (a distinct lr and weight_decay), so mis-mapped param
groups show up as wrong values."""
from __future__ import annotations

from typing import Iterable

import torch

OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": 0.05}),  # stateless: no momentum
    "sgd_momentum": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
    "adam": (torch.optim.Adam, {"lr": 0.01}),
    "adamw": (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
    "adadelta": (torch.optim.Adadelta, {"lr": 0.5}),
    "adagrad": (torch.optim.Adagrad, {"lr": 0.05}),
    "rmsprop": (torch.optim.RMSprop, {"lr": 0.01}),
}

_SECOND_GROUP = ("head", "out", "block.2")


def build_optimizer(name: str, named_params: Iterable[tuple[str, torch.nn.Parameter]],
                    groups: int = 1, foreach: bool | None = None) -> torch.optim.Optimizer:
    try:
        cls, kw = OPTIMIZERS[name]
    except KeyError:
        raise ValueError(f"unknown optimizer {name!r}; known: {sorted(OPTIMIZERS)}") from None
    kw = dict(kw)
    if foreach is not None:
        kw["foreach"] = foreach
    named = [(n, p) for n, p in named_params]
    if groups == 1:
        return cls([p for _, p in named], **kw)
    second = [p for n, p in named if any(s in n for s in _SECOND_GROUP)]
    first = [p for n, p in named if not any(s in n for s in _SECOND_GROUP)]
    extra = {"lr": kw["lr"] * 0.5}
    if "weight_decay" in kw or cls in (torch.optim.Adam, torch.optim.SGD):
        extra["weight_decay"] = 0.01
    return cls([{"params": first}, {"params": second, **extra}], **kw)
