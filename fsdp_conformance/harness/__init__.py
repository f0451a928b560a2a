"""Persistent multi-process rank pools: spawned locally, or attached to a torchrun job."""
from .attach import AttachedPool, attach, in_torchrun
from .context import RankContext
from .errors import PoolClosed, RankDied, RankError, RankFailure, RankTimeout
from .pool import RankPool, pick_backend
from .registry import close_pools, get_pool, live_pools

__all__ = [
    "AttachedPool", "PoolClosed", "RankContext", "RankDied", "RankError", "RankFailure",
    "RankPool", "RankTimeout", "attach", "close_pools", "get_pool", "in_torchrun",
    "live_pools", "pick_backend",
]
