"""What each API path must do at least: the floor its time is measured against (P13 and the
benchmarks).

Rule: a floor is the work no implementation of the path can avoid, expressed as raw
operations on the same bytes: the collective that moves the state between ranks (a full
dict needs every rank's shard in one place; a scatter from rank 0 must send each rank its
share) and one local copy of what the rank ends up holding. Each entry is a sequence of
``(kind, basis)``: ``kind`` one of ``timing.FLOOR_KINDS``; ``basis`` "full" (the bytes of
the whole optimizer tensor state) or "shard" (one rank's share of it: full / world size).
For a collective the bytes are its total over ranks; for a copy, what one rank copies.
Disk reads and writes are not in any floor: the timed call is the state-dict API itself
(the run reads and writes files outside the timed region).
"""
from __future__ import annotations

from typing import Sequence

FULL, SHARD = "full", "shard"

# (api, phase) -> floor operations.
FLOORS: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {
    # Full dicts: every unit's state is all-gathered (FSDP1 gathers on every rank, then
    # keeps it on rank 0), and rank 0 ends up holding a copy of all of it.
    ("fsdp1.legacy_full", "save"): (("all_gather", FULL), ("copy", FULL)),
    ("fsdp1.legacy_scatter", "save"): (("all_gather", FULL), ("copy", FULL)),
    ("fsdp1.full", "save"): (("all_gather", FULL), ("copy", FULL)),
    ("fsdp1.rekey", "save"): (("all_gather", FULL), ("copy", FULL)),
    ("fsdp1.dsd_full", "save"): (("all_gather", FULL), ("copy", FULL)),
    ("fsdp2.full", "save"): (("all_gather", FULL), ("copy", FULL)),
    # Sharded dicts: each rank wraps its own shard; no state crosses ranks.
    ("fsdp1.legacy_sharded", "save"): (("copy", SHARD),),
    ("fsdp1.sharded", "save"): (("copy", SHARD),),
    ("fsdp1.dsd_sharded", "save"): (("copy", SHARD),),
    ("fsdp2.sharded", "save"): (("copy", SHARD),),
    # Loads from a full dict every rank holds: each rank keeps its slice.
    ("fsdp1.legacy_full", "load"): (("copy", SHARD),),
    ("fsdp1.full", "load"): (("copy", SHARD),),
    ("fsdp1.rekey", "load"): (("copy", SHARD),),
    ("fsdp1.dsd_full", "load"): (("copy", SHARD),),
    # Only rank 0 holds the full dict: it must send every rank its share.
    ("fsdp1.legacy_scatter", "load"): (("scatter", FULL), ("copy", SHARD)),
    ("fsdp2.full", "load"): (("broadcast", FULL), ("copy", SHARD)),
    # Loads of sharded dicts: each rank copies in its own shard.
    ("fsdp1.legacy_sharded", "load"): (("copy", SHARD),),
    ("fsdp1.sharded", "load"): (("copy", SHARD),),
    ("fsdp1.dsd_sharded", "load"): (("copy", SHARD),),
    ("fsdp2.sharded", "load"): (("copy", SHARD),),
}


def floor_ops(api: str, phase: str, state_bytes: int, world_size: int) -> list[tuple[str, int]]:
    """The floor of ``api``'s ``phase`` ("save" or "load") as ``[(kind, nbytes), ...]`` for a
    full tensor state of ``state_bytes`` on ``world_size`` ranks."""
    try:
        ops: Sequence[tuple[str, str]] = FLOORS[(api, phase)]
    except KeyError:
        known = sorted({a for a, _ in FLOORS})
        raise KeyError(f"no floor for path {api!r} phase {phase!r}: paths with floors are "
                       f"{known}, phases 'save' and 'load'") from None
    shard = -(-state_bytes // world_size)
    return [(kind, state_bytes if basis == FULL else shard) for kind, basis in ops]


def describe(ops: Sequence[tuple[str, int]]) -> str:
    """``[("all_gather", 4194304), ("copy", 4194304)]`` -> "all_gather 4.19 MB + copy 4.19 MB"."""
    return " + ".join(f"{k} {n / 1e6:.3g} MB" for k, n in ops)
