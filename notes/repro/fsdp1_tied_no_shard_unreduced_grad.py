# Reproducer and mechanism check (torch 2.13.0, CPU, gloo, 2 ranks): FSDP1 NO_SHARD with
# use_orig_params=True, a tied param (embed.weight == out.weight) whose owning unit is its
# *later* user (`out` wrapped on its own; the root's `embed` uses it first): the gradient
# that reaches the tied param through `embed` is not all-reduced. After one backward on
# different rows per rank, rank r's grad of embed.weight equals
#     mean over ranks of the gradient through `out`  +  rank r's own gradient through `embed`
# (not divided by the world size); every other param's grad is the mean over ranks.
# The script computes both parts without FSDP on each rank's rows (the tie taken apart with
# a stand-in leaf in `embed`) and compares bitwise-ish (max abs error) with FSDP's grads.
# Known entry: tied-across-units-orig-grad-not-reduced (fsdp_conformance/known/entries.py).
# Usage: python fsdp1_tied_no_shard_unreduced_grad.py   (prints one line per rank)
"""Probe: FSDP1 NO_SHARD, tied param owned by its later user: one use's grad not reduced."""
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

WS, VOCAB, DIM, ROWS = 2, 11, 6, 6


class TiedLM(nn.Module):
    """fsdp-conformance's zoo 'tied': out.weight is embed.weight."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layer = nn.Sequential(nn.Linear(DIM, DIM), nn.LayerNorm(DIM))
        self.out = nn.Linear(DIM, VOCAB, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, x):
        return self.out(self.layer(self.embed(x)))


def model():
    torch.manual_seed(0)
    return TiedLM().double()


def rows(rank):
    g = torch.Generator().manual_seed(1009)
    x = torch.randint(0, VOCAB, (ROWS * WS, 4), generator=g)
    return x[rank::WS]


def parts(rank):
    """Without FSDP, on rank's rows: (grad through `embed`, grad through `out`, other grads)."""
    m = model()
    tied = m.embed.weight
    m.embed.weight = nn.Parameter(tied.detach().clone())  # `embed`'s use on a stand-in
    m(rows(rank)).pow(2).mean().backward()
    others = {n: p.grad for n, p in m.named_parameters() if n not in ("embed.weight",)}
    return m.embed.weight.grad, tied.grad, others


def run(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WS)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy

    m = model()
    kw = dict(sharding_strategy=ShardingStrategy.NO_SHARD, use_orig_params=True,
              device_id=torch.device("cpu"))
    m.out = FSDP(m.out, **kw)
    fsdp = FSDP(m, **kw)
    fsdp(rows(rank)).pow(2).mean().backward()
    got = {n.replace("_fsdp_wrapped_module.", ""): p.grad for n, p in fsdp.named_parameters()}
    mine = parts(rank)
    all_parts = [parts(r) for r in range(WS)]
    mean_out = sum(p[1] for p in all_parts) / WS
    mean_embed = sum(p[0] for p in all_parts) / WS
    bug = mean_out + mine[0]
    correct = mean_out + mean_embed
    tied_name = next(n for n in got if n.endswith("weight") and got[n].shape == (VOCAB, DIM))
    g = got[tied_name]
    others = max(float((got[n] - sum(p[2][n] for p in all_parts) / WS).abs().max())
                 for n in got if n != tied_name)
    print(f"rank {rank}: {tied_name} grad - (mean(out) + own embed): "
          f"{float((g - bug).abs().max()):.3g}; - correct (mean of both): "
          f"{float((g - correct).abs().max()):.3g}; other params vs the mean: {others:.3g}",
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(port,), nprocs=WS)
