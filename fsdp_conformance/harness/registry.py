"""Shared pools, one per (world size, backend, lane), reused across calls and tests in a
process.

Rule: ``get_pool(ws, backend, lane=)`` returns the live pool for that key, starting it on
first use; a lane is one thread of a run that executes cases side by side with others
(run/execute.py), each on pools of its own, so no pool is ever used by two threads.
``close_pools()`` (also run at interpreter exit) stops every pool; ``close_pools(kill=True)``
kills their ranks at once (an interrupted run, whose lanes may be inside a call). Under
torchrun (attach mode) the job's own ranks serve as the only pool, for the job's world size
(and the only lane).
"""
from __future__ import annotations

import atexit
import threading

from .pool import DEFAULT_TIMEOUT_S, RankPool, pick_backend

_pools: dict[tuple[int, str, int], RankPool] = {}
_lock = threading.Lock()


def get_pool(world_size: int, backend: str | None = None, *,
             timeout: float = DEFAULT_TIMEOUT_S, lane: int = 0) -> RankPool:
    from .attach import attached_pool

    attached = attached_pool()
    if attached is not None:
        if lane != 0:
            raise ValueError("attach mode has one pool: lane 0 only")
        if world_size != attached.world_size:
            raise ValueError(f"this torchrun job has world size {attached.world_size}; a pool "
                             f"of world size {world_size} is not available in attach mode")
        return attached
    key = (world_size, pick_backend(world_size, backend), lane)
    with _lock:
        pool = _pools.get(key)
        if pool is None or pool._closed:
            pool = RankPool(world_size, key[1], timeout=timeout)
            _pools[key] = pool
        pool.timeout = timeout
    return pool


def live_pools() -> list[RankPool]:
    return [p for p in _pools.values() if not p._closed]


def close_pools(*, kill: bool = False) -> None:
    """Stop every pool (``kill``: without asking the ranks to stop first; a call in flight on
    another thread then fails as a dead rank)."""
    with _lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close(kill=kill)


atexit.register(close_pools)
