"""The files of a round trip, on a rank: what the path modules write and the load side reads
back (names: ``api_paths`` ``FULL_FILE``, ``MODEL_FILE``, ``SCHED_FILE``, ``DCP_DIR``,
``rank_file``).

Rules
- A file is written atomically (a temporary name, then ``os.replace``): a reader never sees
  half of one.
- A resuming trainer reads with ``torch.load(weights_only=True)``; where that refuses a
  type it does not allow, the file is read without, and why is noted (P8). A damaged file
  of a fault case raises its own error (P15 judges it).
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch

from ..api_paths import DCP_DIR, FULL_FILE, api_path, rank_file


def atomic_save(obj: Any, path: Path) -> None:
    """``torch.save(obj)`` to ``path`` through a temporary file in the same directory."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def write_full(ctx, saved: Any, out: Path) -> None:
    """A full path's write: rank 0 torch.saves the dict (the others hold ``{}``)."""
    if ctx.rank == 0:
        atomic_save(saved, out / FULL_FILE)


def write_dcp(ctx, model_sd: dict, saved: Any, out: Path) -> None:
    """A DCP path's write: ``dcp.save({"model", "optim"})`` on every rank."""
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": model_sd, "optim": saved}, checkpoint_id=str(out / DCP_DIR),
             process_group=ctx.group)


def devices_of(obj: Any) -> set[str]:
    """The devices of every tensor in ``obj`` (ShardedTensor and DTensor pieces included)."""
    if isinstance(obj, torch.Tensor):
        return {str(obj.device)}
    if hasattr(obj, "local_shards"):
        return {str(s.tensor.device) for s in obj.local_shards()}
    if hasattr(obj, "to_local"):
        return {str(obj.to_local().device)}
    if isinstance(obj, dict):
        return set().union(*(devices_of(v) for v in obj.values())) if obj else set()
    if isinstance(obj, (list, tuple)):
        return set().union(*(devices_of(v) for v in obj)) if obj else set()
    return set()


def read_saved(ctx, case, workdir: Path, *, damage_raises: bool = False) -> tuple[Any, str]:
    """Read what the save side wrote, as a resuming trainer would: ``torch.load`` with
    ``weights_only=True``; if that refuses the file, note why (P8) and read it without
    (``damage_raises``: a refusal for damage, not for a type weights_only does not allow,
    raises: what a fault case judges). (None, "") where the path reads nothing itself (DCP:
    its load reads the directory; rank != 0 of a path whose rank 0 scatters)."""
    rec = api_path(case.api)
    if rec.full_load == "scatter" and ctx.rank != 0:
        return None, ""  # rank 0 alone reads the file and scatters it
    if rec.full:
        path = workdir / FULL_FILE
    elif rec.writes == "per_rank":
        path = workdir / rank_file(ctx.rank)
    else:
        return None, ""
    try:
        return torch.load(path, weights_only=True), ""
    except Exception as exc:  # noqa: BLE001
        if damage_raises and not _weights_only_refusal(exc):
            raise  # a damaged file: its own error is what P15 judges
        note = f"torch.load(weights_only=True) refused {path.name}: {type(exc).__name__}: {exc}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, weights_only=False), note


def _weights_only_refusal(exc: Exception) -> bool:
    """torch.load(weights_only=True) refusing a type it does not allow (not damage)."""
    return "Weights only load failed" in str(exc) and "Unsupported global" in str(exc)
