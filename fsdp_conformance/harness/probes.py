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


def torchrun_env(ctx) -> dict[str, str]:
    """The rank's torchrun variables, as the environment holds them (every name
    ``worker.torchrun_env`` sets)."""
    import os

    from .worker import torchrun_env as names

    return {k: os.environ.get(k, "") for k in names(0, 1, "", 0)}


def string_hash(ctx, text: str) -> tuple[int, str | None]:
    """(``hash(text)``, the rank's ``PYTHONHASHSEED``): the ranks' string-hash seed."""
    return hash(text), os.environ.get("PYTHONHASHSEED")


def threads(ctx) -> tuple[int, str | None]:
    """(``torch.get_num_threads()``, the rank's ``OMP_NUM_THREADS``): its intra-op threads."""
    import torch

    return torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")


def collector(ctx) -> tuple[int, int]:
    """(objects in the collector's permanent generation, objects a full collection
    traverses now)."""
    import gc

    return gc.get_freeze_count(), len(gc.get_objects())


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


def skip_collective_late(ctx, skipping_rank: int, seconds: float) -> int:
    """``skip_collective``, the skipping rank first busy for ``seconds`` (its own part of the
    call takes that long before it returns)."""
    import time

    if ctx.rank == skipping_rank:
        time.sleep(seconds)
        return ctx.rank
    return skip_collective(ctx, skipping_rank)


def exit_on(ctx, bad_rank: int, code: int) -> int:
    """``bad_rank`` leaves with ``os._exit(code)`` (as a crash or OOM kill would)."""
    if ctx.rank == bad_rank:
        os._exit(code)
    return ctx.rank


def scratch_dir(ctx) -> str:
    """This rank's scratch directory."""
    return str(ctx.scratch)


def tensor_roundtrip(ctx, t):
    """Return the tensor it was given, plus this rank's index (pickling of CPU tensors)."""
    return t * 1, ctx.rank


def state_record(ctx, params: int = 20, numel: int = 30) -> dict:
    """What a rank sends back after a save or load, in miniature: an Adam state of
    ``params`` params (``exp_avg``, ``exp_avg_sq`` of ``numel`` elements, a 0-dim ``step``),
    3 x ``params`` CPU tensors (the wire benchmark's message)."""
    import torch

    g = torch.Generator().manual_seed(ctx.rank)
    return {f"layer{i}.weight": {"exp_avg": torch.randn(numel, generator=g),
                                 "exp_avg_sq": torch.rand(numel, generator=g),
                                 "step": torch.tensor(2.0)} for i in range(params)}


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


def fsdp1_checkpoint(ctx, model: str, plan: str, use_orig_params: bool, dcp_dir: str,
                     steps: int = 2) -> dict:
    """A real FSDP1 checkpoint of every kind the reshard CLI reads: wrap zoo ``model`` with
    ``plan`` (plus the zoo's ignored modules), train ``steps`` Adam steps, then save
    ``FSDP.optim_state_dict`` under SHARDED_STATE_DICT with ``dcp.save({"optim": osd})`` into
    ``dcp_dir`` (all ranks). Returns this rank's ``optim.state_dict()`` (int ids, cloned),
    the optimizer's param names in id order (wrapper prefixes removed) and, on rank 0,
    ``FSDP.full_optim_state_dict`` (``{}`` elsewhere)."""
    import copy
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardedOptimStateDictConfig, ShardedStateDictConfig
    from torch.distributed.fsdp import StateDictType
    from torch.distributed.fsdp.wrap import CustomPolicy

    from ..zoo import build_model, loss_of, make_batch, model_spec

    warnings.filterwarnings("ignore")
    spec = model_spec(model)
    module = build_model(model, 0)
    targets = {id(m) for n, m in module.named_modules() if n in set(spec.plans[plan])}
    ignored = [module.get_submodule(f) for f in spec.ignored]
    fsdp = FSDP(module, process_group=ctx.group, device_id=ctx.device,
                use_orig_params=use_orig_params, ignored_modules=ignored or None,
                auto_wrap_policy=CustomPolicy(lambda m: id(m) in targets))
    optim = torch.optim.Adam(fsdp.parameters(), lr=0.01)
    for step in range(steps):
        x = make_batch(model, 0, step, 12)[ctx.rank::ctx.world_size]
        optim.zero_grad(set_to_none=True)
        loss_of(fsdp, x).backward()
        optim.step()
    names = {id(p): n for n, p in fsdp.named_parameters()}
    keys = [names[id(p)] for g in optim.param_groups for p in g["params"]]
    for p in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module."):
        keys = [k.replace(p, "") for k in keys]
    local = copy.deepcopy(optim.state_dict())
    full = FSDP.full_optim_state_dict(fsdp, optim, rank0_only=True)
    with FSDP.state_dict_type(fsdp, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(),
                              ShardedOptimStateDictConfig()):
        osd = FSDP.optim_state_dict(fsdp, optim)
    dcp.save({"optim": osd}, checkpoint_id=dcp_dir, process_group=ctx.group)
    return {"local": local, "keys": keys, "full": copy.deepcopy(full) if ctx.rank == 0 else {}}
