"""P3, written once: every rank's optimizer state after a load equals the reference's shard
of what it loaded, and, where the load is at the save's world size and plan, the rank's own
state before saving. Every observer (the conformance run's paths of either family, a user's
own path, the differential tests that call several load paths on one pool) hands it the
family's reference (properties/families.py) and one ``LoadedState`` per (load, rank).

Rules
- A load that raised is an error and one that did not run is not checked. Every other
  (load, rank) is compared; the differences of all of them are reported together, and a load
  that raised beside a difference elsewhere makes the verdict a failure that shows both (a
  second bug never hides behind a first error).
- No load compared (none ran, none raised) is "n/a", with the reason the first load gave; a
  check of the reference alone does not count as one.
- A ``LoadedState`` with no state (``got`` None), a ``source`` and an ``own`` state checks
  the reference itself: its shard of ``source`` (no load involved) against the rank's own
  state (the differential tests, where the full dict came from the same ranks' state).
- The reference refusing a dict (``StateDictMismatch``) is an error that names the rank.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .. import reference as ref
from .expectation import EXACT, Expectation
from ..sut.records import error_of
from .family import FamilyReference
from .statediff import diff_state_dicts, format_diff
from .verdict import Findings, Verdict, error


@dataclass(frozen=True, kw_only=True)
class LoadedState:
    """One rank's state after one load, with what P3 compares it to."""

    rank: int
    """The rank that holds it."""
    label: str = ""
    """The load path, where one observer judges several ("" for the case's own path)."""
    got: dict | None = None
    """The rank's optimizer state after the load (its ``optim.state_dict()``, neutral
    named form); None when the load raised or did not run (``problem``), or for a check of
    the reference alone (module rules)."""
    problem: Verdict | None = None
    """Why there is no state: "error" (the load raised) or "n/a" (it did not run)."""
    source: dict | None = None
    """The full dict the load read: compared through the reference's shard of it."""
    own: dict | None = None
    """The rank's own state before saving, where the load is at the save's world size and
    plan (as a correct load would give it back): compared too."""


def _where(s: LoadedState) -> str:
    return f"{s.label} on rank {s.rank}" if s.label else f"rank {s.rank} after loading"


def p3_loaded(family: FamilyReference, layout, states: Sequence[LoadedState], *,
              exp: Expectation = EXACT) -> Verdict:
    """P3 of ``states`` against ``family``'s reference at ``layout``, as this torch is
    expected to load under ``exp`` (module rules)."""
    found = Findings()
    owner = family.owner(layout)
    for s in states:
        r = s.rank
        if s.problem is not None:
            found.skipped(s.problem)
            continue
        got = s.got
        if s.source is not None:
            try:
                if got is None:  # the reference alone (module rules)
                    got = family.shard(layout, s.source, r)
                else:
                    want = family.loaded_shard(layout, s.source, r, exp)
                    diffs = diff_state_dicts(family.vs_reference(want, layout, r),
                                             family.vs_reference(got, layout, r), owner=owner)
                    found.compared.add((s.label, r))
                    if diffs:
                        found.problems.append(f"{_where(s)} differs from {family.shard_name}:\n"
                                              + format_diff(diffs))
            except ref.StateDictMismatch as exc:
                return error(f"{family.shard_name} rejected the saved dict for rank {r}: {exc}")
        if s.own is not None and got is not None:
            diffs = diff_state_dicts(family.vs_own(s.own, layout, r),
                                     family.vs_own(got, layout, r), owner=owner)
            if s.got is not None:
                found.compared.add((s.label, r))
            if diffs:
                what = _where(s) if s.got is not None else \
                    f"{family.shard_name}(full) on rank {r}"
                found.problems.append(f"{what} differs from the rank's own state before "
                                      f"saving:\n" + format_diff(diffs))
    own = ("; equal to each rank's own state before saving"
           if any(s.own is not None and s.got is not None for s in states) else "")
    return found.verdict(f"{len(found.compared)} (load, rank) state(s) bitwise equal on "
                         f"{found.ranks()} rank(s){own}", "no load ran")


def own_expected(family: FamilyReference, layout, own: Sequence, rank: int,
                 exp: Expectation = EXACT) -> dict:
    """What ``rank`` should hold after loading what it saved (same world size and plan;
    ``own``: the save side's records, one per rank): its own state before the save; under a
    modelled bug (properties/expectation.py) the ranks' states are gathered by the reference,
    passed through the model and sharded again, since a bug's effect is stated on full
    dicts."""
    if not exp.key:
        return own[rank].local
    exp = exp.on_rank(rank)
    full = exp.round_trip(family.gather(layout, [o.local for o in own]))
    return family.shard(layout, exp.shards_from(full), rank)


def run_states(family: FamilyReference, layout, full: dict, load_obs: Sequence,
               own: Sequence | None = None, exp: Expectation = EXACT,
               per_rank: dict[int, dict] | None = None) -> list[LoadedState]:
    """The ``LoadedState`` of every rank of a round trip's load side (``load_obs``:
    ``sut.records.LoadRecord`` per rank) that loaded ``full``; ``own``: the save side's
    records where the load is at the save's world size and plan; ``per_rank``: where the
    ranks read different files, the full dict each rank's files make (``Saved.per_rank``)."""
    out = []
    for o in load_obs:
        e = error_of(o.loaded)
        if e:
            out.append(LoadedState(rank=o.rank, problem=error(
                f"torch raised while loading on rank {o.rank}:\n{e}")))
            continue
        mine = None
        if own is not None:
            mine = own_expected(family, layout, own, o.rank, exp)
        source = full if per_rank is None else per_rank.get(o.rank, full)
        out.append(LoadedState(rank=o.rank, got=o.loaded, source=source, own=mine))
    return out
