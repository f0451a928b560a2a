"""N ranks' local dicts under one layout -> M ranks' local dicts under another.

Rule: ``reshard(src, locals, dst)[r] == shard_full(dst, gather_full(src, locals), r)``
(values, dtypes; tensors on the source device unless ``device`` is given), computed
one destination unit at a time: only the params of that unit are gathered (from
whichever source units hold them), sharded for every destination rank and dropped.
The source and destination layouts must hold the same FQNs.
``src_locals`` is a sequence of neutral local dicts, or a callable ``rank -> dict``
(called once per source rank, e.g. a lazy ``torch.load(..., mmap=True)``).

Memory: besides the inputs and the M output dicts, at most one destination unit's full
state of *one* per-element state name (plus the scalars) is alive at a time: a unit is
gathered and sharded once per per-element state name (``exp_avg``, then ``exp_avg_sq``),
each pass writing every destination rank's tensor straight from it (``shard_unit``
copies only that rank's elements); the passes' entries are merged per optimizer key.
Checks are the same: every name is checked in its own pass.

:func:`shard_full_per_unit` is the same loop for a full dict that is fetched one unit
(and one state name) at a time (a file, a DCP checkpoint):
``shard_full_per_unit(dst, fetch, groups)[r] == shard_full(dst, {"state": fetch(every
FQN), "param_groups": groups}, r)``.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Mapping, Sequence

from .errors import MissingKeyError, UnknownKeyError
from .gather import gather_param_groups, gather_unit
from .keys import check_locals, clone_value, per_element_names_from_locals
from .layout import ModelLayout
from .shard import shard_param_groups, shard_unit

Fetch = Callable[[Sequence[str], Collection[str]], Mapping[str, Mapping[str, Any]]]


def shard_full_per_unit(
    dst_layout: ModelLayout,
    fetch: Fetch,
    param_groups: Sequence[Mapping],
    *,
    per_element: Collection[str],
    device: Any = None,
) -> list[dict]:
    """Every destination rank's neutral local dict, one destination unit at a time.

    ``fetch(fqns, skip)`` returns the full per-param state ``{fqn: {name: value}}`` of the
    canonical FQNs asked for (params without state left out), without the state names in
    ``skip``. Per destination unit it is called once per name in ``per_element`` (skipping
    the others; once with ``skip=()`` when ``per_element`` is empty), then once per plain
    param; each result is dropped once it is sharded for every rank. ``param_groups`` are
    full (FQN) groups. The caller checks that the FQNs ``fetch`` can return all belong to
    ``dst_layout``.
    """
    out = [{"state": {}, "param_groups": shard_param_groups(dst_layout, param_groups)}
           for _ in range(dst_layout.world_size)]
    names = sorted(per_element, key=str)
    skips = [[m for m in names if m != n] for n in names] or [[]]
    for unit in dst_layout.units:
        for skip in skips:
            part = fetch(list(unit.fqns), skip)
            for r in range(dst_layout.world_size):
                got = shard_unit(dst_layout, unit, part, r, per_element=per_element, device=device)
                for key, st in got.items():
                    out[r]["state"].setdefault(key, {}).update(st)
            del part
    for p in dst_layout.plain_params:
        part = fetch([p.fqn], ())
        if part.get(p.fqn):
            for r in range(dst_layout.world_size):
                out[r]["state"][p.fqn] = {n: clone_value(v, device) for n, v in part[p.fqn].items()}
    order = {k: i for i, k in enumerate(dst_layout.optimizer_keys())}
    for d in out:
        d["state"] = dict(sorted(d["state"].items(), key=lambda kv: order[kv[0]]))
    return out


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
    # same params on both sides; a tied param may be known by another of its FQNs
    extra = sorted(f for f in src_layout.fqns() if not dst_layout.has(f))
    missing = sorted(f for f in dst_layout.fqns() if not src_layout.has(f))
    if extra or missing:
        if extra:
            raise UnknownKeyError("source holds params the destination layout lacks", param=extra[0],
                                  got=extra[:8])
        raise MissingKeyError("destination layout has params the source lacks", param=missing[0],
                              got=missing[:8])
    if per_element is None:
        per_element = per_element_names_from_locals(locals_)
    groups = gather_param_groups(src_layout, locals_)
    units_by_key = {u.key: u for u in src_layout.units}

    def gather_fqns(fqns: Sequence[str], skip: Collection[str]) -> dict[str, dict[str, Any]]:
        """Full state of destination FQNs ``fqns``, keyed by them, without names in ``skip``."""
        part: dict[str, dict[str, Any]] = {}
        by_unit: dict[str, list[str]] = {}
        dst_name: dict[str, str] = {}
        for f in fqns:
            unit, slot = src_layout.find(f)
            dst_name[slot.fqn] = f
            if unit is None:
                st = locals_[0]["state"].get(slot.fqn)
                if st:
                    part[f] = {n: clone_value(v) for n, v in st.items() if n not in skip}
            else:
                by_unit.setdefault(unit.key, []).append(slot.fqn)
        for key, fs in by_unit.items():
            got = gather_unit(src_layout, units_by_key[key], locals_, fqns=fs, device=None,
                              skip=skip)
            part.update((dst_name[f], st) for f, st in got.items())
        return part

    return shard_full_per_unit(dst_layout, gather_fqns, groups, per_element=per_element,
                               device=device)
