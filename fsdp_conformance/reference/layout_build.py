"""How FSDP1 lays out a model's parameters: :func:`build_layout` (from an unwrapped
module and its wrap plan) and :func:`layout_from_spec` (from a plain description), giving
the :class:`~.layout.ModelLayout` of reference/layout.py (whose docstring has the sharding
rules).

Rules (FSDP1, torch 2.13; see notes/reference-spec.md for file:line citations)
--------------------------------------------------------------------------------

Which parameters a unit owns
    Units are the root ("") and every FQN in ``wrap``. FSDP wraps bottom-up, so a
    unit claims, in post-order (a nested unit before its ancestor; siblings in
    registration order), every not-yet-claimed parameter in its subtree that is not
    in an ignored module's subtree. A tied parameter is therefore owned once, by
    the first unit that claims it. A unit that claims no parameter has no flat
    parameter and does not appear in the layout.

Order inside a unit
    ``unit_module.named_modules(remove_duplicate=False)`` (pre-order), then each
    module's own parameters in registration order; a parameter seen again (tied)
    is skipped, so it keeps the FQN of its first encounter (relative to the unit,
    prefixed with the unit's FQN). Later FQNs of the same tensor are ``aliases``.

Name of a tied parameter (``ParamSlot.fqn``, the key of its state)
    ``use_orig_params=False``: the unit-relative first FQN above (FSDP names state by
    ``FlatParameter._fqns``). ``use_orig_params=True``: the param's first FQN in the
    whole model, ``module.named_parameters()`` order (FSDP names state by
    ``_get_param_to_fqns(model)``, first encounter in a pre-order walk). The two differ
    only for a param tied across units whose owning unit is not the one holding the
    first FQN; then ``ParamSlot.flat_fqn`` keeps the unit-relative name
    (``UnitLayout.flat_fqns``: FSDP's ``_fqns``, what P0 compares).

Offsets and padding (``_init_flat_param_and_metadata``)
    ``use_orig_params=False``: no padding at all; params are concatenated, so
    ``flat_numel = sum(numels)``.
    ``use_orig_params=True``: with ``A = 16 // element_size(dtype)`` (dtype = the
    forward/backward param dtype, i.e. ``MixedPrecision.param_dtype`` if set), the
    start of every parameter *after the first* is rounded up to a multiple of ``A``
    elements (padding is inserted before a param only when the running total is not
    already a multiple of ``A``; no padding after the last param), then the whole flat
    tensor is padded to a multiple of the process-group size ``P`` (the world size,
    or the shard-group size under HYBRID_SHARD; NO_SHARD still pads to ``P``).
    Padding elements belong to no parameter.

Optimizer keys (``ModelLayout.optimizer_keys``)
    The order of ``fsdp_model.parameters()``: pre-order over the (deduplicated)
    module tree, own params first. With ``use_orig_params=False`` a unit's
    ``FlatParameter`` is registered on the unit's module, so its key
    ``"<unit>._flat_param"`` (root: ``"_flat_param"``) sits at the unit module's
    position; params of ignored modules stay at their own positions under their FQN.
    With ``use_orig_params=True`` the keys are the original FQNs in the original
    ``module.parameters()`` order.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from .errors import LayoutError
from .layout import ModelLayout, ParamSlot, UnitLayout, default_keys

FSDP_ALIGNMENT_BYTES = 16
STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
FLAT_PARAM = "_flat_param"


def align_numel_for(dtype: torch.dtype) -> int:
    """FSDP's ``_get_aligned_numel``: ``16 // element_size``."""
    return FSDP_ALIGNMENT_BYTES // torch.empty((), dtype=dtype).element_size()


def flat_offsets(numels: Sequence[int], align: int, pad_to: int) -> tuple[list[int], int]:
    """Offsets of params in an unsharded flat tensor and its total numel.

    ``align > 0`` (use_orig_params=True): before each param, pad the running total
    up to a multiple of ``align`` (only if it is not one already); after the last
    param pad the total to a multiple of ``pad_to``. ``align == 0``: plain concat.
    """
    total, offsets = 0, []
    for n in numels:
        if align > 0:
            pad = align - total % align
            if 0 < pad < align:
                total += pad
        offsets.append(total)
        total += n
    if align > 0 and pad_to > 0:
        pad = pad_to - total % pad_to
        if 0 < pad < pad_to:
            total += pad
    return offsets, total


def _check_strategy(strategy: str, world_size: int, shard_world_size: int | None) -> tuple[int, str]:
    if strategy not in STRATEGIES:
        raise LayoutError(f"unknown strategy {strategy!r}; expected one of {STRATEGIES}")
    if world_size < 1:
        raise LayoutError(f"world size must be >= 1, got {world_size}")
    if strategy == "HYBRID_SHARD":
        sws = shard_world_size if shard_world_size is not None else world_size
        if sws < 1 or world_size % sws:
            raise LayoutError(
                f"HYBRID_SHARD needs shard_world_size dividing world_size; got {sws} and {world_size}"
            )
    else:
        if shard_world_size not in (None, world_size):
            raise LayoutError(
                f"shard_world_size {shard_world_size} only differs from world_size under HYBRID_SHARD"
            )
        sws = world_size
    # FSDP clamps any strategy to NO_SHARD when its process group has size 1.
    effective = "NO_SHARD" if sws == 1 else strategy
    return sws, effective


def _make_unit(
    name: str,
    params: Sequence[tuple],  # (fqn, shape, requires_grad, aliases[, flat_fqn])
    *,
    use_orig_params: bool,
    pg_size: int,
    sharded: bool,
    dtype: torch.dtype,
) -> UnitLayout:
    align = align_numel_for(dtype) if use_orig_params else 0
    numels = [math.prod(e[1]) for e in params]
    offsets, flat = flat_offsets(numels, align, pg_size)
    slots = tuple(
        ParamSlot(fqn, tuple(shape), n, off, rg, aliases, *rest)
        for (fqn, shape, rg, aliases, *rest), n, off in zip(params, numels, offsets)
    )
    if sharded:
        s = -(-flat // pg_size)
        padded = s * pg_size
    else:
        padded = flat
    key = f"{name}.{FLAT_PARAM}" if name else FLAT_PARAM
    return UnitLayout(
        name=name,
        key=key,
        params=slots,
        padded_numel=padded,
        shard_world_size=pg_size,
        sharded=sharded,
        use_orig_params=use_orig_params,
        flat_numel=flat,
        align_numel=align,
        dtype=dtype,
    )


def layout_from_spec(
    units: Sequence[tuple[str, Sequence[tuple]]],
    world_size: int,
    *,
    use_orig_params: bool,
    strategy: str = "FULL_SHARD",
    shard_world_size: int | None = None,
    plain: Sequence[tuple[str, Sequence[int]]] = (),
    dtype: torch.dtype = torch.float32,
    key_order: Sequence[str] | None = None,
) -> ModelLayout:
    """Build a layout from a plain description, without an ``nn.Module``.

    ``units``: ``[(unit_name, [(fqn, shape) | (fqn, shape, requires_grad), ...]), ...]``
    with params in flat order; units with no params are dropped. ``plain``: params
    outside any unit. ``dtype`` fixes the alignment (use_orig_params=True). Without
    ``key_order`` the optimizer keys are the units in the given order (their flat
    key, or their params' FQNs), then the plain params.
    """
    sws, effective = _check_strategy(strategy, world_size, shard_world_size)
    sharded = effective != "NO_SHARD"
    pg_size = sws if strategy == "HYBRID_SHARD" else world_size
    seen: set[str] = set()
    built = []
    for name, params in units:
        norm = []
        for entry in params:
            fqn, shape = entry[0], tuple(int(d) for d in entry[1])
            rg = bool(entry[2]) if len(entry) > 2 else True
            if fqn in seen:
                raise LayoutError(f"duplicate FQN {fqn!r} in spec")
            seen.add(fqn)
            norm.append((fqn, shape, rg, ()))
        if not norm:
            continue
        if not use_orig_params and len({rg for _, _, rg, _ in norm}) > 1:
            raise LayoutError(
                f"unit {name!r}: use_orig_params=False needs uniform requires_grad in a FlatParameter"
            )
        built.append(
            _make_unit(name, norm, use_orig_params=use_orig_params, pg_size=pg_size, sharded=sharded, dtype=dtype)
        )
    plain_slots = []
    for fqn, shape in plain:
        if fqn in seen:
            raise LayoutError(f"duplicate FQN {fqn!r} in spec")
        seen.add(fqn)
        shape = tuple(int(d) for d in shape)
        plain_slots.append(ParamSlot(fqn, shape, math.prod(shape), 0))
    layout = ModelLayout(
        units=tuple(built),
        world_size=world_size,
        shard_world_size=sws,
        strategy=effective,
        use_orig_params=use_orig_params,
        plain_params=tuple(plain_slots),
        key_order=tuple(key_order) if key_order is not None else (),
    )
    if key_order is not None:
        expected = sorted(default_keys(layout))
        if sorted(key_order) != expected:
            raise LayoutError(f"key_order {list(key_order)} is not a permutation of {expected}")
    return layout


def build_layout(
    module: nn.Module,
    wrap: Sequence[str],
    world_size: int,
    *,
    use_orig_params: bool,
    strategy: str = "FULL_SHARD",
    shard_world_size: int | None = None,
    ignored: Sequence[str] = (),
    mp_param_dtype: torch.dtype | None = None,
) -> ModelLayout:
    """The layout FSDP1 gives the *unwrapped* ``module`` (see the module docstring).

    ``wrap``: FQNs of submodules that are their own FSDP unit (the root is always one).
    ``ignored``: FQNs of ignored submodules (their subtree's params stay whole).
    ``mp_param_dtype``: ``MixedPrecision.param_dtype``, which sets the alignment.
    """
    sws, effective = _check_strategy(strategy, world_size, shard_world_size)
    sharded = effective != "NO_SHARD"
    pg_size = sws if strategy == "HYBRID_SHARD" else world_size
    mods = dict(module.named_modules(remove_duplicate=False))
    for w in list(wrap) + list(ignored):
        if w not in mods:
            raise LayoutError(f"no submodule named {w!r} in {type(module).__name__}")
    unit_names = [""] + [w for w in dict.fromkeys(wrap) if w != ""]
    ignored_set = set(ignored)

    def under(fqn: str, prefix: str) -> bool:
        return prefix == "" or fqn == prefix or fqn.startswith(prefix + ".")

    def is_ignored(mod_fqn: str) -> bool:
        return any(under(mod_fqn, i) for i in ignored_set)

    # post-order over the module tree (children before parents, named_children order),
    # the order in which (auto-)wrapping constructs nested units
    post: list[str] = []

    def visit(m: nn.Module, prefix: str) -> None:
        for cname, c in m.named_children():
            visit(c, f"{prefix}.{cname}" if prefix else cname)
        if prefix in unit_names or (prefix == "" and m is module):
            post.append(prefix)

    visit(module, "")
    post = list(dict.fromkeys(post))

    claimed: dict[int, str] = {}  # id(param) -> unit name
    all_fqns: dict[int, list[str]] = {}
    params_by_id: dict[int, nn.Parameter] = {}
    for mname, m in module.named_modules(remove_duplicate=False):
        for pname, p in m._parameters.items():
            if p is None:
                continue
            fqn = f"{mname}.{pname}" if mname else pname
            all_fqns.setdefault(id(p), []).append(fqn)
            params_by_id[id(p)] = p
    for uname in post:
        if is_ignored(uname) and uname:
            raise LayoutError(f"unit {uname!r} lies inside an ignored module")
        for mname, m in mods[uname].named_modules(remove_duplicate=False):
            full = f"{uname}.{mname}" if uname and mname else (uname or mname)
            if is_ignored(full):
                continue
            for p in m._parameters.values():
                if p is not None and id(p) not in claimed:
                    claimed[id(p)] = uname

    units_built: dict[str, UnitLayout] = {}
    dtype_of: dict[str, torch.dtype] = {}
    for uname in unit_names:
        entries = []
        seen: set[int] = set()
        for mname, m in mods[uname].named_modules(remove_duplicate=False):
            full = f"{uname}.{mname}" if uname and mname else (uname or mname)
            if is_ignored(full):
                continue
            for pname, p in m._parameters.items():
                if p is None or claimed.get(id(p)) != uname or id(p) in seen:
                    continue
                seen.add(id(p))
                fqn = f"{full}.{pname}" if full else pname
                flat_fqn = ""
                if use_orig_params and all_fqns[id(p)][0] != fqn:  # tied across units
                    fqn, flat_fqn = all_fqns[id(p)][0], fqn
                aliases = tuple(f for f in all_fqns[id(p)] if f != fqn)
                entries.append((fqn, tuple(p.shape), p.requires_grad, aliases, flat_fqn))
                if uname not in dtype_of:
                    dtype_of[uname] = p.dtype
                elif p.dtype != dtype_of[uname]:
                    raise LayoutError(
                        f"unit {uname!r}: FSDP needs one dtype per FlatParameter; got "
                        f"{dtype_of[uname]} and {p.dtype} (param {fqn!r})"
                    )
        if not entries:
            continue
        if not use_orig_params and len({e[2] for e in entries}) > 1:
            raise LayoutError(
                f"unit {uname!r}: use_orig_params=False needs uniform requires_grad; "
                f"params {[e[0] for e in entries]} mix frozen and trainable"
            )
        units_built[uname] = _make_unit(
            uname,
            entries,
            use_orig_params=use_orig_params,
            pg_size=pg_size,
            sharded=sharded,
            dtype=mp_param_dtype or dtype_of[uname],
        )

    # optimizer keys: pre-order over the deduplicated module tree, own params first
    keys: list[str] = []
    unit_order: list[str] = []
    plain: list[ParamSlot] = []
    emitted: set[int] = set()
    slot_fqn = {p.fqn: p for u in units_built.values() for p in u.params}
    for mname, m in module.named_modules():
        if mname in units_built and not use_orig_params:
            keys.append(units_built[mname].key)
            unit_order.append(mname)
        for pname, p in m._parameters.items():
            if p is None or id(p) in emitted:
                continue
            emitted.add(id(p))
            owner = claimed.get(id(p))
            if owner is None:
                fqn = f"{mname}.{pname}" if mname else pname
                aliases = tuple(f for f in all_fqns[id(p)] if f != fqn)
                plain.append(ParamSlot(fqn, tuple(p.shape), p.numel(), 0, p.requires_grad, aliases))
                keys.append(fqn)
            elif use_orig_params:
                fqn = next(f for f in [*all_fqns[id(p)]] if f in slot_fqn)
                keys.append(fqn)
                if owner not in unit_order:
                    unit_order.append(owner)
    return ModelLayout(
        units=tuple(units_built[n] for n in unit_order),
        world_size=world_size,
        shard_world_size=sws,
        strategy=effective,
        use_orig_params=use_orig_params,
        plain_params=tuple(plain),
        key_order=tuple(keys),
    )
