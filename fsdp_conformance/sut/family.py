"""How a model is wrapped, trained and observed under one FSDP API, on a rank: the family
record the one round trip (``sut/roundtrip.py``) runs over, for the run's paths and for a
user's own save/load (``user/rank_side.py``) alike.

Rules
- A family says only what differs between the FSDP APIs: how the zoo (or a user's) model
  is wrapped on each side, the names the optimizer's param groups are sorted by, the
  layout P0 reads, the mesh, how the full params are gathered and copied back in, the
  neutral form of a sharded saved dict, and whether a load that raised on some ranks waits
  for the others (``strand_guard``). Everything else (training, freezing at the save,
  compiling a side, the scheduler, what is recorded) is the round trip's, written once.
- ``rank_family(case)``: the family of ``case.family`` (``api_paths.family_of``). This
  module imports torch only inside the functions it names.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True, kw_only=True)
class RankFamily:
    """One FSDP API as a round trip's ranks build and observe it (module rules)."""

    name: str
    """``"fsdp1"`` or ``"fsdp2"`` (``api_paths.FAMILIES``)."""
    wrap: Callable[..., Any]
    """``wrap(ctx, case, plan, load_side) -> model``: the case's model wrapped at this
    side's plan (and, under FSDP2, this side's tensor-parallel degree)."""
    grouping: Callable[[str, Any], str]
    """``grouping(name, param) -> name`` the zoo sorts params into groups by (FSDP1: a flat
    parameter's original FQNs joined by "|")."""
    meta: Callable[[Any], list]
    """``meta(model) -> list[dict]``: the layout P0 compares."""
    mesh_shape: Callable[..., Any]
    """``mesh_shape(ctx, case, load_side) -> tuple | None``: the device mesh (None: FSDP1)."""
    full_params: Callable[[Any], dict]
    """``full_params(model) -> {fqn: tensor}``: every param unsharded, on CPU (a collective)."""
    load_params: Callable[..., None]
    """``load_params(ctx, model, params)``: copy the full ``params`` (every rank holds them)
    into the wrapped model; not under test."""
    neutral_sharded: Callable[[dict], dict]
    """A sharded saved dict in the reference's neutral form (FSDP1: flat ShardedTensor
    pieces; FSDP2: DTensor pieces with torch's global offsets)."""
    own_mixed_precision: Callable[[Any], str]
    """The dtype a ``MixedPrecisionPolicy`` of the model's own sharding computes in ("" none)."""
    strand_guard: bool
    """A load that raised on this rank waits for the others to return from it and raises
    ``StrandedRanksError`` when they stay in a collective (FSDP2's broadcast from rank 0);
    False: the error is recorded at once and the pool's error grace decides."""


def _fsdp1() -> RankFamily:
    from . import fsdp1

    def wrap(ctx, case, plan, load_side):
        return fsdp1.wrap_fsdp1(ctx, case, plan=plan)

    return RankFamily(name="fsdp1", wrap=wrap, grouping=fsdp1.grouping_name,
                      meta=fsdp1.flat_metadata, mesh_shape=lambda ctx, case, load_side: None,
                      full_params=fsdp1.full_params, load_params=fsdp1.load_params,
                      neutral_sharded=fsdp1.flat_sharded_to_neutral,
                      own_mixed_precision=lambda model: "", strand_guard=False)


def _fsdp2() -> RankFamily:
    from . import fsdp2

    def wrap(ctx, case, plan, load_side):
        return fsdp2.wrap_fsdp2(ctx, case, plan=plan,
                                tensor_parallel=case.tensor_parallel_of(load_side))

    def mesh(ctx, case, load_side):
        return fsdp2.mesh_shape(ctx, case, case.tensor_parallel_of(load_side))

    return RankFamily(name="fsdp2", wrap=wrap, grouping=lambda name, param: name,
                      meta=fsdp2.param_layout, mesh_shape=mesh,
                      full_params=fsdp2.full_params, load_params=fsdp2.load_params,
                      neutral_sharded=fsdp2.sharded_to_neutral,
                      own_mixed_precision=fsdp2.own_mixed_precision, strand_guard=True)


_FAMILIES: dict[str, RankFamily] = {}
_MAKERS = {"fsdp1": _fsdp1, "fsdp2": _fsdp2}


def rank_family(case) -> RankFamily:
    """The family ``case`` runs under (``Case.family``), built once per process."""
    name = case.family
    if name not in _FAMILIES:
        _FAMILIES[name] = _MAKERS[name]()
    return _FAMILIES[name]
