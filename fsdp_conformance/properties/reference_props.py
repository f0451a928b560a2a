"""FSDP1 (flat parameters) against the reference, from the differential observations
(``sut.fsdp1.observe`` / ``load_full``): the family's layout comparison P0 makes
(``fsdp1_layout_problems``), and what P1, P3 and P4 judge in the forms they take
(``saved_dicts``, ``loaded_states``, ``flat_ranks``). They never touch a process group: all
inputs were recorded on the ranks.
"""
from __future__ import annotations

from typing import Sequence

from .expectation import EXACT, Expectation
from .flatten import ShardedRank
from .loaded import LoadedState
from .saved import SavedDict
from .verdict import error, na


def drop_plain(d: dict, layout) -> dict:
    """``d`` without the state of params outside every unit (ignored modules): FSDP does not
    synchronise them, so a rank other than 0 legitimately holds its own values there."""
    plain = {slot.fqn for slot in layout.plain_params}
    return {**d, "state": {k: v for k, v in d["state"].items() if k not in plain}}


def real_elements(d: dict, layout, rank: int) -> dict:
    """``d`` (a rank's flat local state) with every element of a unit's flat state tensor
    that lies in no param (the shard's right padding, alignment padding) set to zero: no
    save keeps those elements and every load leaves them zero, while an optimizer whose
    state starts nonzero there (Rprop's step_size = lr) or grows from a zero gradient
    (Adamax's exp_inf = eps) holds other values before the save. Other keys as they are."""
    import torch

    state = {}
    for key, st in d.get("state", {}).items():
        unit = layout.unit_by_key(key)
        if unit is None:
            state[key] = st
            continue
        keep = torch.zeros(unit.shard_numel, dtype=torch.bool)
        for piece in unit.param_pieces(layout.shard_rank(rank)):
            n = piece.end_in_param - piece.start_in_param
            keep[piece.start_in_shard:piece.start_in_shard + n] = True
        if bool(keep.all()):  # no padding on this rank
            state[key] = st
            continue
        state[key] = {n: (v.where(keep, torch.zeros((), dtype=v.dtype))
                          if isinstance(v, torch.Tensor) and v.dim() == 1
                          and v.numel() == unit.shard_numel else v)
                      for n, v in st.items()}
    return {**d, "state": state}


def comparable(expected: dict, got: dict, layout, rank: int) -> tuple[dict, dict]:
    """The pair to compare on ``rank``: whole on rank 0, without ignored-module params on
    the others (see ``drop_plain``)."""
    if rank == 0:
        return expected, got
    return drop_plain(expected, layout), drop_plain(got, layout)


def owner_of(layout):
    return lambda fqn, index: layout.owner(fqn, index)


def path_value(obs: dict, path: str):
    v = obs.get(path)
    if v is None:
        return None, na(f"path {path} was not run")
    if isinstance(v, dict) and "error" in v:
        return None, error(f"torch raised in {path} on rank {obs['rank']}:\n{v['error']}")
    if isinstance(v, dict) and "n/a" in v:
        return None, na(v["n/a"])
    return v, None


def fsdp1_layout_problems(layout, obs: dict) -> list[str]:
    """How one rank's FSDP1 flat layout differs from the reference's (P0,
    properties/sharding.py): its units, and in each unit the FQNs, shapes, padding, local
    numel and which params its shard holds."""
    r = obs["rank"]
    problems = []
    ref_units = {u.name: u for u in layout.units}
    seen = {m["name"] for m in obs["meta"]}
    if seen != set(ref_units):
        problems.append(f"rank {r}: FSDP units {sorted(seen)} != reference units "
                        f"{sorted(ref_units)}")
    for m in obs["meta"]:
        u = ref_units.get(m["name"])
        if u is None:
            continue
        want = {
            "fqns": list(u.flat_fqns),
            "shapes": [tuple(p.shape) for p in u.params],
            "numels_with_padding": list(u.numels_with_padding()),
            "is_padding_mask": list(u.is_padding_mask()),
            "local_numel": u.shard_numel,
        }
        for k, v in want.items():
            got = m[k] if k != "shapes" else [tuple(s) for s in m[k]]
            if list(got) != list(v) if isinstance(v, list) else got != v:
                problems.append(f"rank {r}, unit {m['name']!r}: {k} = {got}, reference "
                                f"says {v}")
        if u.sharded:
            start, end = u.shard_range(layout.shard_rank(r))
            in_shard = [bool(i[0]) for i in m["shard_param_infos"]]
            want_in = list(u.fsdp_in_shard(layout.shard_rank(r)))
            if in_shard != want_in:
                problems.append(f"rank {r}, unit {m['name']!r}: params in shard "
                                f"{in_shard}, reference says {want_in} (range "
                                f"[{start}, {end}))")
    return problems


def replica_first(layout, dicts: Sequence, rank: int) -> list:
    """``dicts`` (one per rank) rotated so that ``rank``'s replica (``layout.replicas()``)
    comes first: the reference's gather reads the first replica's ranks, so it gathers that
    replica's state from them (replicas are consecutive blocks of ranks)."""
    first = next(g[0] for g in layout.replicas() if rank in g)
    return list(dicts[first:]) + list(dicts[:first])


def rotated_note(group: Sequence[int]) -> str:
    """What an error of the reference on ``replica_first``'s dicts must add: which replica
    was put first, and that the ranks it names count from there ("" for the first one)."""
    return (f" (the replica on ranks {list(group)}, put first: a rank it names is counted "
            f"from rank {group[0]})" if group[0] else "")


def own_shard_group(layout, dicts: Sequence, rank: int) -> list:
    """The dicts (one per rank) of ``rank``'s shard group (``layout.shard_groups()``): the
    sharded dicts its own state is flattened from."""
    return [dicts[q] for q in next(g for g in layout.shard_groups() if rank in g)]


def saved_dicts(observations: Sequence[dict], path: str = "full_legacy") -> list:
    """What P1 (properties/saved.py, with ``families.FSDP1``; the local dicts:
    ``[o["local"] for o in observations]``) judges of the differential observations: the
    full dict ``path`` returned on every rank (rank0_only=False), whose ignored params carry
    the rank's own state."""
    out = []
    for obs in observations:
        got, v = path_value(obs, path)
        out.append(SavedDict(rank=obs["rank"], label=path, got=got, problem=v, own=obs["local"]))
    return out


FROM_RANK0 = ("scatter_legacy",)
"""Load paths whose input is rank 0's full dict, whatever the other ranks hold
(``scatter_full_optim_state_dict``)."""


def loaded_states(full: dict | Sequence[dict], observations: Sequence[dict],
                  paths: Sequence[str] = ("shard_legacy", "scatter_legacy", "to_load"),
                  own_locals: bool = True, exp: Expectation = EXACT) -> list:
    """What P3 (properties/loaded.py, with ``families.FSDP1``) judges of the differential
    observations: every load path on every rank, having loaded ``full`` (the dict every rank
    loaded, or one per rank: each rank loads its own full dict, except through the paths
    that scatter rank 0's, ``FROM_RANK0``), and with ``own_locals`` the reference's shard of
    the rank's full dict against its own ``optim.state_dict()`` as this torch's load leaves
    it (properties/expectation.py; the identity unless modelled)."""
    out = []
    for obs in observations:
        r = obs["rank"]
        mine = full if isinstance(full, dict) else full[r]
        for path in paths:
            got, v = path_value(obs, path)
            src = full[0] if path in FROM_RANK0 and not isinstance(full, dict) else mine
            out.append(LoadedState(rank=r, label=path, got=got, problem=v, source=src))
        if own_locals and "local" in obs:
            out.append(LoadedState(rank=r, source=mine, own=exp.loaded(obs["local"])))
    return out


def sharded_to_flat_offsets(sharded_state: dict) -> dict:
    """torch's per-parameter sharded form (row-chunked ShardedTensor, recorded as
    (offsets, local tensor)) -> the reference's neutral (global shape, offset along the
    flattened param, 1-D local tensor) form."""
    out = {}
    for fqn, state in sharded_state.items():
        conv = {}
        for name, v in state.items():
            if isinstance(v, dict) and "shards" in v:
                shape = tuple(v["global_shape"])
                row = 1
                for d in shape[1:]:
                    row *= d
                pieces = [(shape, offsets[0] * row if shape else 0, t.reshape(-1))
                          for offsets, t in v["shards"]]
                if pieces:  # a trailing rank may hold no rows of this param
                    conv[name] = pieces
            else:
                conv[name] = v
        out[fqn] = conv
    return out


def flat_ranks(observations: Sequence[dict], exp: Expectation = EXACT) -> list[ShardedRank]:
    """What P4 (properties/flatten.py, with ``families.FSDP1``) judges of the differential
    observations: every rank's ShardedTensor dict (``sharded_legacy``) against the rank's
    local state (as a load leaves it: flattening is what a load does, see
    ``loaded_states``) and against torch's own flatten of it
    (``flatten_sharded_optim_state_dict``, ``flatten_legacy``). torch's sharded form chunks
    each param by rows, so one rank's flat shard needs pieces held by other ranks: torch
    all-gathers them, the reference assembles them from the shard group's dicts."""
    out = []
    for obs in observations:
        r = obs["rank"]
        sharded, v = path_value(obs, "sharded_legacy")
        if v is not None:
            out.append(ShardedRank(rank=r, problem=v))
            continue
        got, tv = path_value(obs, "flatten_legacy")
        out.append(sharded_rank(r, sharded, flat=exp.loaded(obs["local"]), torch_flat=got,
                                torch_problem=tv,
                                torch_label="flatten_sharded_optim_state_dict"))
    return out


def sharded_rank(rank: int, sharded: dict, **seen) -> ShardedRank:
    """What P4 judges of one rank's ShardedTensor-form sharded dict (``sharded``, as FSDP1's
    sharded paths return it), in the reference's pieces form
    (``sharded_to_flat_offsets``), with the rest the observer saw (``seen``: the rank's flat
    state, torch's own flatten); a dict in another form is the rank's error."""
    try:
        pieces = sharded_to_flat_offsets(sharded["state"])
    except ValueError as exc:
        return ShardedRank(rank=rank, problem=error(
            f"rank {rank}'s sharded dict has an unexpected form: {exc}"))
    return ShardedRank(rank=rank, sharded={"state": pieces,
                                           "param_groups": sharded["param_groups"]}, **seen)
