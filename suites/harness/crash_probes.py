"""Rank functions for suites/harness/test_fast_failure.py: planted failures, test-only.

Each is importable (the ranks import it by name) and states what it does on every rank.
``plant_crash`` patches a torch call inside the live rank process; the patch lives until
``unplant_crash`` or until the pool is rebuilt (a fresh rank has no patch).
"""
from __future__ import annotations

PLANTED = "planted crash on rank"


def raise_then_all_reduce(ctx, bad_rank: int) -> int:
    """``bad_rank`` raises; every other rank enters an all_reduce it will never leave."""
    import torch
    import torch.distributed as dist

    if ctx.rank == bad_rank:
        raise ValueError(f"{PLANTED} {ctx.rank}")
    t = torch.ones(1)
    dist.all_reduce(t, group=ctx.group)
    return ctx.rank


def _fail(rank: int) -> None:
    raise ValueError(f"{PLANTED} {rank}")


def guarded_fail_then_barrier(ctx, bad_rank: int):
    """``bad_rank``'s call fails inside ``sut.common.guarded`` and returns the error as its
    value; every other rank enters a barrier it will never leave."""
    import torch.distributed as dist

    from fsdp_conformance.sut.common import guarded

    if ctx.rank == bad_rank:
        return guarded(_fail, ctx.rank)[0]
    dist.barrier(group=ctx.group)
    return {"rank": ctx.rank}


def guarded_fail_everywhere(ctx):
    """Every rank's call fails inside ``guarded``; each returns ``(value, seconds)``."""
    from fsdp_conformance.sut.common import guarded

    return guarded(_fail, ctx.rank)


_ORIGINAL: dict = {}


def plant_crash(ctx, bad_ranks: tuple[int, ...]) -> None:
    """On each rank of ``bad_ranks``: FSDP1's ``optim_state_dict`` (the save call of
    fsdp1.full) raises a RuntimeError naming the rank."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if ctx.rank not in bad_ranks or "optim_state_dict" in _ORIGINAL:
        return
    _ORIGINAL["optim_state_dict"] = FSDP.__dict__["optim_state_dict"]

    def crash(*args, **kwargs):
        raise RuntimeError(f"{PLANTED} {ctx.rank} (test-only injection)")

    FSDP.optim_state_dict = staticmethod(crash)


def unplant_crash(ctx) -> None:
    """Undo ``plant_crash`` on this rank (nothing to do where nothing was planted)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if "optim_state_dict" in _ORIGINAL:
        FSDP.optim_state_dict = _ORIGINAL.pop("optim_state_dict")


ABORT_REASON = "planted abort: the reason a rank prints before it aborts"


def plant_abort(ctx, bad_rank: int) -> None:
    """On ``bad_rank``: FSDP1's ``optim_state_dict`` prints ``ABORT_REASON`` to stderr, then
    aborts the process (SIGABRT) from 40 frames deep, so the Python stack the crash handler
    writes is longer than the log tail a failure keeps (harness/pool.py ``_tail``)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if ctx.rank != bad_rank or "optim_state_dict" in _ORIGINAL:
        return
    _ORIGINAL["optim_state_dict"] = FSDP.__dict__["optim_state_dict"]

    def deep(n: int) -> None:
        if n:
            deep(n - 1)
        import os
        import sys

        sys.stderr.write(f"{ABORT_REASON} {ctx.rank}\n")
        sys.stderr.flush()
        os.abort()

    def crash(*args, **kwargs):
        deep(40)

    FSDP.optim_state_dict = staticmethod(crash)


def say(ctx, text: str) -> int:
    """Print ``text`` to the rank's log."""
    print(text, flush=True)
    return ctx.rank


def say_then_raise_on(ctx, text: str, bad_rank: int) -> int:
    """Print ``text`` to the rank's log, then raise on ``bad_rank``."""
    print(text, flush=True)
    if ctx.rank == bad_rank:
        raise ValueError(f"planted failure on rank {bad_rank}")
    return ctx.rank
