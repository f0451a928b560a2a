"""``inspect`` of a directory of per-rank files (``pattern``, default
``optim_rank{rank}.pt``, ranks ``0, 1, ...``): each rank's optimizer dict, merged.

Rules
-----
The world size is the number of files.
Layout implied (by each param's first per-element state): one file ->
  nothing is sharded; ShardedTensor -> chunks of dim 0, global shape and saving world size
  recorded in the file; DTensor -> its placements and mesh size; the same multi-dim shape
  on every rank -> replicated (and then so are 1-D tensors of equal sizes on every rank);
  otherwise equal 1-D sizes on every rank -> FSDP1 FlatParameter shards (the total ``W*S``
  is a multiple of ``W``: the flat param was padded to it); 1-D sizes that differ, or state
  on some ranks only -> ``use_orig_params=True`` slices (a rank that owns no element of a
  param has no state for it). One file (not a directory) with FlatParameter keys, or
  ShardedTensors or DTensors saved at a world size above 1, is one rank's part of a sharded
  checkpoint. 
Per-rank findings: param groups or steps that disagree across ranks; a ShardedTensor or
DTensor world size other than the number of files; rank files with a gap in their
numbering; state on some ranks only (a note).
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Sequence

from ..reshard.errors import UsageError
from ..reshard.inputs import rank_files
from .describe import (group_index, group_infos, guess_optimizer, in_group_order, key_type_of,
                       params_from_state, recorded_world_sizes, step_of, total_bytes)
from .findings import damage_findings, few, findings_for
from .load import load_file
from .locate import location_str, select_optimizer_dict
from .summary import SHARDED_KINDS, Finding, ParamInfo, StateInfo, Summary

def _merge_state(name: str, per_rank: Sequence[StateInfo | None]) -> StateInfo:
    """One state value over every rank's file (``None``: the rank has no such value)."""
    present = [s for s in per_rank if s is not None]
    first = present[0]
    rank_numel = tuple(None if s is None else s.numel for s in per_rank)
    nonfinite = sum(s.nonfinite or 0 for s in present)
    nbytes = sum(s.nbytes for s in present)
    if first.kind in SHARDED_KINDS:
        local = tuple(None if s is None else s.rank_numel[0] for s in per_rank)
        return StateInfo(name=name, kind=first.kind, dtype=first.dtype, shape=first.shape,
                         numel=first.numel, nbytes=nbytes,
                         nonfinite=nonfinite, rank_numel=local, chunks=first.chunks,
                         world_size=first.world_size, placements=first.placements)
    if first.kind == "tensor":
        shapes = {s.shape for s in present}
        whole = len(shapes) == 1 and len(present) == len(per_rank) and (
            len(first.shape) > 1 or len(per_rank) == 1)
        return StateInfo(name=name, kind="tensor", dtype=first.dtype,
                         shape=first.shape if whole else None,
                         numel=first.numel if whole else sum(s.numel for s in present),
                         nbytes=nbytes,
                         nonfinite=nonfinite, rank_numel=rank_numel)
    return StateInfo(name=name, kind=first.kind, dtype=first.dtype, shape=first.shape,
                     numel=first.numel, nbytes=nbytes,
                     value=first.value,
                     nonfinite=nonfinite if first.nonfinite is not None else None)


def _rank_layout(params: Sequence[ParamInfo], world: int) -> tuple[list[str], list[Finding]]:
    """The layout the per-rank sizes imply (see the module docstring)."""
    kinds: Counter = Counter()
    flat_total = 0
    placements: set[str] = set()
    firsts = [s for p in params if (s := next((s for s in p.state if s.per_element), None))]
    # whole multi-dim tensors on every rank: nothing is sharded, 1-D ones are whole too
    replicated = any(s.kind == "tensor" and s.shape is not None for s in firsts)
    for s in firsts:
        sizes = [n for n in (s.rank_numel or ()) if n is not None]
        equal = len(sizes) == world and len(set(sizes)) == 1
        if s.kind in SHARDED_KINDS:
            kinds[s.kind] += 1
            if s.placements:
                placements.add(s.placements)
        elif world == 1:
            kinds["whole"] += 1
        elif s.shape is not None or (replicated and equal):
            kinds["replicated"] += 1
        elif equal:
            kinds["flat"] += 1
            flat_total += sizes[0] * world
        else:
            kinds["orig"] += 1
    recorded = sorted(w for w in recorded_world_sizes(params) if w is not None)
    texts = {  # kind: what that many params are
        "whole": "in one rank file: world size 1, nothing sharded",
        "flat": f"as FSDP1 FlatParameter shards: the same number of elements on every rank "
                f"({flat_total} in all, a multiple of {world}: each flat param was padded to a "
                f"multiple of the world size)",
        "orig": "as per-rank slices of different sizes (use_orig_params=True: a rank that owns "
                "none of a param's elements has no state for it)",
        "replicated": "whole on every rank (replicated: NO_SHARD, DDP or not sharded)",
        "sharded tensor": f"as ShardedTensor (FSDP1 sharded_optim_state_dict): chunks of dim 0, "
                          f"saved at world size {few(recorded)}",
        "dtensor": f"as DTensor (FSDP2 sharded optimizer state), placements "
                   f"{few(sorted(placements))} on a mesh of {few(recorded)} ranks",
    }
    lines = [f"{kinds[k]} params {text}" for k, text in texts.items() if kinds[k]] or \
        ["no per-element state: nothing to infer a sharding from"]
    findings = []
    if recorded and recorded != [world]:
        findings.append(Finding(level="warning", code="world-size-mismatch",
                                message=f"the sharded tensors were saved at world size "
                                        f"{few(recorded)} "
                                        f"but there are {world} rank files"))
    return lines, findings


def _rank_gap(directory: Path, pattern: str, world: int) -> list[Finding]:
    rx = re.compile("^" + re.escape(pattern).replace(r"\{rank\}", r"(\d+)") + "$")
    extra = sorted(int(m.group(1)) for f in directory.iterdir() if (m := rx.match(f.name)))
    extra = [r for r in extra if r > world]
    if not extra:
        return []
    return [Finding(level="warning", code="rank-gap",
                    message=f"files for ranks {few(extra)} exist but "
                            f"{pattern.format(rank=world)!r} "
                            f"does not: only ranks 0..{world - 1} were read")]


def _rank_files_or_hint(path: Path, pattern: str) -> list[Path]:
    try:
        return rank_files(path, pattern)
    except UsageError as e:
        found = sorted(f.name for f in path.iterdir() if f.is_file())[:8]
        dcp = sorted(f.name for f in path.iterdir() if (f / ".metadata").is_file())[:4]
        hint = f"; DCP checkpoints below it: {dcp}" if dcp else ""
        raise UsageError(f"{str(e).split(': ', 1)[-1]}; files here: {found or 'none'} (a file: "
                         f"pass it; other per-rank names: --pattern){hint}", path=path) from e


def summarise_ranks(path: Path, key: str | None, pattern: str, unsafe: bool) -> Summary:
    files = _rank_files_or_hint(path, pattern)
    world = len(files)
    loaded = [load_file(f, r, unsafe) for r, f in enumerate(files)]
    osds = [select_optimizer_dict(lf.obj, key, files[r], r) for r, lf in enumerate(loaded)]
    groups = group_infos(osds[0][1]["param_groups"])
    findings = damage_findings(files, loaded)
    listed = group_index(groups)
    for r, (_, osd) in enumerate(osds[1:], start=1):
        other = group_infos(osd["param_groups"])
        if [(g.hyper, g.params) for g in other] != [(g.hyper, g.params) for g in groups]:
            findings.append(Finding(level="warning", code="rank-groups-disagree",
                                    message=f"rank {r}'s param groups differ from rank 0's "
                                            f"({files[r].name} vs {files[0].name})"))
        for k, gs in group_index(other).items():
            listed.setdefault(k, gs)
    per_rank = [{p.key: {s.name: s for s in p.state}
                 for p in params_from_state(osd["state"], {}) if p.state} for _, osd in osds]
    keys = dict.fromkeys(k for ps in per_rank for k in ps)
    params, disagree = [], []
    for k in keys:
        by_rank = [ps.get(k, {}) for ps in per_rank]
        names = dict.fromkeys(n for d in by_rank for n in d)
        state = tuple(_merge_state(n, [d.get(n) for d in by_rank]) for n in names)
        steps = {i: step_of(d.values())[0] for i, d in enumerate(by_rank) if "step" in d}
        if len(set(steps.values())) > 1:
            disagree.append(f"{k!r} (" + ", ".join(f"rank {i}: {v!r}" for i, v in steps.items())
                            + ")")
        step, kind = step_of(state)
        params.append(ParamInfo(key=k, groups=listed.get(k, ()), state=state, step=step,
                                step_kind=kind,
                                ranks_with_state=tuple(i for i, d in enumerate(by_rank) if d)))
    if disagree:
        findings.append(Finding(level="warning", code="rank-step-disagree",
                                message=f"step differs across ranks for {len(disagree)} params: "
                                        + "; ".join(disagree[:4])
                                        + (" ..." if len(disagree) > 4 else "")))
    params += [ParamInfo(key=k, groups=gs, state=(), ranks_with_state=())
               for k, gs in listed.items() if k not in keys]
    params = in_group_order(params, groups)
    key_type = key_type_of([p.key for p in params])
    optimizer = guess_optimizer(groups)
    findings = findings_for(params, groups, key_type, optimizer) + findings
    partial = [p.key for p in params if p.state and len(p.ranks_with_state or ()) < world]
    if partial:
        findings.append(Finding(level="note", code="partial-ranks",
                                message=f"{len(partial)} params have state on some ranks only "
                                        f"(normal "
                                        f"for use_orig_params=True slices): {few(partial)}"))
    lines, more = _rank_layout(params, world)
    findings += more + _rank_gap(path, pattern, world)
    unsafe_used = any(lf.unsafe for lf in loaded)
    layout = [f"{world} per-rank files ({pattern}): world size {world}"] + lines
    if unsafe_used:
        layout.append("read with --unsafe-load")
    locs = sorted({location_str(w) for w, _ in osds})
    desc = f"{world} per-rank files" + (f", optimizer dict at {few(locs)}" if locs != [""] else "")
    return Summary(path=str(path), format="rank-files", description=desc, location=",".join(locs),
                   key_type=key_type, optimizer=optimizer,
                   params=params, groups=groups, world_size=world, layout=tuple(layout),
                   state_bytes=total_bytes(params), values_read=True, unsafe_loaded=unsafe_used,
                   files=tuple(str(f) for f in files), findings=tuple(findings))
