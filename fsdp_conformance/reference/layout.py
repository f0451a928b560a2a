"""Flat-parameter layout of FSDP1 units, and FSDP2's per-parameter dim-0 layout.

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

Sharding (``FlatParamHandle._get_shard``)
    Sharded strategies (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD with shard group
    size > 1): every shard rank ``r`` of ``P`` holds ``S = ceil(flat_numel / P)``
    elements: ``flat[r*S : (r+1)*S]`` (``torch.chunk`` semantics), right-padded with
    zeros to ``S``. With ``use_orig_params=True`` ``flat_numel`` is already a multiple
    of ``P`` so no rank needs right padding; with ``False`` trailing ranks may own
    fewer real elements, or none. ``padded_numel = P * S``.
    NO_SHARD (also forced by FSDP whenever the process group has size 1): every rank
    holds the whole flat tensor, ``padded_numel = flat_numel``.
    HYBRID_SHARD: ranks are grouped in consecutive blocks of ``shard_world_size``;
    global rank ``g`` has shard rank ``g % shard_world_size``.

Optimizer keys (``ModelLayout.optimizer_keys``)
    The order of ``fsdp_model.parameters()``: pre-order over the (deduplicated)
    module tree, own params first. With ``use_orig_params=False`` a unit's
    ``FlatParameter`` is registered on the unit's module, so its key
    ``"<unit>._flat_param"`` (root: ``"_flat_param"``) sits at the unit module's
    position; params of ignored modules stay at their own positions under their FQN.
    With ``use_orig_params=True`` the keys are the original FQNs in the original
    ``module.parameters()`` order.

FSDP2 (``fully_shard``)
    Every parameter is its own ``Shard(0)`` DTensor: shard rank ``r`` of ``W`` holds rows
    ``[r*R, min((r+1)*R, d0))`` with ``R = ceil(d0 / W)`` (``torch.chunk`` on dim 0;
    trailing ranks may hold 0 rows, shape ``(0, *rest)``). 0-dim parameters are
    rejected by FSDP2 (``Shard dim 0 is invalid for 0D tensor``). HSDP (a 2-D mesh
    ``(W / S, S)``, placements ``(Replicate(), Shard(0))``): global rank ``g`` sits at
    mesh coordinate ``(g // S, g % S)``, so its shard rank is ``g % S`` and rows are
    chunked over ``S``. Parameters passed as ``ignored_params`` (the zoo's ignored
    modules) stay plain tensors, whole on every rank and not synchronised.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple, Sequence

import torch
from torch import nn

from .errors import LayoutError

FSDP_ALIGNMENT_BYTES = 16
STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
FLAT_PARAM = "_flat_param"


class Piece(NamedTuple):
    """The part of one parameter that lies in one rank's flat shard.

    ``[start_in_param, end_in_param)`` indexes the flattened parameter; the same
    elements sit at ``[start_in_shard, start_in_shard + end_in_param - start_in_param)``
    of the rank's local flat tensor.
    """

    fqn: str
    start_in_param: int
    end_in_param: int
    start_in_shard: int

    @property
    def numel(self) -> int:
        return self.end_in_param - self.start_in_param


@dataclass(frozen=True)
class ParamSlot:
    """One original parameter inside a unit's flat tensor.

    ``offset`` is the start of the parameter in the unit's unsharded flat tensor
    (alignment padding included). For params outside any unit (ignored modules)
    ``offset`` is 0.
    """

    fqn: str
    shape: tuple[int, ...]
    numel: int
    offset: int
    requires_grad: bool = True
    aliases: tuple[str, ...] = ()
    flat_fqn: str = ""  # FSDP's unit-relative name (``_fqns``) when it is not ``fqn``

    @property
    def end(self) -> int:
        return self.offset + self.numel


@dataclass(frozen=True)
class UnitLayout:
    """The flat layout of one FSDP unit (one ``FlatParameter``).

    ``flat_numel``: numel of FSDP's unsharded flat parameter (FSDP's
    ``_unpadded_unsharded_size``; includes alignment and world-size padding when
    ``use_orig_params``). ``padded_numel``: ``shard_world_size * shard_numel`` when
    sharded (FSDP's ``_padded_unsharded_size``), else ``flat_numel``. Rank arguments
    of the methods are *shard* ranks (``ModelLayout.shard_rank`` converts).
    """

    name: str
    key: str
    params: tuple[ParamSlot, ...]
    padded_numel: int
    shard_world_size: int
    sharded: bool
    use_orig_params: bool
    flat_numel: int = -1
    align_numel: int = 0
    dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        if self.flat_numel < 0:
            object.__setattr__(self, "flat_numel", self.padded_numel)

    @property
    def shard_numel(self) -> int:
        """Length of every rank's local flat tensor (right padding included)."""
        if not self.sharded:
            return self.flat_numel
        return self.padded_numel // self.shard_world_size

    @property
    def fqns(self) -> tuple[str, ...]:
        return tuple(p.fqn for p in self.params)

    @property
    def flat_fqns(self) -> tuple[str, ...]:
        """FSDP's ``FlatParameter._fqns`` prefixed with the unit's FQN (see the module
        docstring: differs from :attr:`fqns` only for a tied param under
        ``use_orig_params=True`` whose first FQN lies outside this unit)."""
        return tuple(p.flat_fqn or p.fqn for p in self.params)

    def slot(self, fqn: str) -> ParamSlot:
        for p in self.params:
            if p.fqn == fqn:
                return p
        raise KeyError(fqn)

    def shard_range(self, rank: int) -> tuple[int, int]:
        """Real (unpadded) elements ``[start, end)`` of the flat tensor held by shard rank ``rank``.

        ``S = ceil(flat_numel / P)``; rank ``r`` owns ``[r*S, min((r+1)*S, flat_numel))``
        (empty, ``start == end``, for trailing ranks past the end). NO_SHARD: all of it.
        """
        if not self.sharded:
            return (0, self.flat_numel)
        if not 0 <= rank < self.shard_world_size:
            raise ValueError(f"shard rank {rank} out of range for {self.shard_world_size}")
        s = self.shard_numel
        start = min(rank * s, self.flat_numel)
        return (start, min((rank + 1) * s, self.flat_numel))

    def param_pieces(self, rank: int) -> tuple[Piece, ...]:
        """For each param intersecting shard rank ``rank``'s range, the intersection.

        Only non-empty intersections are returned, in flat order.
        """
        start, end = self.shard_range(rank)
        out = []
        for p in self.params:
            lo, hi = max(p.offset, start), min(p.end, end)
            if lo < hi:
                out.append(Piece(p.fqn, lo - p.offset, hi - p.offset, lo - start))
        return tuple(out)

    def numels_with_padding(self) -> tuple[int, ...]:
        """FSDP's ``FlatParameter._numels_with_padding`` (padding entries included)."""
        out, pos = [], 0
        for p in self.params:
            if p.offset > pos:
                out.append(p.offset - pos)
            out.append(p.numel)
            pos = p.end
        if self.flat_numel > pos:
            out.append(self.flat_numel - pos)
        return tuple(out)

    def is_padding_mask(self) -> tuple[bool, ...]:
        """FSDP's ``FlatParameter._is_padding_mask``."""
        out, pos = [], 0
        for p in self.params:
            if p.offset > pos:
                out.append(True)
            out.append(False)
            pos = p.end
        if self.flat_numel > pos:
            out.append(True)
        return tuple(out)

    def fsdp_in_shard(self, rank: int) -> tuple[bool, ...]:
        """FSDP's ``_ShardParamInfo.in_shard`` per param (``_get_shard_metadata``).

        Uses the *padded* inclusive bounds ``[r*S, (r+1)*S - 1]`` like FSDP. For
        params with numel > 0 this equals "has a non-empty piece"; a zero-numel
        param at offset ``o`` counts as in shard iff ``r*S < o <= (r+1)*S - 1``
        (NO_SHARD: ``0 < o <= flat_numel - 1``).
        """
        if self.sharded:
            s = self.shard_numel
            lo, hi = rank * s, (rank + 1) * s - 1
        else:
            lo, hi = 0, self.flat_numel - 1
        return tuple(lo <= p.end - 1 and hi >= p.offset for p in self.params)

    def owner(self, fqn: str, index: int) -> int:
        """Shard rank holding flattened element ``index`` of param ``fqn`` (0 for NO_SHARD)."""
        if not self.sharded:
            return 0
        p = self.slot(fqn)
        return (p.offset + index) // self.shard_numel


@dataclass(frozen=True)
class ModelLayout:
    """Layout of a whole FSDP1 model: its units, plain params and optimizer keys.

    ``units`` are in optimizer order (``use_orig_params=False``) or in the order their
    first param appears among the optimizer keys (``True``). ``plain_params`` are params
    outside any unit (ignored modules), kept whole on every rank.
    ``key_order`` is what :meth:`optimizer_keys` returns.
    """

    units: tuple[UnitLayout, ...]
    world_size: int
    shard_world_size: int
    strategy: str
    use_orig_params: bool
    plain_params: tuple[ParamSlot, ...] = ()
    key_order: tuple[str, ...] = ()
    _index: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    def __post_init__(self) -> None:
        idx: dict[str, tuple[UnitLayout | None, ParamSlot]] = {}
        for u in self.units:
            for p in u.params:
                idx[p.fqn] = (u, p)
        for p in self.plain_params:
            idx[p.fqn] = (None, p)
        alias: dict[str, str] = {}
        for _, p in idx.values():
            for a in p.aliases:
                alias.setdefault(a, p.fqn)
        self._index["param"] = idx
        self._index["alias"] = alias
        self._index["unit_by_key"] = {u.key: u for u in self.units}
        if not self.key_order:
            object.__setattr__(self, "key_order", tuple(_default_keys(self)))

    # -- lookups -----------------------------------------------------------------
    def optimizer_keys(self) -> list[str]:
        """Ordered keys of a local optimizer built from ``fsdp_model.parameters()``."""
        return list(self.key_order)

    def fqns(self) -> list[str]:
        """All original-param FQNs in the order FSDP lists them in full ``param_groups``."""
        out = []
        for k in self.key_order:
            u = self._index["unit_by_key"].get(k)
            if u is not None and not self.use_orig_params:
                out.extend(u.fqns)
            else:
                out.append(k)
        return out

    def canonical(self, fqn: str) -> str:
        """Map an alias FQN (tied param) to the FQN FSDP keys it by; others unchanged."""
        return self._index["alias"].get(fqn, fqn)

    def find(self, fqn: str) -> tuple[UnitLayout | None, ParamSlot]:
        """``(unit or None for a plain param, slot)`` for an FQN (aliases accepted)."""
        return self._index["param"][self.canonical(fqn)]

    def has(self, fqn: str) -> bool:
        return self.canonical(fqn) in self._index["param"]

    def unit_by_key(self, key: str) -> UnitLayout | None:
        return self._index["unit_by_key"].get(key)

    def keys_of_unit(self, unit: UnitLayout) -> list[str]:
        """Optimizer keys that belong to ``unit``."""
        return [unit.key] if not self.use_orig_params else list(unit.fqns)

    def shard_rank(self, rank: int) -> int:
        """Rank inside the shard group (HYBRID_SHARD: ``rank % shard_world_size``)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} out of range for world size {self.world_size}")
        return rank % self.shard_world_size

    def owner(self, fqn: str, index: int) -> int:
        """Global rank (first replica) holding flattened element ``index`` of ``fqn``."""
        unit, _ = self.find(fqn)
        if unit is None:
            return 0
        return unit.owner(self.canonical(fqn), index)


def _default_keys(layout: ModelLayout) -> list[str]:
    keys: list[str] = []
    for u in layout.units:
        keys.extend(layout.keys_of_unit(u))
    keys.extend(p.fqn for p in layout.plain_params)
    return keys


# ---------------------------------------------------------------------------------
# construction
# ---------------------------------------------------------------------------------
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
        expected = sorted(_default_keys(layout))
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


# ---------------------------------------------------------------------------------
# FSDP2
# ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fsdp2Param:
    """One parameter under ``fully_shard``: ``Shard(0)`` with ``torch.chunk`` rows over the
    ``shard_world_size`` ranks of its shard group (the world size unless HSDP).

    ``sharded=False``: an ignored parameter, a plain tensor held whole by every rank.
    """

    fqn: str
    shape: tuple[int, ...]
    world_size: int
    sharded: bool = True
    shard_world_size: int = 0  # 0: the world size

    def __post_init__(self) -> None:
        if self.shard_world_size == 0:
            object.__setattr__(self, "shard_world_size", self.world_size)
        if self.shard_world_size < 1 or self.world_size % self.shard_world_size:
            raise LayoutError(f"param {self.fqn!r}: shard group size {self.shard_world_size} does "
                              f"not divide the world size {self.world_size}")

    @property
    def rows_per_rank(self) -> int:
        if not self.sharded:
            return self.shape[0] if self.shape else 1
        return -(-self.shape[0] // self.shard_world_size)

    def shard_rank(self, rank: int) -> int:
        """Coordinate on the shard mesh dim (the last one): ``rank % shard_world_size``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} out of range for world size {self.world_size}")
        return rank % self.shard_world_size

    def rows(self, rank: int) -> tuple[int, int]:
        """Rows ``[start, end)`` of dim 0 held by ``rank`` (may be empty; all of them for an
        unsharded param)."""
        if not self.sharded:
            return (0, self.shape[0] if self.shape else 1)
        r = self.rows_per_rank
        start = min(self.shard_rank(rank) * r, self.shape[0])
        return (start, min(start + r, self.shape[0]))

    def local_shape(self, rank: int) -> tuple[int, ...]:
        if not self.sharded:
            return self.shape
        s, e = self.rows(rank)
        return (e - s, *self.shape[1:])

    def padded_local_shape(self) -> tuple[int, ...]:
        """FSDP2's ``padded_sharded_param_size`` (chunk 0's shape)."""
        if not self.sharded:
            return self.shape
        return (min(self.rows_per_rank, self.shape[0]), *self.shape[1:])


@dataclass(frozen=True)
class Fsdp2Layout:
    """Every parameter of a ``fully_shard`` model, in optimizer (``named_parameters()``) order."""

    params: tuple[Fsdp2Param, ...]
    world_size: int
    shard_world_size: int = 0  # 0: the world size (1-D mesh)

    def __post_init__(self) -> None:
        if self.shard_world_size == 0:
            object.__setattr__(self, "shard_world_size", self.world_size)

    def optimizer_keys(self) -> list[str]:
        return [p.fqn for p in self.params]

    def param(self, fqn: str) -> Fsdp2Param:
        for p in self.params:
            if p.fqn == fqn:
                return p
        raise KeyError(fqn)

    def has(self, fqn: str) -> bool:
        return any(p.fqn == fqn for p in self.params)

    @property
    def plain_params(self) -> tuple[Fsdp2Param, ...]:
        """Params outside FSDP2 (ignored): whole and unsynchronised on every rank."""
        return tuple(p for p in self.params if not p.sharded)

    def owner(self, fqn: str, index: int) -> int:
        """Global rank (first replica) holding flattened element ``index`` of ``fqn``."""
        p = self.param(fqn)
        if not p.sharded or p.shape[0] == 0:
            return 0
        row = index // max(1, math.prod(p.shape[1:]))
        return row // p.rows_per_rank

    def first_replica(self) -> range:
        """Global ranks of the first replica (``0 .. shard_world_size - 1``)."""
        return range(self.shard_world_size)


def fsdp2_layout(
    module: nn.Module | Iterable[tuple[str, Sequence[int]]],
    world_size: int,
    *,
    ignored: Sequence[str] = (),
    shard_world_size: int | None = None,
) -> Fsdp2Layout:
    """Per-parameter ``Shard(0)`` layout for ``fully_shard`` at ``world_size``.

    ``module`` is an unwrapped module (params in ``named_parameters()`` order, tied
    params once, at their first FQN) or an iterable of ``(fqn, shape)``. ``ignored``:
    FQNs of ignored submodules (module input) or of ignored params (iterable input);
    their params stay whole. ``shard_world_size``: the shard mesh dim of an HSDP mesh
    ``(world_size // shard_world_size, shard_world_size)``. 0-dim sharded params raise
    :class:`LayoutError` (FSDP2 rejects them).
    """
    sws = world_size if shard_world_size is None else shard_world_size
    if world_size < 1 or sws < 1 or world_size % sws:
        raise LayoutError(f"shard group size {sws} must divide the world size {world_size} (>= 1)")

    def is_ignored(fqn: str) -> bool:
        return any(fqn == i or fqn.startswith(i + ".") for i in ignored)

    if isinstance(module, nn.Module):
        mods = dict(module.named_modules())
        for i in ignored:
            if i not in mods:
                raise LayoutError(f"no submodule named {i!r} in {type(module).__name__}")
        items = [(n, tuple(p.shape)) for n, p in module.named_parameters()]
    else:
        items = [(n, tuple(int(d) for d in s)) for n, s in module]
    out = []
    for fqn, shape in items:
        plain = is_ignored(fqn)
        if len(shape) == 0 and not plain:
            raise LayoutError(f"param {fqn!r}: FSDP2 cannot Shard(0) a 0-dim parameter")
        out.append(Fsdp2Param(fqn, shape, world_size, not plain, sws))
    return Fsdp2Layout(tuple(out), world_size, sws)
