"""Reproducer (plain torch 2.13, 2 ranks, gloo, CPU): torch.optim.Adafactor under FSDP1 keeps
an unfactored per-element ``variance`` where a plain Adafactor keeps factored ``row_var`` and
``col_var``, so FSDP1 training is not Adafactor's, and FSDP1's full optimizer state dict does
not load into a plain Adafactor.

Adafactor factors a param's second moment only when its gradient has more than one dim
(torch/optim/_adafactor.py:100-113: ``row_var`` / ``col_var`` for ``p.grad.dim() > 1``, else
``variance``). FSDP1 hands the optimizer its flat parameters (1-D, with ``use_orig_params``
False or True alike), so every state is an unfactored ``variance``; the full optimizer state
dict unflattens it to the param's shape under that key. A plain Adafactor loading it has a
2-D ``0.weight`` with neither ``row_var`` nor ``col_var``, and its next ``step()`` raises
``AssertionError: row_var and col_var should be defined when grad is multidimensional``
(:390).

Seen (2026-11-29, fp64 Linear(6, 8) - Tanh - Linear(8, 3), lr 0.01, 3 steps, 8 rows a step):
FSDP1 params differ from single-process Adafactor's by at most 6.0e-3 (flat params) and
6.8e-3 (use_orig_params=True); the full dict's ``0.weight`` state is {'variance': (8, 6),
'step': ()} against the plain optimizer's {'row_var': (8, 1), 'col_var': (1, 6), 'step': ()};
loading it into a plain Adafactor and stepping raises the AssertionError above.
Not yet an entry of known/entries.py (issue 49: Adafactor is not in the zoo yet).
Run: python notes/repro/fsdp1_adafactor_flat_unfactored.py"""
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import StateDictType

STEPS, WS = 3, 2


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 3)).double()


def batch(step: int) -> torch.Tensor:
    return torch.randn(8, 6, generator=torch.Generator().manual_seed(100 + step),
                       dtype=torch.float64)


def single() -> tuple[dict, dict]:
    m = model()
    o = torch.optim.Adafactor(m.parameters(), lr=0.01)
    for s in range(STEPS):
        o.zero_grad()
        (m(batch(s)) ** 2).mean().backward()
        o.step()
    return {n: p.detach().clone() for n, p in m.named_parameters()}, o.state_dict()


def rank(r: int, orig: bool, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
    dist.init_process_group("gloo", rank=r, world_size=WS)
    m = FSDP(model(), use_orig_params=orig, device_id=torch.device("cpu"))
    o = torch.optim.Adafactor(m.parameters(), lr=0.01)
    for s in range(STEPS):
        o.zero_grad()
        (m(batch(s)[r::WS]) ** 2).mean().backward()
        o.step()
    with FSDP.state_dict_type(m, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(rank0_only=True),
                              FullOptimStateDictConfig(rank0_only=True)):
        osd = FSDP.optim_state_dict(m, o)
        msd = m.state_dict()
    if r == 0:
        torch.save((msd, osd), out)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    want, plain_osd = single()
    print("plain Adafactor state of 0.weight:",
          {n: tuple(v.shape) for n, v in plain_osd["state"][0].items()})
    for orig in (False, True):
        out = os.path.join(tempfile.mkdtemp(), "full.pt")
        mp.spawn(rank, args=(orig, out), nprocs=WS, join=True)
        msd, osd = torch.load(out, weights_only=False)
        diff = max((msd[k] - want[k]).abs().max().item() for k in want)
        print(f"use_orig_params={orig}: max |param - single-process| after {STEPS} steps: "
              f"{diff:.1e}; full dict state of 0.weight: "
              f"{ {n: tuple(v.shape) for n, v in osd['state']['0.weight'].items()} }")
        m = model()
        o = torch.optim.Adafactor(m.parameters(), lr=0.01)
        names = [n for n, _ in m.named_parameters()]
        o.load_state_dict({"state": {names.index(k): v for k, v in osd["state"].items()},
                           "param_groups": [{**g, "params": [names.index(p) for p in g["params"]]}
                                            for g in osd["param_groups"]]})
        m(batch(0)).sum().backward()
        try:
            o.step()
            print("  a plain Adafactor loads it and steps")
        except AssertionError as exc:
            print(f"  a plain Adafactor loads it; its step raises AssertionError: {exc}")


if __name__ == "__main__":
    main()
