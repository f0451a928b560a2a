"""Describing what an optimizer dict holds: each state value (:func:`describe_value`),
the param groups, the params in report order, the key type and the optimizer class.

Rules
-----
Order: params listed in param groups first (group by group, in their order), then params
  with state in no group, in the order of ``state``.
Sizes (``StateInfo``): ``shape`` is the whole tensor's (known for a whole tensor, a
  ShardedTensor, a DTensor and a DCP entry; None for per-rank 1-D pieces, whose sizes are
  ``rank_numel``); ``numel`` counts the whole tensor's elements when its shape is known,
  else the pieces' (padding included); ``nbytes`` counts the bytes stored in the files read
  (every rank's piece or copy).
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import torch

from .load import ShardedRecord
from .summary import SHARDED_KINDS, GroupInfo, ParamInfo, StateInfo

FLAT_MARKER = "_flat_param"


def _nonfinite(t: torch.Tensor) -> int:
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return 0
    return int(t.numel() - torch.isfinite(t).sum().item())


def _scalar(v: Any) -> Any:
    """A JSON-safe form of a hyperparameter or scalar state value (NaN/Inf as their repr)."""
    if isinstance(v, torch.Tensor):
        return _scalar(v.item()) if v.numel() == 1 else f"tensor{tuple(v.shape)}"
    if isinstance(v, (list, tuple)):
        return [_scalar(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _scalar(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else repr(v)
    return repr(v)


def dtype_name(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


def _is_dtensor(v: Any) -> bool:
    return type(v).__name__ == "DTensor" and hasattr(v, "_local_tensor")


def describe_value(name: str, v: Any) -> StateInfo:
    """What one state value is (values are read: NaN/Inf are counted)."""
    if isinstance(v, ShardedRecord):
        return StateInfo(name=name, kind="sharded tensor", dtype=dtype_name(v.dtype),
                         shape=v.shape, numel=math.prod(v.shape),
                         nbytes=sum(t.numel() * t.element_size() for t in v.local),
                         nonfinite=sum(_nonfinite(t) for t in v.local),
                         rank_numel=(sum(t.numel() for t in v.local),), chunks=v.chunks,
                         world_size=v.world_size)
    if _is_dtensor(v):
        local = v._local_tensor
        return StateInfo(name=name, kind="dtensor", dtype=dtype_name(v.dtype),
                         shape=tuple(v.shape), numel=math.prod(v.shape),
                         nbytes=local.numel() * local.element_size(), nonfinite=_nonfinite(local),
                         rank_numel=(local.numel(),),
                         world_size=math.prod(tuple(v.device_mesh.shape)),
                         placements=", ".join(str(p) for p in v.placements))
    if isinstance(v, torch.Tensor):
        nbytes = v.numel() * v.element_size()
        if v.dim() == 0:
            return StateInfo(name=name, kind="scalar tensor", dtype=dtype_name(v.dtype), shape=(),
                             numel=1, nbytes=nbytes,
                             value=_scalar(v), nonfinite=_nonfinite(v))
        return StateInfo(name=name, kind="tensor", dtype=dtype_name(v.dtype), shape=tuple(v.shape),
                         numel=v.numel(), nbytes=nbytes,
                         nonfinite=_nonfinite(v))
    if isinstance(v, (bool, int, float, str)):
        return StateInfo(name=name, kind=type(v).__name__, value=_scalar(v))
    if v is None:
        return StateInfo(name=name, kind="none")
    return StateInfo(name=name, kind=f"other:{type(v).__name__}")


def step_of(state: Iterable[StateInfo]) -> tuple[Any, str | None]:
    for s in state:
        if s.name == "step":
            return s.value, "tensor" if s.kind == "scalar tensor" else s.kind
    return None, None


def key_type_of(keys: Iterable[Any]) -> str:
    kinds = {"int" if isinstance(k, int) else "fqn" if isinstance(k, str) else type(k).__name__
             for k in keys}
    return "none" if not kinds else kinds.pop() if len(kinds) == 1 else "mixed"


def group_infos(raw: Sequence[Mapping]) -> tuple[GroupInfo, ...]:
    return tuple(GroupInfo(index=i,
                           hyper={str(k): _scalar(v) for k, v in g.items() if k != "params"},
                           params=tuple(g.get("params", ()))) for i, g in enumerate(raw))


def group_index(groups: Sequence[GroupInfo]) -> dict[Any, tuple[int, ...]]:
    out: dict[Any, list[int]] = {}
    for g in groups:
        for k in g.params:
            out.setdefault(k, []).append(g.index)
    return {k: tuple(v) for k, v in out.items()}


def in_group_order(params: Sequence[ParamInfo], groups: Sequence[GroupInfo]) -> tuple[ParamInfo,
                                                                                      ...]:
    """Params in group order, then those in no group (see the module docstring)."""
    pos = {k: i for i, k in enumerate(dict.fromkeys(k for g in groups for k in g.params))}
    return tuple(sorted(params, key=lambda p: pos.get(p.key, len(pos))))


def guess_optimizer(groups: Sequence[GroupInfo]) -> str | None:
    """The optimizer class the param groups' keys point to (torch.optim defaults: each class
    has keys of its own, checked before the keys classes share)."""
    if not groups:
        return None
    hyper = groups[0].hyper
    keys = set(hyper)
    for own, name in _OWN_KEYS:
        if own <= keys:
            return name
    if {"betas", "amsgrad"} <= keys:
        if "decoupled_weight_decay" not in keys:
            return "Adam or AdamW"
        return "AdamW" if hyper["decoupled_weight_decay"] else "Adam"
    if {"momentum", "dampening", "nesterov"} <= keys:
        return "SGD"
    if {"lr_decay", "initial_accumulator_value"} <= keys:
        return "Adagrad"
    if {"alpha", "centered"} <= keys:
        return "RMSprop"
    if "rho" in keys:
        return "Adadelta"
    if {"betas", "decoupled_weight_decay"} <= keys:
        return "RAdam"
    if "betas" in keys:
        return "Adamax"
    return None


_OWN_KEYS: tuple[tuple[frozenset, str], ...] = (
    (frozenset({"momentum_decay"}), "NAdam"),
    (frozenset({"lambd", "t0"}), "ASGD"),
    (frozenset({"etas", "step_sizes"}), "Rprop"),
    (frozenset({"beta2_decay"}), "Adafactor"),
    (frozenset({"ns_coefficients"}), "Muon"),
    (frozenset({"history_size", "line_search_fn"}), "LBFGS"),
)
"""Param-group keys only one torch.optim class has (torch 2.13's defaults)."""


def is_stateless(groups: Sequence[GroupInfo], optimizer: str | None) -> bool:
    """SGD with momentum 0 in every group keeps no state at all."""
    return optimizer == "SGD" and bool(groups) and all(
        not g.hyper.get("momentum") for g in groups)



def params_from_state(state: Mapping, listed: Mapping[Any, tuple[int, ...]]) -> list[ParamInfo]:
    """One ParamInfo per key of ``state`` (described), then per listed key without state."""
    params = []
    for k, st in state.items():
        infos = tuple(describe_value(str(n), v) for n, v in st.items()) \
            if isinstance(st, Mapping) else (describe_value("<value>", st),)
        step, kind = step_of(infos)
        params.append(ParamInfo(key=k, groups=listed.get(k, ()), state=infos, step=step,
                                step_kind=kind))
    params += [ParamInfo(key=k, groups=gs, state=()) for k, gs in listed.items() if k not in state]
    return params


def recorded_world_sizes(params: Iterable[ParamInfo]) -> set[int | None]:
    return {s.world_size for p in params for s in p.state if s.kind in SHARDED_KINDS}



def total_bytes(params: Iterable[ParamInfo]) -> int:
    return sum(s.nbytes for p in params for s in p.state)
