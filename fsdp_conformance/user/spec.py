"""What a user round trip is made of, as plain data (no torch, no pytest): the default paths
and world-size pairs per tier, the property names failure messages print, world-size specs
("2", "2->3", (2, 3)) and their test ids, and the tier of the running pytest session.

Imported by the pytest plugin while it loads and collects: it must stay free of torch.
"""
from __future__ import annotations
from ..properties.catalogue import CATALOGUE

# Built-in paths fsdp_roundtrip runs by default, per tier (FSDP1's current API first).
DEFAULT_PATHS = {"quick": ("fsdp1.full", "fsdp1.sharded"), "full": None}  # None: FSDP1_PATHS
# (save world size, load world size) pairs by default, per tier: same size, and a reshard
# onto an odd size (uneven shards, padding).
DEFAULT_PAIRS = {"quick": ((2, 2), (2, 3)),
                 "full": tuple((n, m) for n in (1, 2, 3, 4) for m in (1, 2, 3, 4))}
# the property catalogue's short names (properties/catalogue.py), shown in failure messages
PROPERTY_NAMES = {p.id: p.name for p in CATALOGUE}
TIERS = ("quick", "full")
# The tier of the running pytest session (set by the plugin, read by
# ``strategies.fsdp_settings``); None: no session.
ACTIVE = {"tier": None}


def world_size_pair(spec) -> tuple[int, int]:
    """``2`` -> (2, 2); ``(2, 3)``, ``"2->3"``, ``"2"`` -> pairs."""
    if isinstance(spec, int):
        pair = (spec, spec)
    elif isinstance(spec, str):
        a, _, b = spec.partition("->")
        pair = (int(a), int(b or a))
    else:
        a, b = spec
        pair = (int(a), int(b))
    if min(pair) < 1:
        raise ValueError(f"world sizes must be >= 1, got {spec!r}")
    return pair


def pair_id(pair: tuple[int, int]) -> str:
    """The test id of a (save, load) world-size pair: ``ws2``, ``ws2->3``."""
    n, m = pair
    return f"ws{n}" if n == m else f"ws{n}->{m}"
