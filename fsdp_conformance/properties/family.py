"""What a property needs of one FSDP family's reference (the record type; the two instances,
FSDP1's and FSDP2's, and their rules are in properties/families.py). A leaf module: the
properties written once (properties/sharding.py, saved.py, loaded.py, flatten.py) import it without
importing the observers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

View = Callable[[dict, Any, int], dict]
"""``(dict, layout, rank) -> the part of it that is compared``."""


@dataclass(frozen=True, kw_only=True)
class FamilyReference:
    """One FSDP family's reference, as the properties use it."""

    family: str
    """``"fsdp1"`` or ``"fsdp2"`` (``api_paths.FAMILIES``)."""
    gather_name: str
    """How a verdict names the gather (``"reference.gather_full"``)."""
    shard_name: str
    """How a verdict names the shard (``"reference.shard_full"``)."""
    gather: Callable[[Any, list], dict]
    """``gather(layout, every rank's local dict) -> the full dict``."""
    gather_replica: Callable[[Any, list, int], dict]
    """``gather_replica(layout, every rank's local dict, rank) ->`` the full dict of the
    rank's replica (FSDP1: ``layout.replicas()``, the replica's dicts put first; FSDP2: the
    gather of every rank's)."""
    replica_note: Callable[[Any, int], str]
    """What an error of ``gather_replica`` for a rank must add: which replica was put first
    ("" where none was)."""
    shard: Callable[[Any, dict, int], dict]
    """``shard(layout, full, rank) -> the rank's local dict``."""
    loaded_shard: Callable[[Any, dict, int, Any], dict]
    """``loaded_shard(layout, full, rank, exp)``: what a load of ``full`` leaves on ``rank``
    as this torch is expected to under ``exp`` (properties/expectation.py; module rules of
    properties/families.py)."""
    vs_reference: View
    """The part of a rank's dict compared with the reference's shard (module rules)."""
    vs_own: View
    """The part of a rank's dict compared with its own state before saving (module rules)."""
    owner: Callable[[Any], Callable[[str, Any], int]]
    """``owner(layout)(fqn, index) -> the rank owning that element`` (for diffs)."""
    layout_problems: Callable[[Any, dict], list]
    """``layout_problems(layout, one rank's observation) ->`` how the rank's layout differs
    from the reference's beyond the optimizer's keys (P0, properties/sharding.py)."""
    layout_size: Callable[[Any], str]
    """How a passing P0 names what it compared (``"3 unit(s)"``, ``"5 params"``)."""
    flatten_name: str
    """How a verdict names the flatten (``"reference.flatten_sharded"``)."""
    flatten: Callable[[Any, list, int], dict]
    """``flatten(layout, every rank's sharded dict in the reference's input form, rank) ->``
    the rank's flat local state (P4, properties/flatten.py): FSDP1 from the dicts of the
    rank's shard group, FSDP2 from the rank's own."""
    flat_view: View
    """The part of a rank's flat state P4 compares (module rules of properties/families.py)."""
