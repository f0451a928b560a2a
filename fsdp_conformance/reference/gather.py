"""All ranks' local optimizer state -> the full, unflattened state dict.

Rules (what ``FSDP.full_optim_state_dict`` / ``optim_state_dict`` under FULL must return)
----------------------------------------------------------------------------------------
Flat units (``use_orig_params=False``), one entry per unit key in rank 0's state:
  * positive-dim tensor state: every shard rank holds a 1-D tensor of ``shard_numel``
    elements; the shards are concatenated in shard-rank order, cut to ``flat_numel``,
    and split into the unit's params in flat order, each reshaped to its param shape
    and cloned. Right padding is dropped. NO_SHARD: rank 0's 1-D tensor of ``flat_numel``.
  * 0-dim tensor and non-tensor state (``step``): rank 0's value, copied to every param
    of the unit (0-dim tensors cloned); other shard ranks must hold an equal value.
  * a unit with no state on rank 0 (e.g. never stepped, stateless SGD, all frozen)
    contributes no entry; every shard rank must hold the state rank 0 holds.
Original params (``use_orig_params=True``), per param:
  * sharded: rank r holds a 1-D tensor with exactly its piece of the param
    (``UnitLayout.param_pieces``), or no entry at all when it holds no element; pieces
    are placed at their offsets in the flattened param and the result reshaped.
    Every rank holding a piece must hold the state. Scalars come from the ranks that
    hold a non-empty piece (all ranks with the entry, for state without tensors) and
    must agree.
  * NO_SHARD (and world size 1): rank 0's state as it is (the optimizer stepped the
    whole param: a state tensor not shaped like it, Adafactor's factors, is kept).
  * a param with state on no rank is left out (torch raises instead when the param
    requires grad and a sibling in its unit has state; see notes).
Params outside any unit: rank 0's state, cloned.
Within a param, tensor states come first, then 0-dim tensors, then other values,
each group sorted by name (FSDP's order; dict order is not part of the contract).
``param_groups``: rank 0's groups, every hyperparameter deep-copied, ``params``
replaced by FQNs: a flat key expands to its unit's FQNs in flat order. All ranks
must agree on the hyperparameters.
HYBRID_SHARD: the first replica (global ranks ``0 .. shard_world_size-1``) is used;
``check_replicas=True`` also requires the other replicas to be bitwise equal.
Tensors are returned on ``device`` (default CPU, like ``offload_to_cpu``/``cpu_offload``);
``device=None`` keeps the source device.
"""

from __future__ import annotations

from typing import Any, Collection, Iterable, Mapping, Sequence

import torch

from .errors import (
    DtypeMismatch,
    MissingKeyError,
    ScalarStateConflict,
    ShapeMismatch,
    StateDictMismatch,
)
from .keys import category, check_locals, clone_value, values_equal
from .layout import ModelLayout, UnitLayout
from .keys import values_equal as eq


def order_state(state: Mapping[str, Any]) -> dict[str, Any]:
    t = sorted(n for n, v in state.items() if category(v) == "tensor")
    z = sorted(n for n, v in state.items() if category(v) == "scalar_tensor")
    o = sorted((n for n, v in state.items() if category(v) == "value"), key=str)
    return {n: state[n] for n in (*t, *z, *o)}


def agree_on(values: list[tuple[int, Any]], *, param: str, key: str) -> Any:
    """All ``(rank, value)`` must be equal; returns the first value."""
    r0, v0 = values[0]
    for r, v in values[1:]:
        if not values_equal(v0, v):
            raise ScalarStateConflict(
                f"scalar state differs between ranks {r0} and {r}", param=param, key=key, rank=r,
                expected=v0, got=v,
            )
    return v0


def gather_unit(
    layout: ModelLayout,
    unit: UnitLayout,
    local_dicts: Sequence[Mapping],
    *,
    fqns: Iterable[str] | None = None,
    device: Any = "cpu",
    skip: Collection[str] = (),
) -> dict[str, dict[str, Any]]:
    """Full state ``{fqn: {state_name: value}}`` for the params of one unit.

    ``fqns`` restricts the output (the whole unit by default); state names in ``skip`` are
    left out of it (they are still checked). ``local_dicts`` must be already validated
    neutral local dicts for all ``layout.world_size`` ranks.
    """
    want = set(unit.fqns if fqns is None else fqns)
    ranks = list(range(unit.shard_world_size)) if unit.sharded else [0]
    if not layout.use_orig_params:
        return _gather_flat(unit, local_dicts, ranks, want, device, set(skip))
    return _gather_orig(unit, local_dicts, ranks, want, device, set(skip))


def _gather_flat(unit, local_dicts, ranks, want, device, skip=frozenset()):
    k = unit.key
    if k not in local_dicts[0]["state"]:
        for r in ranks[1:]:
            if k in local_dicts[r]["state"]:
                raise MissingKeyError(
                    "flat param has state on another rank but not on rank 0", param=k, rank=0,
                    expected=f"state like rank {r}", got="no entry",
                )
        return {}
    per_rank = []
    for r in ranks:
        st = local_dicts[r]["state"].get(k)
        if st is None:
            raise MissingKeyError("flat param has state on rank 0 but not on this rank", param=k, rank=r)
        per_rank.append(st)
    names = set(per_rank[0])
    for r, st in zip(ranks, per_rank):
        if set(st) != names:
            raise MissingKeyError(
                "state names differ between ranks", param=k, rank=r, expected=sorted(names), got=sorted(st),
            )
    out: dict[str, dict[str, Any]] = {p.fqn: {} for p in unit.params if p.fqn in want}
    for name in sorted(names, key=str):
        if name in skip:
            continue
        vals = [st[name] for st in per_rank]
        cats = {category(v) for v in vals}
        if len(cats) != 1:
            raise StateDictMismatch(
                "state kind differs between ranks", param=k, key=name,
                expected="same kind on every rank", got=[category(v) for v in vals],
            )
        cat = cats.pop()
        if cat == "tensor":
            want_n = unit.shard_numel
            dtype = vals[0].dtype
            for r, v in zip(ranks, vals):
                if v.dim() != 1 or v.numel() != want_n:
                    raise ShapeMismatch(
                        "flat state tensor has the wrong shape", param=k, key=name, rank=r,
                        expected=(want_n,), got=tuple(v.shape),
                    )
                if v.dtype != dtype:
                    raise DtypeMismatch("flat state dtype differs between ranks", param=k, key=name, rank=r,
                                        expected=dtype, got=v.dtype)
            # each param is copied once, straight from the shards that hold its elements
            # (same values as cutting the concatenated shards; no unit-sized temporary)
            for p in unit.params:
                if p.fqn in want:
                    t = _from_shards(unit, ranks, vals, p.offset, p.end, dtype, vals[0].device)
                    t = t.view(p.shape)
                    out[p.fqn][name] = t.to(device) if device is not None else t
        else:
            v0 = agree_on(list(zip(ranks, vals)), param=k, key=name)
            for p in unit.params:
                if p.fqn in want:
                    out[p.fqn][name] = clone_value(v0, device)
    return {f: order_state(s) for f, s in out.items()}


def _from_shards(unit: UnitLayout, ranks, vals, start: int, end: int, dtype, dev) -> torch.Tensor:
    """Elements ``[start, end)`` of the unit's flat tensor, from shard rank ``ranks[i]``'s
    1-D ``vals[i]`` (which holds ``[r*S, (r+1)*S)``; NO_SHARD: everything)."""
    out = torch.empty(end - start, dtype=dtype, device=dev)
    s = unit.shard_numel if unit.sharded else unit.flat_numel
    for r, v in zip(ranks, vals):
        base = r * s if unit.sharded else 0
        lo, hi = max(start, base), min(end, base + s)
        if lo < hi:
            out[lo - start:hi - start].copy_(v.detach()[lo - base:hi - base])
    return out


def _gather_orig(unit, local_dicts, ranks, want, device, skip=frozenset()):
    out: dict[str, dict[str, Any]] = {}
    for p in unit.params:
        if p.fqn not in want:
            continue
        if not unit.sharded:
            st = local_dicts[0]["state"].get(p.fqn)
            if not st:
                continue
            # the optimizer stepped the whole param: its state is what it keeps, in any
            # shape (Adafactor's row_var / col_var factors are not the param's)
            res = {name: clone_value(v, device) for name, v in st.items()}
            out[p.fqn] = order_state(res)
            continue
        pieces = {}
        for r in ranks:
            for pc in unit.param_pieces(r):
                if pc.fqn == p.fqn:
                    pieces[r] = pc
        holders = [r for r in ranks if local_dicts[r]["state"].get(p.fqn)]
        if not holders:
            continue
        for r in pieces:
            if r not in holders:
                raise MissingKeyError(
                    "rank holds part of the param but no state for it", param=p.fqn, rank=r,
                    expected=f"state for elements [{pieces[r].start_in_param}, {pieces[r].end_in_param})",
                    got="no entry",
                )
        names = set(local_dicts[holders[0]]["state"][p.fqn])
        for r in holders:
            got = set(local_dicts[r]["state"][p.fqn])
            if got != names:
                raise MissingKeyError("state names differ between ranks", param=p.fqn, rank=r,
                                      expected=sorted(names), got=sorted(got))
        res = {}
        tensor_names = {
            n for n in names for r in holders if category(local_dicts[r]["state"][p.fqn][n]) == "tensor"
        }
        for name in sorted(names, key=str):  # the first refusal named is the same every run
            if name in skip:
                continue
            if name in tensor_names:
                flat = None
                dtype = None
                for r in holders:
                    v = local_dicts[r]["state"][p.fqn][name]
                    n_want = pieces[r].numel if r in pieces else 0
                    if not isinstance(v, torch.Tensor) or v.dim() != 1 or v.numel() != n_want:
                        raise ShapeMismatch(
                            "sharded state tensor does not match the rank's piece of the param",
                            param=p.fqn, key=name, rank=r, expected=(n_want,),
                            got=tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__,
                        )
                    if dtype is None:
                        dtype = v.dtype
                        # every element is written below: the holders' pieces cover the param
                        flat = torch.empty(p.numel, dtype=dtype, device=v.device)
                    elif v.dtype != dtype:
                        raise DtypeMismatch("state dtype differs between ranks", param=p.fqn, key=name,
                                            rank=r, expected=dtype, got=v.dtype)
                    if r in pieces:
                        flat[pieces[r].start_in_param:pieces[r].end_in_param].copy_(v.detach())
                t = flat.view(p.shape)
                res[name] = t.to(device) if device is not None else t
            else:
                src = [r for r in holders if r in pieces] or holders
                vals = [(r, local_dicts[r]["state"][p.fqn][name]) for r in src]
                res[name] = clone_value(agree_on(vals, param=p.fqn, key=name), device)
        out[p.fqn] = order_state(res)
    return out


def gather_param_groups(layout: ModelLayout, local_dicts: Sequence[Mapping]) -> list[dict]:
    """Rank 0's ``param_groups`` with ids expanded to FQNs; all ranks must agree."""
    groups0 = local_dicts[0].get("param_groups", [])
    for r, d in enumerate(local_dicts[1:], start=1):
        groups = d.get("param_groups", [])
        if len(groups) != len(groups0):
            raise ScalarStateConflict("number of param groups differs from rank 0", key="param_groups",
                                      rank=r, expected=len(groups0), got=len(groups))
        for i, (g0, g) in enumerate(zip(groups0, groups)):
            for hk in sorted(set(g0) | set(g), key=str):
                if hk == "params":
                    continue
                if hk not in g or hk not in g0 or not values_equal(g0[hk], g[hk]):
                    raise ScalarStateConflict(
                        f"param_groups[{i}] hyperparameter differs from rank 0", key=hk, rank=r,
                        expected=g0.get(hk, "<absent>"), got=g.get(hk, "<absent>"),
                    )
    out = []
    for g in groups0:
        g2 = {k: clone_value(v) for k, v in g.items() if k != "params"}
        fqns: list[str] = []
        for k in g["params"]:
            u = layout.unit_by_key(k)
            if u is not None and not layout.use_orig_params:
                fqns.extend(u.fqns)
            elif layout.has(k):
                fqns.append(k)
            else:
                raise MissingKeyError("param_groups names an unknown optimizer key", param=k, rank=0,
                                      key="param_groups")
        g2["params"] = fqns
        out.append(g2)
    return out


def gather_full(
    layout: ModelLayout,
    local_dicts: Sequence[Mapping],
    *,
    device: Any = "cpu",
    check_replicas: bool = False,
) -> dict:
    """All ranks' neutral local dicts -> the full dict (see the module docstring).

    ``local_dicts[r]`` is rank r's ``optim.state_dict()`` converted with
    :func:`to_named` (keys from ``layout.optimizer_keys()``).
    """
    local_dicts = check_locals(layout, local_dicts)
    if check_replicas:
        _check_replicas(layout, local_dicts)
    state: dict[str, dict[str, Any]] = {}
    for unit in layout.units:
        state.update(gather_unit(layout, unit, local_dicts, device=device))
    for p in layout.plain_params:
        st = local_dicts[0]["state"].get(p.fqn)
        if st:
            state[p.fqn] = {n: clone_value(v, device) for n, v in st.items()}
    order = {f: i for i, f in enumerate(layout.fqns())}
    state = dict(sorted(state.items(), key=lambda kv: order[kv[0]]))
    return {"state": state, "param_groups": gather_param_groups(layout, local_dicts)}


def _check_replicas(layout: ModelLayout, local_dicts: Sequence[Mapping]) -> None:
    sws = layout.shard_world_size if layout.strategy != "NO_SHARD" else 1
    for r in range(sws, layout.world_size):
        ref = local_dicts[r % sws]["state"]
        got = local_dicts[r]["state"]
        if set(ref) != set(got):
            raise StateDictMismatch("replica holds different state keys than its first-replica peer",
                                    rank=r, expected=sorted(ref), got=sorted(got))
        for k in ref:
            for n in sorted(set(ref[k]) | set(got[k]), key=str):
                if n not in ref[k] or n not in got[k] or not eq(ref[k][n], got[k][n]):
                    raise StateDictMismatch("replica state differs from its first-replica peer",
                                            param=k, key=n, rank=r)
