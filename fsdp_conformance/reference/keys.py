"""Neutral local dicts: string keys instead of optimizer param ids, plus input checks.

A real ``optim.state_dict()`` keys ``state`` and ``param_groups[i]["params"]`` by
int ids (the position of the param among all groups' params). The neutral *local*
form uses ``keys[id]`` instead, where ``keys`` is ``ModelLayout.optimizer_keys()``.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping, Sequence

import torch

from .errors import MissingKeyError, MixedKeyTypes, RankCountMismatch, UnknownKeyError


# Module-name prefixes that wrappers insert into FQNs: FSDP1, activation checkpointing,
# torch.compile. A checkpoint's keys are compared without them.
WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def clean_name(name: str) -> str:
    """``name`` without FSDP/activation-checkpointing/compile wrapper prefixes."""
    for p in WRAPPER_PREFIXES:
        name = name.replace(p, "")
    return name


def check_key_types(state: Mapping, *, rank: int | None = None, want: type | None = None) -> type | None:
    """Return ``int`` or ``str`` (the one key type used in ``state``), or None if empty.

    Raises :class:`MixedKeyTypes` when int and str keys are mixed, or when the keys are
    not of type ``want``.
    """
    types = {type(k) for k in state}
    if len(types) > 1:
        ints = [k for k in state if isinstance(k, int)][:3]
        strs = [k for k in state if isinstance(k, str)][:3]
        raise MixedKeyTypes(
            "state keys mix types", key="state", rank=rank, expected="all int or all str",
            got=f"int keys {ints} and str keys {strs}",
        )
    t = next(iter(types), None)
    if t is not None and t not in (int, str):
        raise MixedKeyTypes("state keys must be int or str", rank=rank, got=t.__name__)
    if want is not None and t is not None and t is not want:
        raise MixedKeyTypes(
            f"state keys must be {want.__name__}", rank=rank, expected=want.__name__, got=t.__name__,
            key=repr(next(iter(state))),
        )
    return t


def to_named(osd: Mapping[str, Any], keys: Sequence[str], *, rank: int | None = None) -> dict:
    """Int-keyed ``optim.state_dict()`` -> neutral local dict keyed by ``keys[id]``.

    Values are not copied. Already string-keyed input is validated and returned as a
    new outer dict.
    """
    state = osd.get("state", {})
    t = check_key_types(state, rank=rank)
    if t is str:
        for k in state:
            if k not in keys:
                raise UnknownKeyError("unknown optimizer key", param=k, rank=rank, expected=list(keys)[:8])
        return {"state": dict(state), "param_groups": copy.deepcopy(list(osd.get("param_groups", [])))}

    def name(i: Any, where: str) -> str:
        if not isinstance(i, int) or not 0 <= i < len(keys):
            raise UnknownKeyError(
                f"param id out of range in {where}", param=repr(i), rank=rank,
                expected=f"int in [0, {len(keys)})", got=i,
            )
        return keys[i]

    out_state = {name(i, "state"): v for i, v in state.items()}
    groups = []
    for g in osd.get("param_groups", []):
        g2 = {k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
        g2["params"] = [name(i, "param_groups") for i in g["params"]]
        groups.append(g2)
    return {"state": out_state, "param_groups": groups}


def to_ids(named: Mapping[str, Any], keys: Sequence[str], *, rank: int | None = None) -> dict:
    """Neutral local dict -> int-keyed dict loadable by ``optim.load_state_dict``."""
    index = {k: i for i, k in enumerate(keys)}
    state = named.get("state", {})
    check_key_types(state, rank=rank)

    def ident(k: Any, where: str) -> int:
        if isinstance(k, int):
            if not 0 <= k < len(keys):
                raise UnknownKeyError(f"param id out of range in {where}", param=repr(k), rank=rank)
            return k
        if k not in index:
            raise UnknownKeyError(f"unknown optimizer key in {where}", param=k, rank=rank, expected=list(keys)[:8])
        return index[k]

    out_state = {ident(k, "state"): v for k, v in state.items()}
    groups = []
    for g in named.get("param_groups", []):
        g2 = {k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
        g2["params"] = [ident(k, "param_groups") for k in g["params"]]
        groups.append(g2)
    return {"state": out_state, "param_groups": groups}


def check_locals(layout, local_dicts: Sequence[Mapping]) -> list[Mapping]:
    """Validate per-rank neutral local dicts against ``layout``; return them as a list."""
    local_dicts = list(local_dicts)
    if len(local_dicts) != layout.world_size:
        raise RankCountMismatch(
            "wrong number of per-rank dicts", expected=layout.world_size, got=len(local_dicts)
        )
    known = set(layout.optimizer_keys())
    for r, d in enumerate(local_dicts):
        if not isinstance(d, Mapping) or "state" not in d:
            raise MissingKeyError("local dict has no 'state'", key="state", rank=r, got=type(d).__name__)
        check_key_types(d["state"], rank=r, want=str)
        for k in d["state"]:
            if k not in known:
                raise UnknownKeyError(
                    "state key is not an optimizer key of this layout", param=k, rank=r,
                    expected=sorted(known)[:8],
                )
    return local_dicts


def category(v: Any) -> str:
    """``"tensor"`` (positive-dim tensor), ``"scalar_tensor"`` (0-dim) or ``"value"``."""
    if isinstance(v, torch.Tensor):
        return "tensor" if v.dim() > 0 else "scalar_tensor"
    return "value"


def values_equal(a: Any, b: Any) -> bool:
    """Equality for scalar state / hyperparameters: tensors by dtype+value, NaN == NaN."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        a_, b_ = a.detach().cpu(), b.detach().cpu()
        return bool(torch.equal(a_, b_) or (a_.is_floating_point() and torch.equal(a_.isnan(), b_.isnan())
                                             and torch.equal(a_.nan_to_num(0.0), b_.nan_to_num(0.0))))
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and a != a and b != b:
        return True
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(values_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(values_equal(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:
        return False


def clone_value(v: Any, device: Any = None) -> Any:
    if isinstance(v, torch.Tensor):
        v = v.detach().clone()
        return v.to(device) if device is not None else v
    return copy.deepcopy(v)


def per_element_names_from_full(state: Mapping[str, Mapping[str, Any]]) -> set[str]:
    """State names that are positive-dim tensors for at least one param of a full dict."""
    return {n for s in state.values() for n, v in s.items() if category(v) == "tensor"}


def per_element_names_from_locals(local_dicts: Sequence[Mapping]) -> set[str]:
    """State names that are positive-dim tensors anywhere in some rank's local dict."""
    return {n for d in local_dicts for s in d["state"].values() for n, v in s.items() if category(v) == "tensor"}


def unflatten_osd(flat: Mapping[str, Any], groups: Sequence[Sequence[str]]) -> dict:
    """A flattened optimizer state dict (DSD's ``flatten_optimizer_state_dict=True``:
    ``{"state.<fqn>.<name>": v, "param_groups.<fqn>.<key>": v}``) in the nested named form
    ``{"state": {fqn: {name: v}}, "param_groups": [{key: v, "params": [fqn, ...]}]}``.

    Rules: ``groups`` are the optimizer's groups as FQN lists (its order); a key's FQN is the
    longest of them it starts with. A group's hyperparameters are the values its FQNs
    carry; FQNs of one group that disagree on a key, a group FQN without param_groups keys,
    or a key naming no known FQN raise ``ValueError`` naming the key (the flattened dict is
    then not what torch's flattening of a nested one gives).
    """
    fqns = sorted({f for g in groups for f in g}, key=len, reverse=True)

    def split(key: str, rest: str) -> tuple[str, str]:
        for f in fqns:
            if rest.startswith(f + "."):
                return f, rest[len(f) + 1:]
        raise ValueError(f"flattened optimizer state key {key!r} names no param of the "
                         f"optimizer")

    state: dict[str, dict] = {}
    hyper: dict[str, dict] = {}
    for key, v in flat.items():
        section, _, rest = key.partition(".")
        if section not in ("state", "param_groups"):
            raise ValueError(f"flattened optimizer state key {key!r} is neither 'state.*' "
                             f"nor 'param_groups.*'")
        fqn, name = split(key, rest)
        (state if section == "state" else hyper).setdefault(fqn, {})[name] = v
    out_groups = []
    for g in groups:
        merged: dict[str, Any] = {}
        for f in g:
            if f not in hyper:
                raise ValueError(f"flattened optimizer state has no 'param_groups.{f}.*' key")
            for name, v in hyper[f].items():
                if name in merged and not values_equal(merged[name], v):
                    raise ValueError(f"flattened optimizer state: params of one group "
                                     f"disagree on {name!r} ({g[0]}: {merged[name]!r}, "
                                     f"{f}: {v!r})")
                merged.setdefault(name, v)
        out_groups.append({**merged, "params": list(g)})
    return {"state": state, "param_groups": out_groups}
