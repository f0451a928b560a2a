"""The unwrapped (plain) copy of a case's zoo model and the optimizer a plain trainer builds
for it: what a PARAM_ID dict is keyed against (its ids are positions in that optimizer's
groups). Plain torch: the rank side's rekey observer (sut/rekey.py) and the judge
(properties, known effects) read them alike, so they live on this floor, below both."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
from torch import nn

from .models import build_model
from .optimizers import ALL_OPTIMIZERS, build_optimizer

if TYPE_CHECKING:
    from ..cases import Case


def plain_model(case: "Case") -> nn.Module:
    """The case's zoo model, unwrapped, with the case's initial parameters."""
    return build_model(case.model, case.seed, case.torch_dtype)


def plain_optimizer(case: "Case", model: nn.Module,
                    group_fqns: Sequence[Sequence[str]] | None = None) -> torch.optim.Optimizer:
    """An optimizer of the case's kind on ``model``.

    ``group_fqns=None``: the zoo's grouping (``build_optimizer``). Otherwise one group per
    entry, holding the params named there, in ``model.named_parameters()`` order (the
    hyperparameters are the optimizer's defaults: loading a state dict sets them). Params
    named nowhere are left out; a name the model does not have raises ``KeyError``.
    """
    if group_fqns is None:
        return build_optimizer(case.optimizer, model.named_parameters(), case.groups)
    cls, kw = ALL_OPTIMIZERS[case.optimizer]
    order = {n: i for i, (n, _) in enumerate(model.named_parameters())}
    params = dict(model.named_parameters())
    groups = []
    for names in group_fqns:
        unknown = [n for n in names if n not in params]
        if unknown:
            raise KeyError(f"param group names {unknown} are not params of the plain "
                           f"{type(model).__name__} (its params: {list(params)})")
        groups.append({"params": [params[n] for n in sorted(names, key=order.__getitem__)]})
    return cls(groups, **kw)


def plain_optimizer_for(case: "Case", model: nn.Module,
                        full: dict) -> tuple[torch.optim.Optimizer, str]:
    """The plain optimizer that should load ``full``: mirroring its param groups, or, when
    ``full`` names params the plain model does not have, the zoo's grouping (then loading
    is expected to fail, and that is what gets observed). Returns (optimizer, how)."""
    try:
        groups = [list(g["params"]) for g in full["param_groups"]]
        return plain_optimizer(case, model, groups), "mirror"
    except KeyError as exc:
        return plain_optimizer(case, model), f"zoo grouping ({exc})"


def uses_model_order(model: nn.Module, optim: torch.optim.Optimizer) -> bool:
    """True when the optimizer's params are exactly ``model.parameters()`` in that order
    (what the ``optim_input=None`` path of ``rekey_optim_state_dict`` assumes)."""
    mine = [p for g in optim.param_groups for p in g["params"]]
    return len(mine) == len(list(model.parameters())) and all(
        a is b for a, b in zip(mine, model.parameters()))
