"""FSDP2 (``fully_shard`` + ``torch.distributed.checkpoint.state_dict``) against the reference:
what P0 (layout), P1 (gather), P3 (shard, every ``set_optimizer_state_dict`` path) and P11
(param groups after loading) judge of the differential observations, in the forms they take;
P4 of the sharded (DTensor) dict; and P4 for DTensor input to the reference's
``flatten_sharded`` (FSDP1 with ``device_mesh=``).

Each function takes the reference ``Fsdp2Layout`` and the per-rank observations of
``sut.fsdp2.observe`` / ``load_full`` and returns a ``Verdict``; none touches a process group.

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

from .. import reference as ref
from .statediff import diff_state_dicts, format_diff
from .groups import LoadedGroups
from .loaded import LoadedState
from .saved import SavedDict
from .reference_props import path_value
from .verdict import Verdict, error, fail, na, passed

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


def p4_sharded(layout, observations: Sequence[dict], path: str = "sharded") -> Verdict:
    """The sharded dict (``full_state_dict=False``) holds, for every sharded param's
    per-element state, a ``Shard(0)`` DTensor (HSDP: ``(Replicate(), Shard(0))``) of the
    param's global shape whose local tensor is bitwise the rank's local state, at the
    reference's rows (torch's own global offset, and the reference's reading of the live
    DTensor, ``reference.to_pieces``, both say where); everything else equals the local
    state as is."""
    problems = []
    for obs in observations:
        r = obs["rank"]
        got, v = path_value(obs, path)
        if v is not None:
            return v
        local = obs["local"]
        shape_mesh = tuple(obs.get("mesh_shape") or (layout.world_size,))
        plain_view = {"state": {}, "param_groups": got["param_groups"]}
        for fqn, st in got["state"].items():
            conv = {}
            for n, val in st.items():
                if isinstance(val, dict) and val.get("dtensor"):
                    if not layout.has(fqn) or not layout.param(fqn).sharded:
                        problems.append(f"rank {r}: {fqn}.{n} is a DTensor but the reference "
                                        "says the param is not sharded")
                        continue
                    p = layout.param(fqn)
                    want_off = p.offset(r)
                    checks = {
                        "global shape": (p.shape, tuple(val["global_shape"])),
                        "placements": (p.placements(len(p.mesh_shape(shape_mesh))),
                                       [tuple(x) for x in val["placements"]]),
                        "mesh shape": (p.mesh_shape(shape_mesh), tuple(val["mesh_shape"])),
                        "torch's global offset": (want_off, tuple(val["torch_offset"])),
                        "local shape": (p.local_shape(r), tuple(val["local"].shape)),
                    }
                    for what, (w, g) in checks.items():
                        if w != g:
                            problems.append(f"rank {r}: {fqn}.{n}: {what} {g}, reference says {w}")
                    problems += [f"rank {r}: {x}" for x in _pieces_problems(fqn, n, val)]
                    conv[n] = val["local"]
                else:
                    conv[n] = val
            plain_view["state"][fqn] = conv
        diffs = diff_state_dicts(local, plain_view, owner=owner_of(layout))
        if diffs:
            problems.append(f"{path} on rank {r}: local pieces differ from the rank's local "
                            "state:\n" + format_diff(diffs))
    return fail("\n".join(problems)) if problems else passed(f"{path}: bitwise on every rank")


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


def p4_flatten_dtensor(layout, observations: Sequence[dict]) -> Verdict:
    """DTensor input to the reference flatten (FSDP1 with ``device_mesh=``, SHARDED): every
    rank's DTensor dict, read by ``reference.to_pieces`` on the rank, assembled by
    ``reference.flatten_sharded`` == ``FSDP.optim_state_dict_to_load`` of that dict == the
    rank's own flat local state, bitwise; and the reference's reading of each DTensor agrees
    with torch's offsets. Params of ignored modules (unsynchronised per-rank values) are
    left out."""
    recs, problems = [], []
    for obs in observations:
        rec, v = path_value(obs, "sharded")
        if v is not None:
            return v
        recs.append(rec)
        for fqn, st in rec["state"].items():
            for n, val in st.items():
                if isinstance(val, dict) and val.get("dtensor"):
                    problems += [f"rank {obs['rank']}: {x}" for x in _pieces_problems(fqn, n, val)]
    if not any(isinstance(val, dict) and val.get("dtensor")
               for rec in recs for st in rec["state"].values() for val in st.values()):
        if any(st for rec in recs for st in rec["state"].values()):
            return fail("the SHARDED optimizer dict holds no DTensor (types "
                        f"{observations[0].get('value_types')}): the DTensor path was not exercised")
    try:
        neutral = to_named_pieces(recs)
    except ValueError as exc:
        return error(str(exc))
    for obs in observations:
        r = obs["rank"]
        try:
            want = drop_plain(ref.flatten_sharded(layout, neutral, r), layout)
        except ref.StateDictMismatch as exc:
            return error(f"reference.flatten_sharded rejected the DTensor dicts for rank {r}: {exc}")
        diffs = diff_state_dicts(want, drop_plain(obs["local"], layout), owner=owner_of(layout))
        if diffs:
            problems.append(f"reference.flatten_sharded on rank {r} differs from the rank's local "
                            "state:\n" + format_diff(diffs))
        got, v = path_value(obs, "to_load")
        if v is not None:
            if v.status == "error":
                return v
            continue
        diffs = diff_state_dicts(want, drop_plain(got, layout), owner=owner_of(layout))
        if diffs:
            problems.append(f"optim_state_dict_to_load on rank {r} differs from "
                            "reference.flatten_sharded:\n" + format_diff(diffs))
    return fail("\n\n".join(problems)) if problems else passed("bitwise on every rank")
