"""Reproducer (plain torch 2.13, 2 ranks, gloo, CPU): torch.optim.Adafactor cannot step a
``fully_shard`` (FSDP2) model: its first ``step()`` raises on every rank.

For a 2-D param Adafactor keeps factored second moments and computes the column mean as
``torch.norm(grad, dim=-2, keepdim=True).square_()`` (torch/optim/_adafactor.py:398-399).
Under FSDP2 the grad is a DTensor sharded on dim 0, so the norm over dim -2 is a pending
reduction (placement ``_NormPartial(2)``), and DTensor refuses the in-place ``square_``:
``RuntimeError: aten.pow_.Scalar: in-place operations that require placement changes are
not supported. The input has placement (_NormPartial(2),), ...``. The row mean (over the
unsharded dim -1, :393-395) is not the problem. Nothing can be trained or saved; the same
class as Rprop's boolean-mask assignment (entry rprop-cannot-step-dtensor).

Seen (2026-11-29, fp64 Linear(6, 8) - Tanh - Linear(8, 3), each Linear its own fully_shard
unit and the root, lr 0.01): both ranks raise the RuntimeError above in the first step, in
_single_tensor_adafactor (:399); torch 2.15 raises the same (run with its environment).
Under FSDP1 Adafactor runs but unfactored
(notes/repro/fsdp1_adafactor_flat_unfactored.py). Not yet an entry (issue 49: Adafactor is
not in the zoo yet).
Run: python notes/repro/fsdp2_adafactor_cannot_step.py"""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

WS = 2


def rank(r: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29563")
    dist.init_process_group("gloo", rank=r, world_size=WS)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                            torch.nn.Linear(8, 3)).double()
    mesh = init_device_mesh("cpu", (WS,))
    for layer in (m[0], m[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    o = torch.optim.Adafactor(m.parameters(), lr=0.01)
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(100), dtype=torch.float64)
    (m(x[r::WS]) ** 2).mean().backward()
    try:
        o.step()
        print(f"rank {r}: Adafactor stepped")
    except RuntimeError as exc:
        print(f"rank {r}: RuntimeError: {str(exc).splitlines()[0][:160]}")
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(rank, nprocs=WS, join=True)
