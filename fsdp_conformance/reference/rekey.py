"""PARAM_ID <-> PARAM_NAME for an unwrapped model (``FSDP.rekey_optim_state_dict``).

Rules
-----
* Param ids are positions in the optimizer's params across its groups in order; with
  no ``optim`` given, the optimizer is assumed to be built from ``model.parameters()``.
* A param's name is its first FQN in ``model.named_parameters()`` (tied params once).
* ``state`` keys must be all int or all str (mixed keys raise :class:`MixedKeyTypes`);
  input already of the target type is returned unchanged (the same object, like torch).
* ``param_groups`` are deep-copied and each group's ``params`` is re-keyed and
  **sorted** (torch sorts names alphabetically and ids numerically; pass
  ``sort_params=False`` to keep the input order instead).
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

import torch
from torch import nn

from .errors import UnknownKeyError
from .keys import check_key_types


def _param_list(model: nn.Module, optim: torch.optim.Optimizer | None) -> list[nn.Parameter]:
    if optim is None:
        return list(model.parameters())
    return [p for g in optim.param_groups for p in g["params"]]


def _names(model: nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


def rekey_to_names(
    osd: Mapping[str, Any],
    model: nn.Module,
    *,
    optim: torch.optim.Optimizer | None = None,
    sort_params: bool = True,
) -> dict:
    """Int-keyed optimizer state dict -> keyed by param FQN."""
    t = check_key_types(osd["state"])
    if t is str:
        return osd  # type: ignore[return-value]
    params = _param_list(model, optim)
    names = _names(model)
    id_to_name = []
    for i, p in enumerate(params):
        if id(p) not in names:
            raise UnknownKeyError("optimizer param is not a parameter of the model", param=f"id {i}",
                                  got=tuple(p.shape))
        id_to_name.append(names[id(p)])

    def name(i: int, where: str) -> str:
        if not isinstance(i, int) or not 0 <= i < len(id_to_name):
            raise UnknownKeyError(f"param id out of range in {where}", param=repr(i),
                                  expected=f"int in [0, {len(id_to_name)})", got=i)
        return id_to_name[i]

    out: dict[str, Any] = {k: v for k, v in osd.items() if k not in ("state", "param_groups")}
    out["state"] = {name(i, "state"): s for i, s in osd["state"].items()}
    groups = copy.deepcopy(list(osd.get("param_groups", [])))
    for g in groups:
        ps = [name(i, "param_groups") for i in g["params"]]
        g["params"] = sorted(ps) if sort_params else ps
    out["param_groups"] = groups
    return out


def rekey_to_ids(
    named_osd: Mapping[str, Any],
    model: nn.Module,
    *,
    optim: torch.optim.Optimizer | None = None,
    sort_params: bool = True,
) -> dict:
    """FQN-keyed optimizer state dict -> keyed by param id (loadable by ``optim``)."""
    t = check_key_types(named_osd["state"])
    if t is int:
        return named_osd  # type: ignore[return-value]
    params = _param_list(model, optim)
    pid = {id(p): i for i, p in enumerate(params)}
    name_to_id: dict[str, int] = {}
    aliases: dict[str, str] = {}
    first: dict[int, str] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[n] = first[id(p)]
            continue
        first[id(p)] = n
        if id(p) in pid:
            name_to_id[n] = pid[id(p)]

    def ident(n: str, where: str) -> int:
        if n in name_to_id:
            return name_to_id[n]
        hint = ""
        if n in aliases:
            hint = f" (tied: an alias of {aliases[n]!r}, which is the name to use)"
        elif n in first.values():
            hint = " (a model param the optimizer does not hold)"
        raise UnknownKeyError(f"unknown param name in {where}{hint}", param=n,
                              expected=sorted(name_to_id)[:8])

    out: dict[str, Any] = {k: v for k, v in named_osd.items() if k not in ("state", "param_groups")}
    out["state"] = {ident(n, "state"): s for n, s in named_osd["state"].items()}
    groups = copy.deepcopy(list(named_osd.get("param_groups", [])))
    for g in groups:
        ps = [ident(n, "param_groups") for n in g["params"]]
        g["params"] = sorted(ps) if sort_params else ps
    out["param_groups"] = groups
    return out
