"""N ranks' local dicts under one layout -> M ranks' local dicts under another.

Rule: ``reshard(src, locals, dst)[r] == shard_full(dst, gather_full(src, locals), r)``
(values, dtypes; tensors on the source device unless ``device`` is given), computed
one destination unit at a time: only the params of that unit are gathered (from
whichever source units hold them), sharded for every destination rank and dropped.
The source and destination layouts must hold the same FQNs.
``src_locals`` is a sequence of neutral local dicts, or a callable ``rank -> dict``
(called once per source rank, e.g. a lazy ``torch.load(..., mmap=True)``).
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Mapping, Sequence

from .errors import MissingKeyError, UnknownKeyError
from .gather import gather_param_groups, gather_unit
from .keys import check_locals, clone_value, per_element_names_from_locals
from .layout import ModelLayout
from .shard import shard_param_groups, shard_unit


def reshard(
    src_layout: ModelLayout,
    src_locals: Sequence[Mapping] | Callable[[int], Mapping],
    dst_layout: ModelLayout,
    *,
    per_element: Collection[str] | None = None,
    device: Any = None,
) -> list[dict]:
    """Re-shard neutral local dicts from ``src_layout`` to ``dst_layout`` (module docstring)."""
    if callable(src_locals) and not isinstance(src_locals, Sequence):
        src_locals = [src_locals(r) for r in range(src_layout.world_size)]
    locals_ = check_locals(src_layout, src_locals)
    src_fqns, dst_fqns = set(src_layout.fqns()), set(dst_layout.fqns())
    if src_fqns != dst_fqns:
        extra, missing = sorted(src_fqns - dst_fqns), sorted(dst_fqns - src_fqns)
        if extra:
            raise UnknownKeyError("source holds params the destination layout lacks", param=extra[0],
                                  got=extra[:8])
        raise MissingKeyError("destination layout has params the source lacks", param=missing[0],
                              got=missing[:8])
    if per_element is None:
        per_element = per_element_names_from_locals(locals_)
    groups = gather_param_groups(src_layout, locals_)
    out = [{"state": {}, "param_groups": shard_param_groups(dst_layout, groups)}
           for _ in range(dst_layout.world_size)]

    def gather_fqns(fqns: list[str]) -> dict[str, dict[str, Any]]:
        part: dict[str, dict[str, Any]] = {}
        by_unit: dict[str, list[str]] = {}
        for f in fqns:
            unit, slot = src_layout.find(f)
            if unit is None:
                st = locals_[0]["state"].get(slot.fqn)
                if st:
                    part[slot.fqn] = {n: clone_value(v) for n, v in st.items()}
            else:
                by_unit.setdefault(unit.key, []).append(slot.fqn)
        for key, fs in by_unit.items():
            unit = next(u for u in src_layout.units if u.key == key)
            part.update(gather_unit(src_layout, unit, locals_, fqns=fs, device=None))
        return part

    for unit in dst_layout.units:
        part = gather_fqns(list(unit.fqns))
        for r in range(dst_layout.world_size):
            out[r]["state"].update(
                shard_unit(dst_layout, unit, part, r, per_element=per_element, device=device)
            )
        del part
    for p in dst_layout.plain_params:
        part = gather_fqns([p.fqn])
        if part.get(p.fqn):
            for r in range(dst_layout.world_size):
                out[r]["state"][p.fqn] = {n: clone_value(v, device) for n, v in part[p.fqn].items()}
    order = {k: i for i, k in enumerate(dst_layout.optimizer_keys())}
    for d in out:
        d["state"] = dict(sorted(d["state"].items(), key=lambda kv: order[kv[0]]))
    return out
