"""FSDP1's flat-parameter layout as data: units, their parameter slots, each rank's shard,
the pieces of parameters in it and the rank owning an element.

A layout is built by reference/layout_build.py (which parameters a unit owns, their order,
names, offsets and padding, the optimizer key order); FSDP2's per-parameter layout is
reference/fsdp2_layout.py.

Rules (FSDP1, torch 2.13; see notes/reference-spec.md for file:line citations)
--------------------------------------------------------------------------------

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
    The order the builder recorded (reference/layout_build.py, "Optimizer keys"). A
    layout given no order lists each unit's keys (its ``"<unit>._flat_param"`` for
    ``use_orig_params=False``, its params' FQNs for ``True``) in unit order, then the
    plain params (:func:`default_keys`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch


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
        """FSDP's ``FlatParameter._fqns`` prefixed with the unit's FQN (reference/layout_build.py,
        "Name of a tied parameter": differs from :attr:`fqns` only for a tied param under
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
            object.__setattr__(self, "key_order", tuple(default_keys(self)))

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

    def replicas(self) -> tuple[tuple[int, ...], ...]:
        """The groups of global ranks that each train one copy of the state, in rank order:
        HYBRID_SHARD, the consecutive blocks of ``shard_world_size`` ranks; NO_SHARD, every
        rank on its own (each holds all of the state, and its full dict is its own); any
        other strategy, every rank in one group. ``gather_full`` of a replica's dicts put
        first is that replica's full dict."""
        if self.strategy == "NO_SHARD":
            return tuple((r,) for r in range(self.world_size))
        return self.shard_groups() if self.strategy == "HYBRID_SHARD" else \
            (tuple(range(self.world_size)),)

    def shard_groups(self) -> tuple[tuple[int, ...], ...]:
        """The groups of global ranks whose sharded state dicts hold the state between them
        (each rank's cut from its own state), in rank order: HYBRID_SHARD, the consecutive
        blocks of ``shard_world_size`` ranks (FSDP's process group); NO_SHARD with
        ``use_orig_params=True``, every rank on its own (its sharded dict is its whole state,
        unsharded: fsdp/_optim_utils.py ``_gather_all_orig_param_state``); any other
        strategy, every rank in one group (NO_SHARD's flat sharded dict is chunked over all
        ranks)."""
        if self.strategy == "NO_SHARD" and self.use_orig_params:
            return self.replicas()
        if self.strategy != "HYBRID_SHARD":
            return (tuple(range(self.world_size)),)
        return rank_blocks(self.world_size, self.shard_world_size)

    def owner(self, fqn: str, index: int) -> int:
        """Global rank (first replica) holding flattened element ``index`` of ``fqn``."""
        unit, _ = self.find(fqn)
        if unit is None:
            return 0
        return unit.owner(self.canonical(fqn), index)


def rank_blocks(world_size: int, size: int) -> tuple[tuple[int, ...], ...]:
    """Global ranks ``0 .. world_size - 1`` in consecutive blocks of ``size`` (the shard
    groups of an HSDP layout: global rank g is in block ``g // size``)."""
    return tuple(tuple(range(b, b + size)) for b in range(0, world_size, size))


def default_keys(layout: ModelLayout) -> list[str]:
    """The optimizer keys of a layout given no order (module docstring)."""
    keys: list[str] = []
    for u in layout.units:
        keys.extend(layout.keys_of_unit(u))
    keys.extend(p.fqn for p in layout.plain_params)
    return keys
