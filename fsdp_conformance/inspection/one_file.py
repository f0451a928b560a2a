"""``inspect`` of one file: a ``torch.save`` of an optimizer dict or of an object
holding one.

Rules
-----
One file (not a directory) with FlatParameter keys, or ShardedTensors or DTensors saved
at a world size above 1, is one rank's part of a sharded checkpoint (a warning); whole
tensors keyed by FQN are a full dict; int keys are ``optim.state_dict()``'s.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Sequence

from .describe import (FLAT_MARKER, group_index, group_infos, guess_optimizer, in_group_order,
                       key_type_of, params_from_state, recorded_world_sizes, total_bytes)
from .findings import damage_findings, few, findings_for
from .load import load_file
from .locate import location_str, select_optimizer_dict
from .summary import SHARDED_KINDS, Finding, ParamInfo, Summary

def _file_layout(params: Sequence[ParamInfo], key_type: str,
                 unsafe: bool) -> tuple[list[str], list[Finding], int | None]:
    """Layout lines, findings and the saving world size (when recorded) of one file."""
    lines: list[str] = []
    findings: list[Finding] = []
    flat = [p.key for p in params if isinstance(p.key, str) and FLAT_MARKER in p.key]
    sharded = Counter(next(s.kind for s in p.state if s.kind in SHARDED_KINDS) for p in params
                      if any(s.kind in SHARDED_KINDS for s in p.state))
    recorded = sorted(w for w in recorded_world_sizes(params) if w is not None)
    if flat:
        findings.append(Finding(level="warning", code="one-rank-file",
                                message=f"keys name FSDP1 flat parameters ({few(flat, 3)}): this "
                                        "is one rank's local dict (a FlatParameter shard), not a "
                                        "full dict; inspect the directory of every rank's file"))
        lines.append("FlatParameter keys: one rank's local FSDP1 dict")
    what = " and ".join(f"{n} params as {'ShardedTensor' if k == 'sharded tensor' else 'DTensor'}"
                        for k, n in sorted(sharded.items()))
    if sharded and recorded == [1]:
        lines.append(f"{what} saved at world size 1: the file holds the whole state")
    elif sharded:
        findings.append(Finding(level="warning", code="one-rank-file",
                                message=f"{what}: this file holds one rank's shards of a "
                                        f"checkpoint saved at world size {few(recorded) or '?'}, "
                                        "not the whole state; inspect the directory of every "
                                        "rank's file"))
        lines.append(f"{what} (global shapes recorded): one rank's file of a sharded "
                     f"checkpoint saved at world size {few(recorded) or '?'}")
    elif not flat and key_type == "fqn":
        lines.append("whole (unsharded) tensors keyed by FQN: a full dict, loadable at any "
                     "world size")
    elif not flat and key_type == "int":
        lines.append("keyed by int ids (optim.state_dict()): the names are not in the file; "
                     "a plain model's dict, or one rank's local dict")
    if unsafe:
        lines.append("read with --unsafe-load")
    return lines, findings, recorded[0] if len(recorded) == 1 else None


def summarise_file(path: Path, key: str | None, unsafe: bool) -> Summary:
    lf = load_file(path, None, unsafe)
    obj, was_unsafe = lf.obj, lf.unsafe
    where, osd = select_optimizer_dict(obj, key, path)
    groups = group_infos(osd["param_groups"])
    params = in_group_order(params_from_state(osd["state"], group_index(groups)), groups)
    key_type = key_type_of([p.key for p in params])
    optimizer = guess_optimizer(groups)
    findings = findings_for(params, groups, key_type, optimizer)
    layout, more, world = _file_layout(params, key_type, was_unsafe)
    desc = ("torch.save'd optimizer dict" if not where else
            f"torch.save'd {type(obj).__name__} holding an optimizer dict at {location_str(where)}")
    return Summary(path=str(path), format="file", description=desc, location=location_str(where),
                   key_type=key_type, optimizer=optimizer,
                   params=params, groups=groups, world_size=world, layout=tuple(layout),
                   state_bytes=total_bytes(params), values_read=True, unsafe_loaded=was_unsafe,
                   files=(str(path),), findings=tuple(damage_findings([path],
                                                                      [lf]) + findings + more))
