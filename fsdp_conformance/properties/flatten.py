"""P4, written once: a sharded save's dicts, flattened by the reference, are every rank's
flat local state (bitwise). Every observer (the conformance run's sharded FSDP1 paths, the
FSDP1 differential observer's ShardedTensor and DTensor dicts, the FSDP2 differential
observer's DTensor dicts) hands it the family's reference (properties/families.py) and one
``ShardedRank`` per rank, in rank order.

Rules
- A rank's expected flat state is the family's flatten of the ranks' sharded dicts
  (``FamilyReference.flatten``: FSDP1 from the rank's shard group, since one rank's flat
  shard needs rows other ranks hold; FSDP2 from the rank's own). It must equal the rank's
  flat state and, where torch flattened the dicts itself
  (``flatten_sharded_optim_state_dict``, ``optim_state_dict_to_load``), torch's result, in
  the family's ``flat_view`` (FSDP1 leaves out ignored params: FSDP does not synchronise
  them).
- Where the observer read torch's sharded values with the reference (``to_pieces`` of a live
  DTensor), every disagreement with torch's own metadata (global offset, placements, local
  shape) is a difference too.
- A rank without a sharded dict makes the verdict its ``problem`` (the first rank's, in rank
  order): an error where torch raised. Torch's own flatten that raised is an error, one that
  did not run is not compared. The reference refusing the dicts (``StateDictMismatch``) is
  an error, or a failure showing both where the reference's reading of the dicts already
  disagreed with torch's metadata (``read_problems``, which explain the refusal). Otherwise every difference of every rank is
  reported together.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .. import reference as ref
from .family import FamilyReference
from .statediff import diff_state_dicts, format_diff
from .verdict import Verdict, error, fail, passed


@dataclass(frozen=True, kw_only=True)
class ShardedRank:
    """What one rank showed of a sharded save, as P4 judges it."""

    rank: int
    """The rank (``ShardedRank`` lists are in rank order: index == rank)."""
    sharded: dict | None = None
    """The rank's sharded dict in the reference's input form (reference/flatten.py: pieces);
    None when there is none (``problem`` says why)."""
    problem: Verdict | None = None
    """Why the rank's sharded dict cannot be judged: "error" (torch raised), "fail" (it is
    not in the form the path promises), "n/a" (the path did not run)."""
    flat: dict | None = None
    """The rank's flat local state the flatten must give."""
    torch_flat: dict | None = None
    """Torch's own flatten of the dicts on this rank; None where not observed."""
    torch_label: str = ""
    """How a verdict names torch's flatten (``"flatten_sharded_optim_state_dict"``)."""
    torch_problem: Verdict | None = None
    """Why there is no ``torch_flat``: "error" (it raised) or "n/a" (it did not run)."""
    read_problems: tuple[str, ...] = ()
    """How the reference's reading of the rank's sharded values disagrees with torch's own
    metadata (module rules)."""


def p4_flatten(family: FamilyReference, layout, ranks: Sequence[ShardedRank]) -> Verdict:
    """P4 of ``ranks`` at ``layout`` (module rules)."""
    first = next((s.problem for s in ranks if s.problem is not None), None)
    if first is not None:
        return first
    dicts = [s.sharded for s in ranks]
    owner = family.owner(layout)
    read = [f"rank {s.rank}: {x}" for s in ranks for x in s.read_problems]
    problems = list(read)
    for s in ranks:
        r = s.rank
        try:
            want = family.flat_view(family.flatten(layout, dicts, r), layout, r)
        except ref.StateDictMismatch as exc:
            rejected = f"{family.flatten_name} rejected torch's sharded dicts: {exc}"
            if read:  # the reading explains the refusal: a failure, with every difference
                return fail("\n\n".join(["\n".join(read), *problems[len(read):], rejected]))
            return error(rejected)
        diffs = diff_state_dicts(want, family.flat_view(s.flat, layout, r), owner=owner)
        if diffs:
            problems.append(f"rank {r}: flat local state differs from {family.flatten_name}:\n"
                            + format_diff(diffs))
        if s.torch_problem is not None:
            if s.torch_problem.status == "error":
                return s.torch_problem
            continue
        if s.torch_flat is not None:
            diffs = diff_state_dicts(want, family.flat_view(s.torch_flat, layout, r), owner=owner)
            if diffs:
                problems.append(f"rank {r}: {s.torch_label} differs from "
                                f"{family.flatten_name}:\n" + format_diff(diffs))
    return fail("\n\n".join(problems)) if problems else passed("bitwise on every rank")
