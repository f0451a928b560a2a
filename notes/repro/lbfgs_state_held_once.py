"""Reproducer (plain torch 2.13, gloo, CPU): neither FSDP can checkpoint torch.optim.LBFGS.

LBFGS keeps one state for all its params, under the first (optim/lbfgs.py:349-352: "LBFGS has
only global state, but we register it as state for the first param"): ``d`` and
``prev_flat_grad`` are flat vectors over every param the optimizer holds, ``old_dirs`` /
``old_stps`` / ``ro`` history lists, ``H_diag`` a 0-dim tensor, the rest Python numbers. Its
step needs a closure; with ``max_iter=1`` it calls it exactly once. What happens:

1. FSDP1, flat parameters (``use_orig_params=False``), two FSDP units: the optimizer state
   dict treats the state under the first flat param as that flat param's own. At world size
   1 unflattening it raises ``split_with_sizes expects split_sizes to sum exactly to <all
   params' numel>`` (_optim_utils.py:285 -> _flat_param.py:1901); at 2 ranks the all-gather of
   it raises ``ProcessGroupGloo::allgather: invalid tensor size`` (_optim_utils.py:229).
2. FSDP1, ``use_orig_params=True``: ``<param> is not in the optimizer state. The
   FSDPParamInfo has the param keys [...] while the optimizer has the param keys [<first>]``
   (_optim_utils.py:1804, _convert_state_with_orig_params).
3. FSDP2 at 2 ranks, a param of 3 rows: the first step raises in ``_gather_flat_grad``
   (lbfgs.py:293, ``p.grad.view(-1)``): ``Cannot flatten unevenly sharded tensor: dimension 0
   (size 3) is not evenly divisible by mesh dimension 0 (size 2)``.
4. FSDP2 at 1 rank trains and saves; DSD's ``set_optimizer_state_dict`` into a fresh LBFGS
   of a model without grads (a resume) first steps it with ``closure=None``
   (state_dict.py:662, _init_optim_state) and LBFGS calls its closure (lbfgs.py:357):
   ``TypeError: 'NoneType' object is not callable``. Where the params still have grads
   _init_optim_state returns early (:641-644) and the strict split refuses the dict next:
   ``Missing optimizer state for parameter '0.bias' in checkpoint`` (:1035-1039; LBFGS has
   state under its first param only), so behind the first refusal is a second.

Seen 2026-11-29 on torch 2.13.0+cpu and 2.15.0 (the same outcomes; run with each
environment's python). Not reported upstream that we found.
Run: python notes/repro/lbfgs_state_held_once.py"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import StateDictType, fully_shard


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 3)).double()


def train(m, o, r: int, ws: int) -> None:
    for s in range(2):
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(100 + s),
                        dtype=torch.float64)[r::ws]

        def closure():
            o.zero_grad()
            loss = (m(x) ** 2).mean()
            loss.backward()
            return loss

        o.step(closure)


def first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:150]}"


def rank(r: int, ws: int, what: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=r, world_size=ws)
    try:
        if what.startswith("fsdp1"):
            m = model()
            m[2] = FSDP(m[2], use_orig_params=what == "fsdp1-orig", device_id=torch.device("cpu"))
            m = FSDP(m, use_orig_params=what == "fsdp1-orig", device_id=torch.device("cpu"))
        else:
            m, mesh = model(), init_device_mesh("cpu", (ws,))
            fully_shard(m[2], mesh=mesh)
            fully_shard(m, mesh=mesh)
        o = torch.optim.LBFGS(m.parameters(), lr=0.1, max_iter=1)
        train(m, o, r, ws)
        if what.startswith("fsdp1"):
            with FSDP.state_dict_type(m, StateDictType.FULL_STATE_DICT,
                                      FullStateDictConfig(rank0_only=False),
                                      FullOptimStateDictConfig(rank0_only=False)):
                FSDP.optim_state_dict(m, o)
            print(f"{what} ws{ws} rank {r}: saved")
        else:
            full = StateDictOptions(full_state_dict=True)
            osd = get_optimizer_state_dict(m, o, options=full)
            # a resume: a fresh optimizer, no grads yet (as a new process has)
            m.zero_grad(set_to_none=True)
            for grads in ("no grads", "grads"):
                if grads == "grads":  # _init_optim_state returns early, the split runs
                    train(m, torch.optim.SGD(m.parameters(), lr=0.0), r, ws)
                fresh = torch.optim.LBFGS(m.parameters(), lr=0.1, max_iter=1)
                try:
                    set_optimizer_state_dict(m, fresh, osd, options=full)
                    print(f"{what} ws{ws} rank {r}: saved, loaded ({grads})")
                except Exception as exc:  # noqa: BLE001
                    print(f"{what} ws{ws} rank {r}: saved; load ({grads}): {first_line(exc)}")
    except Exception as exc:  # noqa: BLE001 - the point is what torch raises
        print(f"{what} ws{ws} rank {r}: {first_line(exc)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    print("torch", torch.__version__, file=sys.stderr)
    for i, (what, ws) in enumerate((("fsdp1-flat", 1), ("fsdp1-flat", 2), ("fsdp1-orig", 2),
                                    ("fsdp2", 2), ("fsdp2", 1))):
        mp.spawn(rank, args=(ws, what, 29581 + i), nprocs=ws, join=True)
