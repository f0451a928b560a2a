"""Shared pools, one per (world size, backend), reused across calls and tests in a process.

Rule: ``get_pool(ws, backend)`` returns the live pool for that key, starting it on first use;
``close_pools()`` (also run at interpreter exit) stops every pool. Under torchrun (attach
mode) the job's own ranks serve as the only pool, for the job's world size.
"""
from __future__ import annotations

import atexit
import threading

from .pool import DEFAULT_TIMEOUT_S, RankPool, pick_backend

_pools: dict[tuple[int, str], RankPool] = {}
_lock = threading.Lock()


def get_pool(world_size: int, backend: str | None = None, *,
             timeout: float = DEFAULT_TIMEOUT_S) -> RankPool:
    from .attach import attached_pool

    attached = attached_pool()
    if attached is not None:
        if world_size != attached.world_size:
            raise ValueError(f"this torchrun job has world size {attached.world_size}; a pool "
                             f"of world size {world_size} is not available in attach mode")
        return attached
    key = (world_size, pick_backend(world_size, backend))
    with _lock:
        pool = _pools.get(key)
        if pool is None or pool._closed:
            pool = RankPool(world_size, key[1], timeout=timeout)
            _pools[key] = pool
        pool.timeout = timeout
    return pool


def live_pools() -> list[RankPool]:
    return [p for p in _pools.values() if not p._closed]


def close_pools() -> None:
    with _lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()


atexit.register(close_pools)
