"""A user's trainer checkpoint code (save/load on every rank), correct and with planted bugs,
for the plugin's tests. Module level, so the ranks import it by name."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import StateDictType

FILE = "optim.pt"


def _full_osd(model, optim) -> dict:
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(rank0_only=True, offload_to_cpu=True),
                              FullOptimStateDictConfig(rank0_only=True, offload_to_cpu=True)):
        return FSDP.optim_state_dict(model, optim)


def _write(osd: dict, path: str) -> None:
    if dist.get_rank() == 0:
        torch.save(osd, os.path.join(path, FILE))
    dist.barrier()


def save(model, optim, path: str) -> None:
    """What a trainer does: the full optimizer state dict, written by rank 0."""
    _write(_full_osd(model, optim), path)


def load(model, optim, path: str) -> None:
    osd = torch.load(os.path.join(path, FILE), weights_only=True)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
        optim.load_state_dict(FSDP.optim_state_dict_to_load(model, optim, osd))


def save_dropping_lr(model, optim, path: str) -> None:
    """Bug: "hyperparameters come from the config", so the last group's lr is not saved."""
    osd = _full_osd(model, optim)
    if osd:
        osd["param_groups"][-1].pop("lr", None)
    _write(osd, path)


def save_step_as_int(model, optim, path: str) -> None:
    """Bug: ``step`` saved as a Python int (a "cleanup" for a smaller, readable file)."""
    osd = _full_osd(model, optim)
    for st in osd.get("state", {}).values():
        if "step" in st:
            st["step"] = int(st["step"])
    _write(osd, path)


def save_with_extra_step(model, optim, path: str) -> None:
    """Bug: a "dummy step" before saving, to make sure every param has state
    (pytorch#125708's class): the optimizer moves on while saving."""
    for group in optim.param_groups:
        for p in group["params"]:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
    optim.step()
    save(model, optim, path)


def save_into_missing_dir(model, optim, path: str) -> None:
    """A trainer bug: every rank writes under a directory nobody created (torch.save raises
    from inside torch.serialization)."""
    torch.save(_full_osd(model, optim), os.path.join(path, "no-such-dir", FILE))


def save_nudging_exp_avg_sq(model, optim, path: str) -> None:
    """Bug: one element of the first param's ``exp_avg_sq`` is off by 1e-3 in the file (on top
    of whatever torch's own full dict does)."""
    osd = _full_osd(model, optim)
    if osd:
        st = osd["state"][sorted(osd["state"])[0]]
        st["exp_avg_sq"] = st["exp_avg_sq"].clone()
        st["exp_avg_sq"].view(-1)[0] += 1e-3
    _write(osd, path)
