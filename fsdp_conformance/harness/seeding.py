"""Seeding rule: every call seeds python, numpy and torch (CPU and CUDA) on every rank with
the seed the caller gives, before the function runs. The same call with the same seed gives
the same bits. Ranks get the same seed (FSDP expects identical initialisation on every
rank); a function that wants per-rank randomness derives it from ``ctx.seed`` and ``ctx.rank``."""
from __future__ import annotations

import functools
import random


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    seed_torch(seed)


@functools.cache
def _accelerator_available() -> bool:
    import torch

    acc = getattr(torch, "accelerator", None)  # torch >= 2.6
    return bool(acc.is_available() if acc is not None else torch.cuda.is_available())


def seed_torch(seed: int) -> None:
    """``torch.manual_seed(seed)`` where this process can see an accelerator (it seeds
    every device, or queues the seed for a device not yet initialised); else the CPU
    generator alone, which is all ``torch.manual_seed`` seeds there: its queuing for CUDA,
    XPU and MTIA records the caller's stack each time (``traceback.format_stack``), 0.3 ms
    a call at the depth a rank's calls run, for seeds no device will ever take."""
    import torch

    if _accelerator_available():
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)


def rank_seed(seed: int, rank: int) -> int:
    """A per-rank seed derived deterministically from a call seed."""
    return (seed * 1_000_003 + rank * 7919 + 1) % (2**63)
