"""The full state dict -> one rank's local state dict.

Rules (what ``shard_full_optim_state_dict`` / ``scatter_full_optim_state_dict`` /
``optim_state_dict_to_load`` must return on ``rank``, keyed by optimizer keys)
------------------------------------------------------------------------------
Per-element state: a tensor whose shape is its param's shape, when the param has
dim > 0 or the state name is a positive-dim tensor for some param of the dict
(``per_element``; this decides for 0-dim params, where ``step`` and ``exp_avg`` look
alike). Everything else is scalar state (0-dim tensors, non-tensors).

Flat units (``use_orig_params=False``), if any param of the unit has state:
  * all params with state must have the same state names;
  * per-element state: params without state contribute zeros (FSDP's rule; a 0-dim
    param without state is an error); all must share one dtype and match their param
    shapes; the flattened values are concatenated in flat order (no alignment padding
    for ``use_orig_params=False``) and rank r gets ``flat[r*S:(r+1)*S]`` right-padded
    with zeros to ``S`` elements (NO_SHARD: the whole flat tensor);
  * scalar state: every param of the unit must have it, with equal value and type
    (0-dim: equal value and dtype); the common value is used (cloned). Exception: a
    zero-numel param with no state at all is skipped (it holds no element; FSDP
    raises here instead, see notes/reference-spec.md 5.2).
Original params (``use_orig_params=True``), per param with non-empty state:
  * sharded: nothing for ranks whose shard holds no element of the param; otherwise
    per-element state -> ``value.flatten()[start:end].clone()`` for the rank's piece
    (1-D, no padding), scalars unchanged. A zero-numel param goes, like in FSDP, to
    the rank(s) ``UnitLayout.fsdp_in_shard`` marks (``r*S < offset <= (r+1)*S - 1``;
    possibly none): per-element state as an empty 1-D tensor, scalars unchanged;
  * sharded, a positive-dim state tensor not shaped like its param (Adafactor's row_var /
    col_var factors of a param stepped whole): an error, it has no elements to cut by the
    rank's piece (torch cuts it by the param's element range anyway: the known entry
    fsdp1-orig-cuts-factored-state);
  * NO_SHARD: the state as is (cloned), in any shape.
Params outside any unit: their state, cloned, on every rank.
``param_groups``: every group's hyperparameters deep-copied; ``params`` mapped to the
rank's optimizer keys, de-duplicated and ordered by optimizer key order (FSDP sorts
the flat-param ids). A flat unit whose params fall in different groups, an unknown
FQN, or an optimizer key in no group is an error.
Tensors keep their device unless ``device`` is given.
"""

from __future__ import annotations

import math
from typing import Any, Collection, Iterable, Mapping

import torch

from .errors import (
    DtypeMismatch,
    MissingKeyError,
    ScalarStateConflict,
    ShapeMismatch,
    StateDictMismatch,
    UnknownKeyError,
)
from .keys import check_key_types, clone_value, per_element_names_from_full, values_equal
from .layout import ModelLayout, Piece, UnitLayout


def _is_elem(v: Any, shape: tuple[int, ...], name: str, per_element: Collection[str]) -> bool:
    if not isinstance(v, torch.Tensor):
        return False
    if v.dim() > 0:
        return True
    return shape == () and name in per_element


def check_full(layout: ModelLayout, full: Mapping) -> dict[str, dict[str, Any]]:
    """Validate a full dict's ``state``; return it keyed by canonical FQNs."""
    if not isinstance(full, Mapping) or "state" not in full:
        raise MissingKeyError("full dict has no 'state'", key="state")
    state = full["state"]
    check_key_types(state, want=str)
    out: dict[str, dict[str, Any]] = {}
    for k, v in state.items():
        if not layout.has(k):
            raise UnknownKeyError("state names a param the layout does not have", param=k,
                                  expected=layout.fqns()[:8])
        c = layout.canonical(k)
        if c in out:
            raise StateDictMismatch("tied param has state under two FQNs", param=k, expected=c)
        if not isinstance(v, Mapping):
            raise StateDictMismatch("param state must be a dict", param=k, got=type(v).__name__)
        out[c] = v
    return out


def shard_unit(
    layout: ModelLayout,
    unit: UnitLayout,
    state: Mapping[str, Mapping[str, Any]],
    rank: int,
    *,
    per_element: Collection[str] = (),
    device: Any = None,
) -> dict[str, dict[str, Any]]:
    """Local state entries ``{optimizer_key: {...}}`` of one unit on global ``rank``.

    ``state`` maps canonical FQNs to full per-param state (params of other units are
    ignored).
    """
    sr = layout.shard_rank(rank)
    if layout.use_orig_params:
        return _shard_orig(unit, state, sr, rank, per_element, device)
    return _shard_flat(unit, state, sr, rank, per_element, device)


def _shard_flat(unit, state, sr, rank, per_element, device):
    have = [p for p in unit.params if p.fqn in state and state[p.fqn]]
    if not have:
        return {}
    names = set(state[have[0].fqn])
    for p in have[1:]:
        if set(state[p.fqn]) != names:
            raise MissingKeyError(
                f"params of unit {unit.key!r} have different state names", param=p.fqn,
                expected=sorted(names, key=str), got=sorted(state[p.fqn], key=str),
            )
    out: dict[str, Any] = {}
    for name in sorted(names, key=str):
        vals = [(p, (state.get(p.fqn) or {}).get(name)) for p in unit.params]
        elem = [
            (p, v) for p, v in vals
            if v is not None and _is_elem(v, p.shape, name, per_element)
        ]
        if elem:
            dtype = elem[0][1].dtype
            pieces = []  # (param, its flattened state or None for zeros)
            for p, v in vals:
                if v is None:
                    if p.shape == ():
                        raise MissingKeyError("0-dim param without state in a unit that has state",
                                              param=p.fqn, key=name)
                    pieces.append((p, None))
                    continue
                if not _is_elem(v, p.shape, name, per_element):
                    raise StateDictMismatch("state kind differs within a unit", param=p.fqn, key=name,
                                            expected="tensor of the param's shape", got=v)
                if tuple(v.shape) != p.shape:
                    raise ShapeMismatch("state tensor does not have its param's shape", param=p.fqn,
                                        key=name, expected=p.shape, got=tuple(v.shape))
                if v.dtype != dtype:
                    raise DtypeMismatch("state dtypes differ within a unit", param=p.fqn, key=name,
                                        expected=dtype, got=v.dtype)
                pieces.append((p, v.detach().reshape(-1)))
            local = _flat_local(unit, sr, pieces, dtype)
            src_dev = elem[0][1].device
            out[name] = local.to(device if device is not None else src_dev)
        else:
            first = None
            for p, v in vals:
                if v is None and p.numel == 0 and p.shape != () and not state.get(p.fqn):
                    continue  # no element, no state: nothing to agree with
                if v is None:
                    raise ScalarStateConflict(
                        f"scalar state must be present for every param of unit {unit.key!r}",
                        param=p.fqn, key=name, expected=f"value like {have[0].fqn!r}", got="absent",
                    )
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    raise ShapeMismatch("positive-dim state tensor does not have its param's shape",
                                        param=p.fqn, key=name, expected=p.shape, got=tuple(v.shape))
                if first is None:
                    first = (p, v)
                elif not values_equal(first[1], v):
                    raise ScalarStateConflict(
                        f"scalar state differs within unit {unit.key!r}", param=p.fqn, key=name,
                        expected=f"{first[1]!r} (as {first[0].fqn!r})", got=v,
                    )
            out[name] = clone_value(first[1], device)
    return {unit.key: out}


def _flat_local(unit: UnitLayout, sr: int, pieces, dtype) -> torch.Tensor:
    """Shard rank ``sr``'s 1-D CPU tensor of the unit's flat state: for each param, the
    part of its flattened value (zeros for ``None``) that falls in ``[a, b)`` of the flat
    tensor, at ``offset - a``; everything else (right padding) zero. Only the rank's own
    elements are copied, never the whole unit."""
    a, b = unit.shard_range(sr)
    n = unit.shard_numel if unit.sharded else unit.flat_numel
    local = torch.empty(n, dtype=dtype)
    pos = 0  # local[:pos] is written
    for p, f in pieces:
        lo, hi = max(p.offset, a), min(p.end, b)
        if lo >= hi:
            continue
        if lo - a > pos:
            local[pos:lo - a].zero_()
        if f is None:
            local[lo - a:hi - a].zero_()
        else:
            local[lo - a:hi - a].copy_(f[lo - p.offset:hi - p.offset])
        pos = hi - a
    local[pos:].zero_()
    return local


def _shard_orig(unit, state, sr, rank, per_element, device):
    out: dict[str, dict[str, Any]] = {}
    pieces = {pc.fqn: pc for pc in unit.param_pieces(sr)} if unit.sharded else {}
    in_shard = dict(zip(unit.fqns, unit.fsdp_in_shard(sr))) if unit.sharded else {}
    for p in unit.params:
        st = state.get(p.fqn)
        if not st:
            continue
        for name, v in st.items():
            if unit.sharded and isinstance(v, torch.Tensor) and v.dim() > 0 \
                    and tuple(v.shape) != p.shape:
                raise ShapeMismatch("state tensor does not have its param's shape: it cannot "
                                    "be cut into a rank's piece of the param", param=p.fqn,
                                    key=name, rank=rank, expected=p.shape, got=tuple(v.shape))
        if unit.sharded and not in_shard[p.fqn]:
            continue
        res = {}
        for name, v in st.items():
            if unit.sharded and _is_elem(v, p.shape, name, per_element):
                # a zero-numel param FSDP marks in_shard has no piece: an empty slice
                pc = pieces.get(p.fqn) or Piece(p.fqn, 0, 0, 0)
                t = v.detach().reshape(-1)[pc.start_in_param:pc.end_in_param].clone()
                res[name] = t.to(device) if device is not None else t
            else:
                res[name] = clone_value(v, device)
        out[p.fqn] = res
    return out


def shard_param_groups(layout: ModelLayout, groups: Iterable[Mapping]) -> list[dict]:
    """Full ``param_groups`` (FQNs) -> local ``param_groups`` (optimizer keys)."""
    order = {k: i for i, k in enumerate(layout.optimizer_keys())}
    seen: dict[str, int] = {}
    out = []
    for gi, g in enumerate(groups):
        if "params" not in g:
            raise MissingKeyError(f"param_groups[{gi}] has no 'params'", key="params")
        keys = []
        for f in g["params"]:
            if not isinstance(f, str):
                raise UnknownKeyError(f"param_groups[{gi}] lists a non-FQN param", param=repr(f),
                                      key="params", expected="str FQN", got=type(f).__name__)
            if not layout.has(f):
                raise UnknownKeyError(f"param_groups[{gi}] lists an unknown param", param=f, key="params",
                                      expected=layout.fqns()[:8])
            unit, slot = layout.find(f)
            k = unit.key if (unit is not None and not layout.use_orig_params) else slot.fqn
            if k in seen and seen[k] != gi:
                raise StateDictMismatch(
                    f"param_groups[{gi}] and param_groups[{seen[k]}] share optimizer key {k!r}"
                    + (" (a flat unit's params must all be in one group)" if k != slot.fqn else ""),
                    param=f, key="params",
                )
            seen[k] = gi
            if k not in keys:
                keys.append(k)
        g2 = {k: clone_value(v) for k, v in g.items() if k != "params"}
        g2["params"] = sorted(keys, key=order.__getitem__)
        out.append(g2)
    missing = [k for k in layout.optimizer_keys() if k not in seen]
    if missing:
        raise MissingKeyError("optimizer keys in no param group", key="param_groups",
                              expected=layout.optimizer_keys(), got=f"missing {missing}")
    return out


def shard_full(
    layout: ModelLayout,
    full: Mapping,
    rank: int,
    *,
    per_element: Collection[str] | None = None,
    device: Any = None,
) -> dict:
    """The neutral local dict of ``rank`` for ``full`` (see the module docstring)."""
    if not 0 <= rank < layout.world_size:
        raise StateDictMismatch("rank out of range", rank=rank, expected=f"[0, {layout.world_size})")
    state = check_full(layout, full)
    if per_element is None:
        per_element = per_element_names_from_full(state)
    local: dict[str, dict[str, Any]] = {}
    for unit in layout.units:
        local.update(shard_unit(layout, unit, state, rank, per_element=per_element, device=device))
    for p in layout.plain_params:
        st = state.get(p.fqn)
        if st:
            local[p.fqn] = {n: clone_value(v, device) for n, v in st.items()}
    order = {k: i for i, k in enumerate(layout.optimizer_keys())}
    local = dict(sorted(local.items(), key=lambda kv: order[kv[0]]))
    groups = shard_param_groups(layout, full.get("param_groups", []))
    return {"state": local, "param_groups": groups}


def expected_local_numel(layout: ModelLayout, key: str, rank: int) -> int:
    """Numel of a per-element state tensor for optimizer ``key`` on ``rank``."""
    u = layout.unit_by_key(key)
    if u is not None:
        return u.shard_numel
    unit, slot = layout.find(key)
    if unit is None or not unit.sharded:
        return math.prod(slot.shape)
    for pc in unit.param_pieces(layout.shard_rank(rank)):
        if pc.fqn == slot.fqn:
            return pc.numel
    return 0
