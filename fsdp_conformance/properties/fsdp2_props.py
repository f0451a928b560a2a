"""FSDP2 (``fully_shard`` + ``torch.distributed.checkpoint.state_dict``) against the reference:
what P0 (layout), P1 (gather), P3 (shard, every ``set_optimizer_state_dict`` path), P11
(param groups after loading) and P4 (flatten: the sharded DTensor dict; DTensor input to
the reference's ``flatten_sharded``, FSDP1 with ``device_mesh=``) judge of the differential
observations, in the forms they take.

The functions take the per-rank observations of ``sut.fsdp2.observe`` / ``load_full`` (and,
where they read the layout, the reference ``Fsdp2Layout``); none touches a process group.

Rules
- Params outside FSDP2 (ignored params) are plain tensors that FSDP2 does not synchronise:
  rank r's full dict carries rank r's own state for them (P1), a full-dict load gives every
  rank the full dict's (rank 0's) values, and "== the rank's own local state" leaves them out
  on ranks other than 0 (P3).
- The flattened form (``flatten_optimizer_state_dict=True``) is compared key by key with
  ``saved.flatten_keys`` of the reference's full dict.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .statediff import diff_state_dicts, format_diff
from .flatten import ShardedRank
from .groups import LoadedGroups
from .loaded import LoadedState
from .saved import SavedDict
from .reference_props import path_value
from .verdict import error, fail, na

FULL_LOAD_PATHS = ("set_full", "set_full_broadcast", "set_full_nonstrict",
                   "set_full_broadcast_nonstrict")


def owner_of(layout):
    return lambda fqn, index: layout.owner(fqn, index) if layout.has(fqn) else 0


def drop_plain(d: dict, layout) -> dict:
    plain = {p.fqn for p in layout.plain_params}
    return {**d, "state": {k: v for k, v in d.get("state", {}).items() if k not in plain}}


def fsdp2_layout_problems(layout, obs: dict) -> list[str]:
    """How one rank's FSDP2 per-parameter layout differs from the reference's (P0,
    properties/sharding.py): which params are DTensors (all but ignored ones), their global
    and local shapes, placements (``Fsdp2Param.placements``) and the global offset of the
    rank's piece."""
    r = obs["rank"]
    mesh_ndim = len(obs.get("mesh_shape") or (layout.world_size,))
    if [m["fqn"] for m in obs["meta"]] != layout.optimizer_keys():
        return [f"rank {r}: params {[m['fqn'] for m in obs['meta']]} != reference "
                f"{layout.optimizer_keys()}"]
    problems = []
    for m in obs["meta"]:
        p = layout.param(m["fqn"])
        got = {"sharded": m["dtensor"], "shape": tuple(m["shape"])}
        want = {"sharded": p.sharded, "shape": p.shape}
        if m["dtensor"]:
            got.update(local_shape=tuple(m["local_shape"]), offset=tuple(m["offset"]),
                       placements=[tuple(x) for x in m["placements"]])
            want.update(local_shape=p.local_shape(r), offset=p.offset(r),
                        placements=p.placements(mesh_ndim))
        for k, w in want.items():
            if got[k] != w:
                problems.append(f"rank {r}, {m['fqn']}: {k} = {got[k]}, reference says {w}")
    return problems


def saved_dicts(observations: Sequence[dict], path: str = "full") -> list:
    """What P1 (properties/saved.py, with ``families.FSDP2``; the local dicts:
    ``[o["local"] for o in observations]``) judges of the differential observations: the
    full dict ``path`` returned on every rank (``full_rank0``: rank 0 only, every other rank
    gets ``{}``; ``flattened``: the flattened form), whose ignored params carry the rank's
    own state."""
    out = []
    for obs in observations:
        got, v = path_value(obs, path)
        out.append(SavedDict(rank=obs["rank"], label=path, got=got, problem=v, own=obs["local"],
                             rank0_only=path == "full_rank0", flattened=path == "flattened"))
    return out


def loaded_states(full: dict, observations: Sequence[dict],
                  paths: Sequence[str] = FULL_LOAD_PATHS,
                  own_locals: bool = True) -> list[LoadedState]:
    """What P3 (properties/loaded.py, with ``families.FSDP2``) judges of the differential
    observations: every full-dict load path on every rank, having loaded ``full``, and with
    ``own_locals`` the reference's shard of ``full`` against each rank's own
    ``optim.state_dict()`` (no load went through torch). A path that raised is an error; a
    path skipped on purpose is not checked."""
    out = []
    for obs in observations:
        r = obs["rank"]
        for path in paths:
            got, v = path_value(obs, path)
            out.append(LoadedState(rank=r, label=path, got=got, problem=v, source=full))
        if own_locals and "local" in obs:
            out.append(LoadedState(rank=r, source=full, own=obs["local"]))
    return out


def groups_after(observations: Sequence[dict], path: str) -> list[LoadedGroups]:
    """What P11 (properties/groups.py) judges of the differential observations: every
    rank's ``param_groups`` after loading through ``path`` (named by FQN); a load that raised
    is P3's to report (n/a here)."""
    out = []
    for obs in observations:
        got, v = path_value(obs, path)
        if v is None:
            out.append(LoadedGroups(rank=obs["rank"], label=path, by_fqn=True,
                                    got=got.get("param_groups", [])))
        else:
            out.append(LoadedGroups(rank=obs["rank"], label=path, problem=na(
                f"{path} did not load (P3:{path} reports why)") if v.status == "error" else v))
    return out


def reloaded_states(observations: Sequence[dict],
                    path: str = "set_sharded") -> list[LoadedState]:
    """What P3 judges of a dict loaded back at the same world size and plan (the sharded
    DTensor dict, ``path``): every rank's state after it against the rank's own state
    before saving."""
    out = []
    for obs in observations:
        got, v = path_value(obs, path)
        out.append(LoadedState(rank=obs["rank"], label=path, got=got, problem=v,
                               own=obs.get("local")))
    return out


def _pieces_problems(fqn: str, name: str, val: dict) -> list[str]:
    """The reference's reading of a live DTensor (``val["pieces"]``, from
    ``reference.to_pieces`` on the rank) against torch's own: the local tensor at torch's
    global offset (``compute_local_shape_and_global_offset``): same elements covered,
    same values."""
    pcs = val.get("pieces")
    if isinstance(pcs, dict) and "error" in pcs:
        return [f"reference.to_pieces raised on the live DTensor {fqn}.{name}:\n{pcs['error']}"]
    shape, off, local = tuple(val["global_shape"]), tuple(val["torch_offset"]), val["local"]
    full = torch.zeros(shape, dtype=local.dtype)
    seen = torch.zeros(shape, dtype=torch.bool)
    box = tuple(slice(o, o + n) for o, n in zip(off, local.shape))
    full[box] = local
    seen[box] = True
    got = torch.zeros(shape, dtype=local.dtype).reshape(-1)
    got_seen = torch.zeros(shape, dtype=torch.bool).reshape(-1)
    for s_, o, t in pcs:
        if tuple(s_) != shape:
            return [f"reference.to_pieces({fqn}.{name}): global shape {tuple(s_)}, torch says {shape}"]
        got[o:o + t.numel()] = t
        got_seen[o:o + t.numel()] = True
    if not torch.equal(got_seen, seen.reshape(-1)):
        return [f"reference.to_pieces({fqn}.{name}) covers other elements than torch's offset "
                f"{off} and local shape {tuple(local.shape)} say"]
    d = diff_state_dicts(full.reshape(-1), got)
    return [f"reference.to_pieces({fqn}.{name}) differs from the local tensor:\n"
            + format_diff(d)] if d else []


def _dtensor_problems(layout, r: int, fqn: str, n: str, val: dict,
                      shape_mesh: tuple) -> list[str]:
    """How one recorded DTensor of an FSDP2 sharded dict disagrees with the reference layout
    (global shape, placements, mesh shape, torch's global offset, local shape) and how the
    reference's reading of it (``_pieces_problems``) disagrees with torch's."""
    if not layout.has(fqn) or not layout.param(fqn).sharded:
        return [f"{fqn}.{n} is a DTensor but the reference says the param is not sharded"]
    p = layout.param(fqn)
    checks = {
        "global shape": (p.shape, tuple(val["global_shape"])),
        "placements": (p.placements(len(p.mesh_shape(shape_mesh))),
                       [tuple(x) for x in val["placements"]]),
        "mesh shape": (p.mesh_shape(shape_mesh), tuple(val["mesh_shape"])),
        "torch's global offset": (p.offset(r), tuple(val["torch_offset"])),
        "local shape": (p.local_shape(r), tuple(val["local"].shape)),
    }
    return [f"{fqn}.{n}: {what} {g}, reference says {w}" for what, (w, g) in checks.items()
            if w != g] + _pieces_problems(fqn, n, val)


def sharded_ranks(layout, observations: Sequence[dict], path: str = "sharded") -> list[ShardedRank]:
    """What P4 (properties/flatten.py, with ``families.FSDP2``) judges of the sharded dict
    (``full_state_dict=False``) ``path`` returned: every sharded param's per-element state is
    a ``Shard(0)`` DTensor (HSDP: ``(Replicate(), Shard(0))``) of the param's global shape,
    placed where the reference says (``_dtensor_problems``); the reference's reading of
    each (its pieces; a rank holding no rows: its empty local tensor) is the rank's sharded
    dict, flattened against the rank's local state."""
    out = []
    for obs in observations:
        r = obs["rank"]
        got, v = path_value(obs, path)
        if v is not None:
            out.append(ShardedRank(rank=r, problem=v))
            continue
        shape_mesh = tuple(obs.get("mesh_shape") or (layout.world_size,))
        problems: list[str] = []
        state = {}
        for fqn, st in got["state"].items():
            conv = {}
            for n, val in st.items():
                if isinstance(val, dict) and val.get("dtensor"):
                    problems += _dtensor_problems(layout, r, fqn, n, val, shape_mesh)
                    pcs = val.get("pieces")
                    if isinstance(pcs, list) and pcs:
                        conv[n] = [tuple(x) for x in pcs]
                    elif isinstance(pcs, list):  # no rows here: an empty piece of its shape
                        conv[n] = [(tuple(val["global_shape"]), 0, val["local"].reshape(-1))]
                    else:  # to_pieces raised on the rank (a read problem says so)
                        conv[n] = val["local"]
                else:
                    conv[n] = val
            state[fqn] = conv
        out.append(ShardedRank(rank=r, sharded={"state": state,
                                                "param_groups": got["param_groups"]},
                               flat=obs["local"], read_problems=tuple(problems)))
    return out


def to_named_pieces(sharded_records: Sequence[dict]) -> list[dict]:
    """Per-rank sharded records (``sut`` form: DTensor values recorded with the reference's
    ``pieces``) -> the reference's neutral pieces form, ready for ``flatten_sharded``."""
    out = []
    for rec in sharded_records:
        state = {}
        for fqn, st in rec["state"].items():
            conv = {}
            for n, val in st.items():
                if isinstance(val, dict) and val.get("dtensor"):
                    pcs = val["pieces"]
                    if isinstance(pcs, dict) and "error" in pcs:
                        raise ValueError(f"reference.to_pieces raised on the rank for {fqn}.{n}:\n"
                                         f"{pcs['error']}")
                    if pcs:
                        conv[n] = [tuple(x) for x in pcs]
                elif isinstance(val, torch.Tensor) or not isinstance(val, dict):
                    conv[n] = val
            state[fqn] = conv
        out.append({"state": state, "param_groups": rec["param_groups"]})
    return out


def dtensor_ranks(observations: Sequence[dict]) -> list[ShardedRank]:
    """What P4 (properties/flatten.py, with ``families.FSDP1``) judges of DTensor input to
    the reference flatten (FSDP1 with ``device_mesh=``, SHARDED): every rank's DTensor dict,
    read by ``reference.to_pieces`` on the rank (``to_named_pieces``), against the rank's
    own flat local state and ``FSD.optim_state_dict_to_load`` of that dict (``to_load``);
    the reference's reading of each DTensor must agree with torch's offsets. A dict that
    holds no DTensor where the optimizer has state fails: the DTensor path was not
    exercised."""
    recs, reads = [], []
    for obs in observations:
        rec, v = path_value(obs, "sharded")
        if v is not None:
            return [ShardedRank(rank=obs["rank"], problem=v)]
        recs.append(rec)
        reads.append(tuple(
            x for fqn, st in rec["state"].items() for n, val in st.items()
            if isinstance(val, dict) and val.get("dtensor")
            for x in _pieces_problems(fqn, n, val)))
    if not any(isinstance(val, dict) and val.get("dtensor")
               for rec in recs for st in rec["state"].values() for val in st.values()):
        if any(st for rec in recs for st in rec["state"].values()):
            return [ShardedRank(rank=0, problem=fail(
                "the SHARDED optimizer dict holds no DTensor (types "
                f"{observations[0].get('value_types')}): the DTensor path was not exercised"))]
    try:
        neutral = to_named_pieces(recs)
    except ValueError as exc:
        return [ShardedRank(rank=0, problem=error(str(exc)))]
    out = []
    for obs, rec, read in zip(observations, neutral, reads):
        got, tv = path_value(obs, "to_load")
        out.append(ShardedRank(rank=obs["rank"], sharded=rec, flat=obs["local"], torch_flat=got,
                               torch_problem=tv, torch_label="optim_state_dict_to_load",
                               read_problems=read))
    return out
