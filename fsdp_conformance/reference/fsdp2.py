"""FSDP2 (``fully_shard``): full per-param state <-> each rank's local (dim-0) shard.

Rules
-----
* Per-element state (a positive-dim tensor) of a sharded param ``p`` on rank ``r`` is the
  box ``Fsdp2Param.box(r)`` of it: rows ``[a, b)`` along dim 0 (possibly 0 rows) as the
  local tensor of a ``Shard(0)`` DTensor (HSDP: rows of the rank's shard rank, the same on
  every replica); over tensor parallelism the dp rows of its tp chunk (fsdp2_layout.py).
* Scalar state (0-dim tensors such as ``step``, non-tensor values) is replicated
  unchanged on every rank.
* A sharded param that every rank holds whole (a shard group of one rank) is stepped whole,
  so its state may have any shape, as an unsharded param's (reference/gather.py): an
  Adafactor's factors, or state an optimizer holds once for all its params under the first
  (LBFGS's flat vectors over every param, its history lists). Shard gives it whole to
  every rank; gather takes it as the first replica holds it (its ranks must agree). Where
  a rank holds a piece, a positive-dim state tensor must have the param's shape: state of
  another shape has no piece to cut and is refused.
* Params outside FSDP2 (``Fsdp2Param.sharded`` False: ignored params) are plain
  tensors: shard gives every rank the whole state; gather takes rank 0's (FSDP2 does
  not synchronise them, so other ranks legitimately hold their own values).
* A param with no state in the full dict has no entry on any rank; gather requires a
  sharded param's state on every rank of the first replica or on none.
* Local dicts here are the plain local tensors keyed by FQN (what ``DTensor.to_local()``
  gives), ``param_groups`` keyed by FQN too (the neutral local form of
  ``optim.state_dict()``). Gathering places the first replica's pieces at their boxes
  (they must cover the param; the tp ranks' copies of a param replicated over ``tp`` must
  agree); scalars must agree. ``param_groups`` are copied unchanged.
* Flattening a rank's own sharded dict (``fsdp2_flatten``: its DTensors, or their neutral
  pieces, reference/flatten.py) gives its local state: the pieces placed at their global
  offsets and the rank's box taken; every element of the box must be covered. FSDP2 keeps
  per-parameter shards, so one rank's dict is all its local state needs.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch

from .errors import MissingKeyError, RankCountMismatch, ShapeMismatch, UnknownKeyError
from .gather import agree_on, order_state
from .keys import clone_value
from .fsdp2_layout import Fsdp2Layout
from .flatten import assemble


def _is_elem(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.dim() > 0


def _whole_everywhere(layout: Fsdp2Layout, p) -> bool:
    """Whether every rank's piece of the sharded param ``p`` is the whole param (a shard
    group of one rank): its state is then the rank's as the optimizer keeps it, in any
    shape (module rules)."""
    return all(p.local_shape(r) == p.shape for r in range(layout.world_size))


def fsdp2_shard(layout: Fsdp2Layout, full: Mapping, rank: int) -> dict:
    """Rank ``rank``'s local (to_local) state from a full FQN-keyed dict."""
    state = {}
    for fqn, st in full.get("state", {}).items():
        if not layout.has(fqn):
            raise UnknownKeyError("state names a param the layout does not have", param=fqn)
        p = layout.param(fqn)
        box = p.slices(rank)
        res = {}
        whole = _whole_everywhere(layout, p)
        for n, v in st.items():
            if _is_elem(v) and tuple(v.shape) == p.shape:
                res[n] = v.detach()[box].clone()
            elif _is_elem(v) and not whole:
                raise ShapeMismatch("state tensor does not have its param's shape", param=fqn, key=n,
                                    expected=p.shape, got=tuple(v.shape))
            else:
                res[n] = clone_value(v)
        state[fqn] = res
    groups = [{k: clone_value(v) for k, v in g.items()} for g in full.get("param_groups", [])]
    return {"state": state, "param_groups": groups}


def fsdp2_flatten(layout: Fsdp2Layout, sharded: Mapping, rank: int) -> dict:
    """Rank ``rank``'s local (to_local) state from its own sharded dict (module rules):
    ``fsdp2_shard`` of the assembled pieces, after checking they cover the rank's box."""
    state, cover = assemble(sharded)
    for (fqn, name), mask in cover.items():
        if not layout.has(fqn):
            raise UnknownKeyError("state names a param the layout does not have", param=fqn)
        p = layout.param(fqn)
        if mask.numel() != math.prod(p.shape):
            raise ShapeMismatch("sharded state does not have its param's shape", param=fqn,
                                key=name, rank=rank, expected=p.shape, got=tuple(mask.shape))
        miss = int((~mask.view(p.shape)[p.slices(rank)]).sum())
        if miss:
            raise MissingKeyError("sharded input does not cover an element this rank needs",
                                  param=fqn, key=name, rank=rank,
                                  expected=f"the box {p.box(rank)}", got=f"{miss} missing")
    return fsdp2_shard(layout, {"state": state,
                                "param_groups": list(sharded.get("param_groups", []))}, rank)


def _assemble(p, pieces: Sequence[tuple[int, torch.Tensor]], key: str) -> torch.Tensor:
    """The full state tensor of ``p`` from ``(rank, local piece)`` pairs, each placed at its
    rank's box; ranks whose box another rank placed already (a param replicated over the
    tp ranks) must hold the same values; every element must be covered."""
    first = pieces[0][1]
    full = torch.empty(p.shape, dtype=first.dtype, device=first.device)
    covered = torch.zeros(p.shape, dtype=torch.bool)
    placed: dict[tuple, tuple[int, torch.Tensor]] = {}
    for r, v in pieces:
        box = p.box(r)
        if box in placed:
            r0, v0 = placed[box]
            agree_on([(r0, v0), (r, v)], param=p.fqn, key=key)
            continue
        placed[box] = (r, v)
        where = tuple(slice(a, b) for a, b in box)
        full[where] = v.detach().to(first.device)
        covered[where] = True
    if not bool(covered.all()):
        raise ShapeMismatch("the ranks' pieces do not cover the param", param=p.fqn, key=key,
                            expected="every element", got=f"{int((~covered).sum())} uncovered")
    return full


def fsdp2_gather(layout: Fsdp2Layout, local_dicts: Sequence[Mapping]) -> dict:
    """Full FQN-keyed dict from every rank's local (to_local) state (module docstring)."""
    if len(local_dicts) != layout.world_size:
        raise RankCountMismatch("wrong number of per-rank dicts", expected=layout.world_size,
                                got=len(local_dicts))
    for d in local_dicts:
        for k in d.get("state", {}):
            if not layout.has(k):
                raise UnknownKeyError("state names a param the layout does not have", param=k)
    ranks = list(layout.first_replica())
    state = {}
    for p in layout.params:
        if not p.sharded:
            st = local_dicts[0].get("state", {}).get(p.fqn)
            if st is not None:
                for n, v in st.items():
                    if _is_elem(v) and tuple(v.shape) != p.shape:
                        raise ShapeMismatch("state tensor does not have its param's shape", param=p.fqn,
                                            key=n, rank=0, expected=p.shape, got=tuple(v.shape))
                state[p.fqn] = order_state({n: clone_value(v) for n, v in st.items()})
            continue
        whole = _whole_everywhere(layout, p)
        holders = [r for r in ranks if p.fqn in local_dicts[r].get("state", {})]
        if not holders:
            continue
        if len(holders) != len(ranks):
            missing = next(r for r in ranks if r not in holders)
            raise MissingKeyError("param has state on some ranks only", param=p.fqn, rank=missing)
        names = set(local_dicts[0]["state"][p.fqn])
        for r in ranks:
            got = set(local_dicts[r]["state"][p.fqn])
            if got != names:
                raise MissingKeyError("state names differ between ranks", param=p.fqn, rank=r,
                                      expected=sorted(names, key=str), got=sorted(got, key=str))
        res = {}
        for n in sorted(names, key=str):
            vals = [local_dicts[r]["state"][p.fqn][n] for r in ranks]
            if whole and not (isinstance(vals[0], torch.Tensor)
                              and tuple(vals[0].shape) == p.shape):
                res[n] = clone_value(agree_on(list(zip(ranks, vals)), param=p.fqn, key=n))
            elif _is_elem(vals[0]):
                for r, v in zip(ranks, vals):
                    if not isinstance(v, torch.Tensor) or tuple(v.shape) != p.local_shape(r):
                        raise ShapeMismatch("local shard has the wrong shape", param=p.fqn, key=n, rank=r,
                                            expected=p.local_shape(r),
                                            got=tuple(v.shape) if isinstance(v, torch.Tensor) else type(v))
                res[n] = _assemble(p, list(zip(ranks, vals)), n)
            else:
                res[n] = clone_value(agree_on(list(zip(ranks, vals)), param=p.fqn, key=n))
        state[p.fqn] = order_state(res)
    groups = [{k: clone_value(v) for k, v in g.items()} for g in local_dicts[0].get("param_groups", [])]
    return {"state": state, "param_groups": groups}
