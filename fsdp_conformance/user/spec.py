"""What a user round trip is made of, as plain data (no torch, no pytest): the default paths
and world-size pairs per tier, the property names failure messages print, world-size specs
("2", "2->3", (2, 3)) and their test ids, and the tier of the running pytest session.

Imported by the pytest plugin while it loads and collects: it must stay free of torch.
"""
from __future__ import annotations
from ..properties.catalogue import CATALOGUE
from ..api_paths import PATHS

# Built-in paths fsdp_roundtrip runs by default, per FSDP version and tier: the quick tier
# the family's primary paths (ApiPath.primary), the full tier every path of that version
# (None).
DEFAULT_PATHS = {(v, tier): (tuple(p.name for p in PATHS if p.primary and p.family == f"fsdp{v}")
                             if tier == "quick" else None)
                 for v in (1, 2) for tier in ("quick", "full")}
FSDP_VERSIONS = (1, 2)
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


# HSDP meshes in world-size specs ("2x2": 2 replicas x 2 shards): the shard group size the
# harness builds (sut/fsdp2.py ``shard_group_size``, FSDP1's HYBRID_SHARD groups).
HSDP_SHARD = 2


def _side(text: str, spec) -> tuple[int, bool]:
    """One side of a spec: ``"3"`` -> (3, False); ``"2x2"`` -> (4, True)."""
    r, x, s = text.strip().partition("x")
    try:
        n = int(r) * (int(s) if x else 1)
    except ValueError:
        raise ValueError(f"world sizes are written N or RxS (HSDP: R replicas x S shards), "
                         f"as '2', '2->3', '2x2->2'; got {spec!r}") from None
    if x and int(s) != HSDP_SHARD:
        raise ValueError(f"{spec!r}: an HSDP mesh here shards over {HSDP_SHARD} ranks (RxS "
                         f"with S = {HSDP_SHARD}); got S = {s}")
    return n, bool(x)


def parse_sizes(spec) -> tuple[int, int, bool]:
    """``(save world size, load world size, hsdp)`` of a spec: ``2``, ``(2, 3)``, ``"2->3"``,
    ``"2x2->2"`` (an HSDP side: R replicas x ``HSDP_SHARD``). With an HSDP side, both sides
    are built as HSDP (HYBRID_SHARD): a 1-D side must then be one shard group (odd, or
    ``HSDP_SHARD``), else ValueError saying how it would be built."""
    if isinstance(spec, int):
        (n, hn), (m, hm) = (spec, False), (spec, False)
    elif isinstance(spec, str):
        a, _, b = spec.partition("->")
        (n, hn), (m, hm) = _side(a, spec), _side(b or a, spec)
    else:
        a, b = spec
        (n, hn), (m, hm) = (int(a), False), (int(b), False)
    if min(n, m) < 1:
        raise ValueError(f"world sizes must be >= 1, got {spec!r}")
    hsdp = hn or hm
    for size, is_hsdp in ((n, hn), (m, hm)):
        if hsdp and not is_hsdp and size % 2 == 0 and size != HSDP_SHARD:
            raise ValueError(
                f"{spec!r}: next to an HSDP side, a 1-D size {size} would be built as "
                f"{size // HSDP_SHARD}x{HSDP_SHARD} too (both sides share the case's "
                f"strategy): write it as {size // HSDP_SHARD}x{HSDP_SHARD}, or use "
                f"{HSDP_SHARD} or an odd size")
    return n, m, hsdp


def world_size_pair(spec) -> tuple[int, int]:
    """``2`` -> (2, 2); ``(2, 3)``, ``"2->3"``, ``"2"`` -> pairs; ``"2x2->2"`` -> (4, 2)."""
    n, m, _ = parse_sizes(spec)
    return n, m


def pair_text(pair: tuple[int, int]) -> str:
    """A (save, load) world-size pair as a spec writes it: ``(2, 2)`` -> ``"2"``, ``(2, 3)``
    -> ``"2->3"``."""
    n, m = pair
    return str(n) if n == m else f"{n}->{m}"


def pair_id(pair: tuple[int, int]) -> str:
    """The test id of a (save, load) world-size pair: ``ws2``, ``ws2to3``: characters
    pytest's ``-k`` accepts (its expressions refuse ``>``), so ``pytest -k ws2to3`` selects
    the resizing test. Case ids keep ``ws2->3``."""
    return "ws" + pair_text(pair).replace("->", "to")


def size_id(spec) -> str:
    """A test id for a world-size spec that pytest's ``-k`` can select: ``"2"`` -> ``ws2``,
    ``"2->3"`` -> ``ws2to3``, ``"2x2->2"`` -> ``ws2x2to2``, ``(2, 3)`` -> ``ws2to3``
    (``@pytest.mark.parametrize("sizes", ["2", "2->3"], ids=size_id)``: pytest's own id of
    ``"2->3"`` holds ``>``, which ``-k`` refuses). A malformed spec is parse_sizes's
    ValueError."""
    parse_sizes(spec)  # refuse what is not a spec, naming it
    if isinstance(spec, str):
        return "ws" + spec.replace(" ", "").replace("->", "to")
    return pair_id(world_size_pair(spec))

