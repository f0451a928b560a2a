"""Reproducer (plain torch, gloo, CPU): torch.optim.Muon on a ``fully_shard`` (FSDP2) model.

Muon computes each 2-D param's update by a Newton-Schulz iteration in bfloat16
(torch/optim/_muon.py:55-66: ``grad.bfloat16()``, divided by its ``norm()`` (:59), then
``X @ X.T`` and two ``addmm`` five times), whatever the param's dtype, and steps with
``param.add_(update, alpha=-adjusted_lr)`` (:341). Under FSDP2 the momentum and its
update are DTensors sharded on dim 0, so that iteration runs on DTensors:

1. A param of which a rank holds no row cannot be stepped (FSDP2 splits rows with
   ``torch.chunk``: a 2-row weight on 3 ranks leaves one empty). Its update comes back
   ``Replicate`` (printed) and no strategy of the in-place ``add_`` keeps the param's
   ``Shard(0)``: ``RuntimeError: aten.add_.Tensor: in-place operations that require
   placement changes are not supported`` at the first ``step()`` (printed per param: only
   the 2-row one raises), and in DSD's zero-gradient step of a load
   (``get_optimizer_state_dict`` of a fresh Muon, state_dict.py:662; printed).
2. Where it steps, it does not compute one process's update. The norm of the sharded
   bfloat16 matrix is taken from the ranks' own bfloat16 norms, and comes out a bfloat16
   step or two from one process's (printed, with the float64 norm); one process's
   iteration given that norm instead gives the sharded update bit for bit (printed), so
   the norm is the whole difference here. Each iteration multiplies the small singular
   values by up to a = 3.4445, so in a gradient of low rank (here rank 2: the batch goes
   through a 2-row head) the bfloat16 rounding noise in the null directions grows to the
   update's own size, and the one-step change of the norm moves the update by up to half
   of its norm (printed), and the params after ``step()`` apart from one process's
   (printed). A matmul that sums over the sharded dim (``X @ X.T`` of a tall gradient,
   transposed to Shard(1)) adds the ranks' bfloat16 partial products (the last check). No
   single-process run is a reference for it within a tolerance a real bug would exceed.

Seen (2026-11-29, torch 2.13.0+cpu and 2.15.0+cu132 alike; fp64 Sequential(Linear(13, 11),
Linear(11, 5), Linear(5, 2)) without biases, each Linear its own fully_shard unit, lr 0.02):
at 2 ranks the 11x13 weight's update equals one process's, the 5x11 and 2x5 weights' do
not (norms 0.3652 vs 0.3633, float64 0.3628; updates 0.51 and 0.02 apart relative to their
norm, one process given the sharded norm equal to them; the params after step() 0.011 and
0.0008 apart); at 3 ranks the 2x5 weight's update is Replicate and its step raises the
RuntimeError above (the others step), and so does get_optimizer_state_dict of a fresh Muon.
Run: python notes/repro/fsdp2_muon_sharded.py 2   (or 3)"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard, distribute_tensor
from torch.optim._muon import _zeropower_via_newtonschulz

COEFFS, STEPS, EPS = (3.4445, -4.775, 2.0315), 5, 1e-7  # torch.optim.Muon's defaults


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(13, 11, bias=False),
                               torch.nn.Linear(11, 5, bias=False),
                               torch.nn.Linear(5, 2, bias=False)).double()


def backward(m: torch.nn.Module) -> None:
    x = torch.randn(8, 13, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    m(x).square().sum().backward()


def nesterov_input(grad: torch.Tensor) -> torch.Tensor:
    """What the first step orthogonalises: grad.lerp(buf, 0.95), buf = 0.05 grad
    (_muon.py:333-334, momentum 0.95, nesterov)."""
    return grad.lerp(torch.zeros_like(grad).lerp_(grad, 0.05), 0.95)


def newton_schulz_with_norm(grad: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    """_muon.py:55-70 in one process, dividing by ``norm`` instead of its own."""
    a, b, c = COEFFS
    x = grad.bfloat16()
    if grad.size(0) > grad.size(1):
        x = x.T
    x = x / norm.clamp(min=EPS)
    for _ in range(STEPS):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if grad.size(0) > grad.size(1) else x


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def rank(r: int, ws: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29567")
    dist.init_process_group("gloo", rank=r, world_size=ws)
    mesh = init_device_mesh("cpu", (ws,))
    plain, m = model(), model()
    for layer in m:
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    backward(plain)
    backward(m)
    names = [n for n, _ in m.named_parameters()]
    with torch.no_grad():
        for n, p, q in zip(names, m.parameters(), plain.parameters()):
            u, v = nesterov_input(p.grad), nesterov_input(q.grad)
            norm = u.bfloat16().norm().full_tensor()
            upd = _zeropower_via_newtonschulz(u, COEFFS, STEPS, EPS)
            placement, upd = upd.placements, upd.full_tensor()
            one = _zeropower_via_newtonschulz(v, COEFFS, STEPS, EPS)
            if r == 0:
                print(f"{n} {tuple(q.shape)}: update placement {placement}; bf16 norm "
                      f"sharded {norm.item():.4f}, one process {v.bfloat16().norm().item():.4f}"
                      f", float64 {v.norm().item():.4f}; update {rel(upd, one):.3g} apart "
                      f"(relative); one process given the sharded norm: equal "
                      f"{torch.equal(newton_schulz_with_norm(v, norm), upd)}; rank of the "
                      f"gradient {int((torch.linalg.svdvals(q.grad) > 1e-12).sum())}")
    for n, p in zip(names, m.parameters()):  # one optimizer per param: which one raises
        try:
            torch.optim.Muon([p], lr=0.02).step()
        except RuntimeError as e:
            print(f"rank {r}, {n}: step raised RuntimeError: {str(e).splitlines()[0]}")
    if ws == 2:
        torch.optim.Muon(plain.parameters(), lr=0.02).step()
        for n, p, q in zip(names, m.parameters(), plain.parameters()):
            full = p.full_tensor()
            if r == 0:
                print(f"{n}: params after step() {rel(full, q):.3g} apart (relative)")
    m.zero_grad(set_to_none=True)  # as a fresh resume: DSD steps only params without grads
    try:  # DSD's zero-gradient step of a fresh optimizer (a load's first call)
        get_optimizer_state_dict(m, torch.optim.Muon(m.parameters(), lr=0.02))
    except RuntimeError as e:
        print(f"rank {r}: get_optimizer_state_dict raised RuntimeError: "
              f"{str(e).splitlines()[0]}")
    # the Gram matrix of a bfloat16 matrix whose columns are sharded (a tall grad, transposed)
    X = torch.randn(5, 12, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(2)).bfloat16()
    d = distribute_tensor(X.T.contiguous(), mesh, [Shard(0)]).T
    gram = (d @ d.T).full_tensor()
    parts = [X[:, c] @ X[:, c].T for c in torch.arange(12).chunk(ws)]
    if r == 0 and ws == 2:
        print(f"Gram matrix of column-sharded X: equal to one process's X @ X.T "
              f"{torch.equal(gram, X @ X.T)}; to the bfloat16 sum of the 2 ranks' partial "
              f"products {torch.equal(gram, parts[0] + parts[1])}")
    dist.destroy_process_group()


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    mp.spawn(rank, args=(n,), nprocs=n)
