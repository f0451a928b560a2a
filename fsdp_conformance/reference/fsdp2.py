"""FSDP2 (``fully_shard``): full per-param state <-> each rank's local (dim-0) shard.

Rules: per-element state (a tensor with the param's shape) of param ``p`` on rank
``r`` is ``state[r*R : min((r+1)*R, d0)]`` along dim 0 (``Fsdp2Param.rows``), shape
``(rows, *rest)`` -- possibly 0 rows -- as the local tensor of a ``Shard(0)`` DTensor;
scalar state (``step``) is replicated unchanged. Local dicts here are the plain
local tensors keyed by FQN (what ``DTensor.to_local()`` gives), ``param_groups``
keyed by FQN too. Gathering concatenates the ranks' rows; scalars must agree.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from .errors import MissingKeyError, RankCountMismatch, ShapeMismatch, UnknownKeyError
from .gather import _agree
from .keys import clone_value
from .layout import Fsdp2Layout


def _is_elem(v: Any, shape: tuple[int, ...]) -> bool:
    return isinstance(v, torch.Tensor) and v.dim() > 0


def fsdp2_shard(layout: Fsdp2Layout, full: Mapping, rank: int) -> dict:
    """Rank ``rank``'s local (to_local) state from a full FQN-keyed dict."""
    known = {p.fqn for p in layout.params}
    state = {}
    for fqn, st in full.get("state", {}).items():
        if fqn not in known:
            raise UnknownKeyError("state names a param the layout does not have", param=fqn)
        p = layout.param(fqn)
        a, b = p.rows(rank)
        res = {}
        for n, v in st.items():
            if _is_elem(v, p.shape):
                if tuple(v.shape) != p.shape:
                    raise ShapeMismatch("state tensor does not have its param's shape", param=fqn, key=n,
                                        expected=p.shape, got=tuple(v.shape))
                res[n] = v.detach()[a:b].clone()
            else:
                res[n] = clone_value(v)
        state[fqn] = res
    groups = [{k: clone_value(v) for k, v in g.items()} for g in full.get("param_groups", [])]
    return {"state": state, "param_groups": groups}


def fsdp2_gather(layout: Fsdp2Layout, local_dicts: Sequence[Mapping]) -> dict:
    """Full FQN-keyed dict from every rank's local (to_local) state."""
    if len(local_dicts) != layout.world_size:
        raise RankCountMismatch("wrong number of per-rank dicts", expected=layout.world_size,
                                got=len(local_dicts))
    state = {}
    for p in layout.params:
        holders = [r for r, d in enumerate(local_dicts) if p.fqn in d.get("state", {})]
        if not holders:
            continue
        if len(holders) != layout.world_size:
            missing = next(r for r in range(layout.world_size) if r not in holders)
            raise MissingKeyError("param has state on some ranks only", param=p.fqn, rank=missing)
        names = set(local_dicts[0]["state"][p.fqn])
        res = {}
        for n in sorted(names, key=str):
            vals = [local_dicts[r]["state"][p.fqn].get(n) for r in range(layout.world_size)]
            if isinstance(vals[0], torch.Tensor) and vals[0].dim() > 0:
                for r, v in enumerate(vals):
                    if v is None or tuple(v.shape) != p.local_shape(r):
                        raise ShapeMismatch("local shard has the wrong shape", param=p.fqn, key=n, rank=r,
                                            expected=p.local_shape(r), got=None if v is None else tuple(v.shape))
                res[n] = torch.cat([v.detach().to(vals[0].device) for v in vals], dim=0)
            else:
                res[n] = clone_value(_agree(list(enumerate(vals)), param=p.fqn, key=n))
        state[p.fqn] = res
    for d in local_dicts:
        for k in d.get("state", {}):
            if k not in {p.fqn for p in layout.params}:
                raise UnknownKeyError("state names a param the layout does not have", param=k)
    groups = [{k: clone_value(v) for k, v in g.items()} for g in local_dicts[0].get("param_groups", [])]
    return {"state": state, "param_groups": groups}
