"""P1, written once: what a save returns is the reference's gather of every rank's local
state, as this torch is expected to save it (bitwise). Every observer (the conformance run's
paths of either family, the differential tests that call several save paths on one pool)
hands it the family's reference (properties/families.py), the ranks' local dicts and one
``SavedDict`` per (save path, rank) that returned one.

Rules
- A rank's expected dict is the family's gather of the local dicts of the rank's replica
  (``FamilyReference.gather_replica``: every rank, an FSDP1 HYBRID_SHARD shard group, a
  NO_SHARD rank's own), passed through the modelled save (properties/expectation.py). Params
  of ignored modules are not synchronised by FSDP: where the ``SavedDict`` carries the
  rank's ``own`` local dict, their state is that rank's own; else the gather's (rank 0's).
  Whether the replicas agree is not P1's question: the single-process run's (P2).
- A save that returns the full dict on rank 0 only (``rank0_only``) must return ``{}``
  elsewhere; a flattened dict (``flatten_optimizer_state_dict``) is compared with the
  flattened form of the expected one.
- A save that raised is an error, one that did not run is not checked; the differences of
  every (save, rank) are reported together, and a save that raised beside a difference
  elsewhere makes the verdict a failure that shows both. Nothing compared is "n/a".
- The reference refusing the local dicts (``StateDictMismatch``) is an error.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .. import reference as ref
from .expectation import EXACT, Expectation
from .family import FamilyReference
from .statediff import diff_state_dicts, format_diff
from .verdict import Findings, Verdict, error


@dataclass(frozen=True, kw_only=True)
class SavedDict:
    """What one save path returned on one rank, with how P1 compares it."""

    rank: int = 0
    """The rank it returned on."""
    label: str = ""
    """The save path (a run path's name, or the differential observer's path)."""
    got: dict | None = None
    """The dict it returned (neutral named form); None when it raised or did not run."""
    problem: Verdict | None = None
    """Why there is no dict: "error" (it raised) or "n/a" (it did not run)."""
    own: dict | None = None
    """The rank's own local dict: the state its ignored params must carry (module rules);
    None where the dict is rank 0's (a run path's full dict)."""
    rank0_only: bool = False
    """The save returns the full dict on rank 0 only: ``{}`` on every other rank."""
    flattened: bool = False
    """The dict is in the flattened form (``"state.<fqn>.<name>"`` keys)."""


def flatten_keys(full: Mapping) -> dict:
    """The flattened form of a full FQN-keyed dict (``_flatten_optim_state_dict``'s rule):
    ``"state.<fqn>.<name>"`` for every state value (nested dicts joined by dots) and
    ``"param_groups.<fqn>.<key>"`` for every hyperparameter of the group holding ``fqn``."""
    out: dict[str, Any] = {}

    def put(prefix: str, v: Any) -> None:
        if isinstance(v, Mapping):
            for k, x in v.items():
                put(f"{prefix}.{k}", x)
        else:
            out[prefix] = v

    for fqn, st in full.get("state", {}).items():
        put(f"state.{fqn}", st)
    for g in full.get("param_groups", []):
        for fqn in g["params"]:
            for k, v in g.items():
                if k != "params":
                    out[f"param_groups.{fqn}.{k}"] = v
    return out


def _with_own_plain(want: dict, local: dict, layout) -> dict:
    """``want`` with the ignored params' state replaced by the rank's own (``local``)."""
    state = dict(want["state"])
    for slot in layout.plain_params:
        own = local["state"].get(slot.fqn)
        if own is not None:
            state[slot.fqn] = own
        else:
            state.pop(slot.fqn, None)
    return {**want, "state": state}


def p1_saved(family: FamilyReference, layout, local_dicts: Sequence[dict],
             saves: Sequence[SavedDict], *, exp: Expectation = EXACT) -> Verdict:
    """P1 of ``saves`` against ``family``'s gather of ``local_dicts`` (one per rank, in rank
    order) at ``layout`` (module rules)."""
    wants: dict[int, dict] = {}
    found = Findings()
    owner = family.owner(layout)
    for s in saves:
        r = s.rank
        if s.problem is not None:
            found.skipped(s.problem)
            continue
        where = f"{s.label} on rank {r}" if s.label else f"rank {r}"
        found.compared.add((s.label, r))
        if s.rank0_only and r != 0:
            if s.got != {}:
                found.problems.append(f"{where} (rank 0 only) is not empty: {sorted(s.got)[:5]}")
            continue
        if r not in wants:
            try:
                wants[r] = exp.saved(family.gather_replica(layout, local_dicts, r))
            except ref.StateDictMismatch as exc:
                return error(f"{family.gather_name} rejected torch's local dicts"
                             f"{family.replica_note(layout, r)}: {exc}")
        want = wants[r] if s.own is None else _with_own_plain(wants[r], s.own, layout)
        if s.flattened:
            want = flatten_keys(want)
        diffs = diff_state_dicts(want, s.got, owner=owner)
        if diffs:
            found.problems.append(f"{where} differs from {family.gather_name}:\n"
                                  + format_diff(diffs))
    n = len(next(iter(wants.values()))["state"]) if wants else 0
    return found.verdict(f"{n} params bitwise equal on {found.ranks()} rank(s)", "no save ran")
