"""FSDP2's (``fully_shard``) per-parameter layout: the dim-0 rows of each parameter a rank
holds (:func:`fsdp2_layout`, :class:`Fsdp2Layout`, :class:`Fsdp2Param`); reference/fsdp2.py
shards and gathers state by it.

Rules (torch 2.13; see notes/reference-spec.md for file:line citations)
-----------------------------------------------------------------------

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
from dataclasses import dataclass
from typing import Iterable, Sequence

from torch import nn

from .errors import LayoutError


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
