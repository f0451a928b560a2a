"""What each API path must do at least: the floor its time is measured against (P13 and the
benchmarks).

Rule: a floor is the work no implementation of the path can avoid, expressed as raw
operations on the same bytes: the collective that moves the state between ranks (a full
dict needs every rank's shard in one place; a scatter from rank 0 must send each rank its
share) and one local copy of what the rank ends up holding. Each entry is a sequence of
``(kind, basis)``: ``kind`` one of ``timing.FLOOR_KINDS``; ``basis`` "full" (the bytes of
the whole optimizer tensor state) or "shard" (one rank's share of it: full / world size).
Each path's floor is its record's (``api_paths.ApiPath.floor``, from what it writes and
how its load spreads a full dict).
For a collective the bytes are its total over ranks; for a copy, what one rank copies.
Disk reads and writes are not in any floor: the timed call is the state-dict API itself
(the run reads and writes files outside the timed region).
"""
from __future__ import annotations

from typing import Sequence

from ..api_paths import PATH_NAMES, api_path

FULL, SHARD = "full", "shard"


def floor_ops(api: str, phase: str, state_bytes: int, world_size: int) -> list[tuple[str, int]]:
    """The floor of ``api``'s ``phase`` ("save" or "load") as ``[(kind, nbytes), ...]`` for a
    full tensor state of ``state_bytes`` on ``world_size`` ranks."""
    if api not in PATH_NAMES or phase not in ("save", "load"):
        raise KeyError(f"no floor for path {api!r} phase {phase!r}: paths with floors are "
                       f"{sorted(PATH_NAMES)}, phases 'save' and 'load'")
    ops: Sequence[tuple[str, str]] = api_path(api).floor(phase)
    shard = -(-state_bytes // world_size)
    return [(kind, state_bytes if basis == FULL else shard) for kind, basis in ops]


def describe(ops: Sequence[tuple[str, int]]) -> str:
    """``[("all_gather", 4194304), ("copy", 4194304)]`` -> "all_gather 4.19 MB + copy 4.19 MB"."""
    return " + ".join(f"{k} {n / 1e6:.3g} MB" for k, n in ops)
