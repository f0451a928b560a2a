"""Two ways a trainer keeps its latest FSDP2 checkpoint, as a preemption in the middle of a
save meets them (our own code, in the patterns trainers use). Both save model and optimizer
with torch's distributed state-dict API and ``torch.distributed.checkpoint`` (DCP):

- ``latest_save`` / ``latest_load``: every save writes into one ``latest`` folder, over the
  previous checkpoint. DCP writes each rank's data file in place and commits ``.metadata``
  last, so a save killed after the data files and before the commit leaves the previous
  save's ``.metadata`` over the new data: the next load reads the unfinished save without
  an error (known entry ``dcp-overwrite-reads-uncommitted-data``).
- ``step_save`` / ``step_load``: every save writes a folder of its own,
  ``.incomplete-step-<n>``, which rank 0 renames to ``step-<n>`` once every rank's files and
  the metadata are written (a rename is atomic on one file system); the load takes the
  newest ``step-<n>``. A save killed at any point leaves its folder incomplete, and the load
  restores the previous checkpoint exactly.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

LATEST = "latest"
STEP_PREFIX = "step-"
INCOMPLETE = ".incomplete-"


def _state(model, optim) -> dict:
    model_sd, optim_sd = get_state_dict(model, optim)
    return {"model": model_sd, "optim": optim_sd}


def _restore(model, optim, folder: Path) -> None:
    state = _state(model, optim)
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optim, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])


def latest_save(model, optim, directory: str) -> None:
    """Overwrite ``<directory>/latest`` with this checkpoint."""
    dcp.save(_state(model, optim), checkpoint_id=str(Path(directory) / LATEST))


def latest_load(model, optim, directory: str) -> None:
    """Restore from ``<directory>/latest``."""
    _restore(model, optim, Path(directory) / LATEST)


def _step(optim) -> int:
    """The optimizer's step counter (every param's ``step`` is the same)."""
    steps = [int(s["step"]) for s in optim.state.values() if "step" in s]
    return max(steps, default=0)


def step_save(model, optim, directory: str) -> None:
    """Write ``<directory>/.incomplete-step-<n>``, then rank 0 renames it ``step-<n>``."""
    root = Path(directory)
    name = f"{STEP_PREFIX}{_step(optim):08d}"
    tmp = root / f"{INCOMPLETE}{name}"
    dcp.save(_state(model, optim), checkpoint_id=str(tmp))
    dist.barrier()
    if dist.get_rank() == 0:
        os.replace(tmp, root / name)  # the commit: whole or absent
    dist.barrier()


def step_load(model, optim, directory: str) -> None:
    """Restore from the newest complete ``<directory>/step-<n>``."""
    done = sorted(p for p in Path(directory).glob(f"{STEP_PREFIX}*") if p.is_dir())
    if not done:
        raise FileNotFoundError(f"no complete checkpoint (step-<n>) under {directory}")
    _restore(model, optim, done[-1])


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def data(step: int, n: int) -> torch.Tensor:
    return torch.randn(n, 6)
