"""Small importable rank functions: used by the harness benchmark, the self-tests and
``fsdp-conformance bench harness``. Each states what it does on every rank."""
from __future__ import annotations

import os


def noop(ctx) -> None:
    """Do nothing (measures the pool's round trip)."""
    return None


def whoami(ctx) -> tuple[int, int, int]:
    """(rank, world size, sum of ranks via all_reduce): proves the process group works."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t, group=ctx.group)
    return ctx.rank, ctx.world_size, int(t.item())


def random_bits(ctx, n: int = 8):
    """Draws from python, numpy and torch after the call's seeding."""
    import random

    import numpy as np
    import torch

    return random.random(), float(np.random.rand()), torch.randn(n)


def raise_on(ctx, bad_rank: int) -> int:
    """Raise ValueError on ``bad_rank`` only; other ranks return their rank."""
    if ctx.rank == bad_rank:
        raise ValueError(f"planted failure on rank {ctx.rank}")
    return ctx.rank


def raise_before_collective(ctx, bad_rank: int) -> int:
    """``bad_rank`` raises before an all_reduce the others enter (they block on it)."""
    import torch
    import torch.distributed as dist

    if ctx.rank == bad_rank:
        raise ValueError(f"planted failure on rank {ctx.rank} before all_reduce")
    t = torch.ones(1)
    dist.all_reduce(t, group=ctx.group)
    return ctx.rank


def skip_collective(ctx, skipping_rank: int) -> int:
    """Every rank but ``skipping_rank`` enters an all_reduce: the call hangs."""
    import torch
    import torch.distributed as dist

    if ctx.rank != skipping_rank:
        t = torch.ones(1)
        dist.all_reduce(t, group=ctx.group)
    return ctx.rank


def exit_on(ctx, bad_rank: int, code: int) -> int:
    """``bad_rank`` leaves with ``os._exit(code)`` (as a crash or OOM kill would)."""
    if ctx.rank == bad_rank:
        os._exit(code)
    return ctx.rank


def tensor_roundtrip(ctx, t):
    """Return the tensor it was given, plus this rank's index (pickling of CPU tensors)."""
    return t * 1, ctx.rank


def small_fsdp_task(ctx, seed_offset: int = 0):
    """Wrap a 2-layer MLP in FSDP1, one Adam step, return ``full_optim_state_dict`` (rank 0
    gets the dict, others {}): the unit of work of the harness benchmark."""
    import torch
    import torch.nn as nn
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    torch.manual_seed(1234 + seed_offset)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    fsdp = FSDP(model, process_group=ctx.group, device_id=ctx.device, use_orig_params=False)
    optim = torch.optim.Adam(fsdp.parameters(), lr=1e-3)
    x = torch.randn(4, 16, device=ctx.device)
    fsdp(x).sum().backward()
    optim.step()
    osd = FSDP.full_optim_state_dict(fsdp, optim, rank0_only=True)
    return {k: {n: v.shape for n, v in s.items()} for k, s in osd.get("state", {}).items()}


def sleep(ctx, seconds: float) -> int:
    """Sleep on every rank (a long call to interrupt)."""
    import time

    time.sleep(seconds)
    return ctx.rank


def unpicklable_result(ctx):
    """Return something pickle refuses (a lock)."""
    import threading

    return threading.Lock()


def device_of_ctx(ctx) -> str:
    """The device this rank computes on."""
    return str(ctx.device)
