"""Reading a conversion's input: which kind it is (``detect_input``), the per-rank files of
a directory, and each rank's optimizer dict as the reference's neutral local dict.

Rules
-----
Kinds: ``"full"`` a file (``torch.save`` of a full FQN-keyed dict), ``"dcp"`` a directory
  holding ``.metadata`` (read by :class:`~.dcp.DcpFull`), ``"ranks"`` any other directory:
  per-rank files named by ``pattern`` (default ``optim_rank{rank}.pt``), ranks
  ``0..W-1``, each rank's ``torch.save`` of its local optimizer state dict, keyed by int
  ids (``optim.state_dict()``; id ``i`` is the i-th key of
  ``ModelLayout.optimizer_keys()``) or by names (FQNs; ``"<unit>._flat_param"`` for flat
  units).
Loading: ``torch.load(mmap=True, weights_only=True)``: tensor bytes are read when a unit
  needs them. FSDP wrapper prefixes (``WRAPPER_PREFIXES``) are removed from every name
  read. An unreadable file is a :class:`~.errors.UsageError`, a dict that does not fit the
  layout a :class:`~.errors.CheckpointMismatch`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from .. import reference as ref
from ..reference.errors import StateDictMismatch
from ..reference.keys import check_key_types
from .errors import CheckpointMismatch, UsageError
from ..reference.keys import WRAPPER_PREFIXES, clean_name

DEFAULT_PATTERN = "optim_rank{rank}.pt"
def detect_input(path: str | os.PathLike) -> str:
    """``"full"`` for a file, ``"dcp"`` for a directory with ``.metadata``, else ``"ranks"``."""
    p = Path(path)
    if not p.exists():
        raise UsageError("input does not exist", path=p)
    if p.is_file():
        return "full"
    if (p / ".metadata").is_file():
        return "dcp"
    return "ranks"


def rank_files(directory: str | os.PathLike, pattern: str = DEFAULT_PATTERN,
               world_size: int | None = None) -> list[Path]:
    """The per-rank files ``pattern.format(rank=r)`` for ``r < world_size`` (all must exist),
    or, without ``world_size``, for the ranks ``0, 1, ...`` that exist."""
    d = Path(directory)
    if "{rank" not in pattern:
        raise UsageError(f"--pattern {pattern!r} must contain '{{rank}}'")
    if world_size is None:
        files = []
        while (d / pattern.format(rank=len(files))).is_file():
            files.append(d / pattern.format(rank=len(files)))
        if not files:
            raise UsageError(f"no per-rank file {pattern.format(rank=0)!r} (pattern {pattern!r}) and "
                             "no DCP .metadata in this directory", path=d)
        return files
    files = [d / pattern.format(rank=r) for r in range(world_size)]
    for r, f in enumerate(files):
        if not f.is_file():
            raise UsageError(f"missing the file of rank {r} (source world size {world_size})",
                             path=f, rank=r)
    extra = d / pattern.format(rank=world_size)
    if extra.exists():
        raise UsageError(f"a file for rank {world_size} exists but the source world size is "
                         f"{world_size}: wrong --src-world-size?", path=extra, rank=world_size)
    return files


def torch_load(path: Path, rank: int | None = None) -> Any:
    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as e:  # noqa: BLE001  (truncated, corrupt, not a torch file, unsafe pickle)
        who = "the optimizer state" if rank is None else f"rank {rank}'s optimizer state"
        raise UsageError(f"cannot read {who}: "
                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                         path=path, rank=rank) from e


def clean_osd(osd: Any, path: Path, rank: int | None) -> dict:
    """Checks the outer shape of an optimizer dict; removes wrapper prefixes from names."""
    if not isinstance(osd, Mapping) or "state" not in osd or not isinstance(osd["state"], Mapping):
        got = sorted(map(str, osd))[:6] if isinstance(osd, Mapping) else type(osd).__name__
        raise UsageError(f"not an optimizer state dict (no 'state' mapping; found {got})",
                         path=path, rank=rank)
    try:
        kt = check_key_types(osd["state"], rank=rank)
    except StateDictMismatch as e:
        raise CheckpointMismatch(str(e), path=path, rank=rank, key="state") from e

    def name(k):
        return clean_name(k) if isinstance(k, str) else k

    state = {name(k): v for k, v in osd["state"].items()} if kt is str else dict(osd["state"])
    groups = []
    for g in osd.get("param_groups", []):
        g2 = dict(g)
        if "params" in g2:
            g2["params"] = [name(k) for k in g2["params"]]
        groups.append(g2)
    return {"state": state, "param_groups": groups}


def rank_loader(files: Sequence[Path], layout: ref.ModelLayout) -> tuple[Callable[[int], dict], dict]:
    """``(load(rank) -> neutral local dict, info)``; ``info["key_type"]`` is filled with
    ``int`` or ``str`` by the first load (rank 0)."""
    keys = layout.optimizer_keys()
    info: dict[str, Any] = {"key_type": None}

    def load(r: int) -> dict:
        osd = clean_osd(torch_load(files[r], r), files[r], r)
        kt = check_key_types(osd["state"])
        if kt is None and osd["param_groups"]:
            kt = type(osd["param_groups"][0]["params"][0]) if osd["param_groups"][0].get("params") else None
        if info["key_type"] is None:
            info["key_type"] = kt
        try:
            return ref.to_named(osd, keys, rank=r)
        except StateDictMismatch as e:
            hint = ""
            if kt is int:
                n = 1 + max([k for g in osd["param_groups"] for k in g.get("params", [])]
                            + list(osd["state"]), default=-1)
                hint = (f"; the checkpoint has {n} optimizer ids, the source layout {len(keys)} "
                        f"({keys[:6]}{' ...' if len(keys) > 6 else ''}): check --model, --plan, "
                        "--use-orig-params")
            raise CheckpointMismatch(f"does not fit the source layout: {e}{hint}", path=files[r],
                                     rank=r, param=e.param, key=e.key) from e

    return load, info


def first_float_dtype(state: Mapping) -> torch.dtype | None:
    for st in state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0 and v.is_floating_point():
                return v.dtype
    return None


def load_rank_files(directory: str | os.PathLike, layout: ref.ModelLayout,
                    pattern: str = DEFAULT_PATTERN) -> list[dict]:
    """Every rank's neutral local dict from a directory written by :func:`convert`
    (or any per-rank files for ``layout``)."""
    files = rank_files(directory, pattern, layout.world_size)
    load, _ = rank_loader(files, layout)
    return [load(r) for r in range(len(files))]




__all__ = ["DEFAULT_PATTERN", "WRAPPER_PREFIXES", "clean_name", "clean_osd", "detect_input",
           "first_float_dtype", "load_rank_files", "rank_files", "rank_loader", "torch_load"]
