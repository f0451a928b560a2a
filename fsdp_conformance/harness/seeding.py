"""Seeding rule: every call seeds python, numpy and torch (CPU and CUDA) on every rank with
the seed the caller gives, before the function runs. The same call with the same seed gives
the same bits. Ranks get the same seed (FSDP expects identical initialisation on every
rank); a function that wants per-rank randomness derives it from ``ctx.seed`` and ``ctx.rank``."""
from __future__ import annotations

import random


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)  # also seeds every CUDA device


def rank_seed(seed: int, rank: int) -> int:
    """A per-rank seed derived deterministically from a call seed."""
    return (seed * 1_000_003 + rank * 7919 + 1) % (2**63)
