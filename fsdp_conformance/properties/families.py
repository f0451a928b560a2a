"""The reference of each FSDP family, as the properties judge with it: the one place where
FSDP1 (flat params, ``reference.gather_full`` / ``shard_full``) and FSDP2 (per-parameter
DTensors, ``reference.fsdp2_gather`` / ``fsdp2_shard``) differ for a property that is written
once (P0: properties/sharding.py; P1: properties/saved.py; P3: properties/loaded.py; P4:
properties/flatten.py).

Rules
- ``loaded_shard(layout, full, rank, exp)`` is what a load of the full dict ``full`` leaves on
  ``rank`` as this torch is expected to leave it (properties/expectation.py, judged as on
  ``rank``). FSDP1: the reference's shard of the full dict the load cuts from
  (``Expectation.shards_from``), passed through the modelled load. FSDP2: the reference's
  shard of the modelled load's full dict (a load effect acts on the full dict).
- ``vs_reference`` / ``vs_own`` are the parts of a rank's dict compared with the reference's
  shard / with the rank's own state before saving. Params of ignored modules are plain
  tensors FSDP does not synchronise: an FSDP1 load keeps each rank's own values for them (left
  out on ranks other than 0 in both comparisons); an FSDP2 full load gives every rank the
  saved (rank 0's) values (compared with the reference's shard, left out of the own state on
  ranks other than 0). FSDP2's P3 compares optimizer *state*; its ``param_groups`` after the
  load are P11's. FSDP1's own state is compared on the elements that lie in a param only
  (``reference_props.real_elements``): no save keeps a flat shard's padding, and an
  optimizer can hold nonzero state there (Rprop's step_size, Adamax's exp_inf).
- ``flatten(layout, dicts, rank)`` is the reference's flat state of ``rank`` from the ranks'
  sharded dicts. FSDP1: ``reference.flatten_sharded`` of the dicts of the rank's shard group
  (``layout.shard_groups()``: one rank's flat shard needs rows other ranks hold). FSDP2:
  ``reference.fsdp2_flatten`` of the rank's own dict (per-parameter shards). ``flat_view``:
  FSDP1 leaves the ignored params out on every rank (their merged pieces mean nothing: each
  rank holds its own values); FSDP2 keeps them (one rank's own dict is flattened alone).
"""
from __future__ import annotations

from .. import reference as ref
from .expectation import Expectation
from . import fsdp2_props
from . import reference_props
from .family import FamilyReference


def _fsdp1_loaded_shard(layout, full: dict, rank: int, exp: Expectation) -> dict:
    exp = exp.on_rank(rank)
    return exp.loaded(ref.shard_full(layout, exp.shards_from(full), rank))


def _fsdp1_replica(layout, rank: int) -> tuple[int, ...]:
    return tuple(next(g for g in layout.replicas() if rank in g))


def _fsdp1_gather_replica(layout, local_dicts: list, rank: int) -> dict:
    first = _fsdp1_replica(layout, rank)[0]
    return ref.gather_full(layout, reference_props.replica_first(layout, local_dicts, first))


def _fsdp1_replica_note(layout, rank: int) -> str:
    return reference_props.rotated_note(_fsdp1_replica(layout, rank))


def _fsdp1_view(d: dict, layout, rank: int) -> dict:
    return d if rank == 0 else reference_props.drop_plain(d, layout)


def _fsdp2_loaded_shard(layout, full: dict, rank: int, exp: Expectation) -> dict:
    # a load effect acts on the full dict (known/model.py)
    return ref.fsdp2_shard(layout, exp.on_rank(rank).loaded(full), rank)


def _fsdp1_flatten(layout, dicts: list, rank: int) -> dict:
    return ref.flatten_sharded(layout, reference_props.own_shard_group(layout, dicts, rank), rank)


def _state(d: dict, layout=None, rank: int = 0) -> dict:
    return {"state": d.get("state", {})}


def _fsdp1_own(d: dict, layout, rank: int) -> dict:
    return reference_props.real_elements(_fsdp1_view(d, layout, rank), layout, rank)


def _fsdp2_own(d: dict, layout, rank: int) -> dict:
    return _state(d) if rank == 0 else fsdp2_props.drop_plain(_state(d), layout)


FSDP1 = FamilyReference(
    family="fsdp1", gather_name="reference.gather_full", shard_name="reference.shard_full",
    gather=ref.gather_full, gather_replica=_fsdp1_gather_replica,
    replica_note=_fsdp1_replica_note, shard=ref.shard_full, loaded_shard=_fsdp1_loaded_shard,
    vs_reference=_fsdp1_view, vs_own=_fsdp1_own, owner=reference_props.owner_of,
    layout_problems=reference_props.fsdp1_layout_problems,
    layout_size=lambda layout: f"{len(layout.units)} unit(s)",
    flatten_name="reference.flatten_sharded", flatten=_fsdp1_flatten,
    flat_view=lambda d, layout, rank: reference_props.drop_plain(d, layout))
FSDP2 = FamilyReference(
    family="fsdp2", gather_name="reference.fsdp2_gather", shard_name="reference.fsdp2_shard",
    gather=ref.fsdp2_gather, gather_replica=lambda layout, dicts, rank: ref.fsdp2_gather(
        layout, dicts), replica_note=lambda layout, rank: "",
    shard=ref.fsdp2_shard, loaded_shard=_fsdp2_loaded_shard,
    vs_reference=_state, vs_own=_fsdp2_own, owner=fsdp2_props.owner_of,
    layout_problems=fsdp2_props.fsdp2_layout_problems,
    layout_size=lambda layout: f"{len(layout.params)} params",
    flatten_name="reference.fsdp2_flatten",
    flatten=lambda layout, dicts, rank: ref.fsdp2_flatten(layout, dicts[rank], rank),
    flat_view=lambda d, layout, rank: d)
