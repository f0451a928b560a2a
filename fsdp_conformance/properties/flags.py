"""P9, written once: a save flag changes only what it says. Every observer hands it what
it saw of the flags its path has (``FlagsSeen``: in order, one ``FlagSeen`` each): FSDP1's ``rank0_only``
(other ranks get ``{}``, rank 0 the all-ranks dict) and ``offload_to_cpu``
(``run_props.flags_seen``), FSDP2's ``cpu_offload`` (``fsdp2_run_props.flags_seen``):
tensors on the CPU, the same dict otherwise.

Rules
- A ``FlagSeen`` is a pair that must be equal (``want``, ``got``: bitwise), or a difference
  the observer found itself (``found``: a tensor left on a device, a non-empty dict), or why
  it cannot be seen (``problem``: the flagged save raised; the ranks' shards do not tile).
- The first ``problem``, in order, is the verdict. Otherwise every difference is reported,
  in order, a pair's as ``"<what>:\\n<diff>"``.
- Nothing checked (``checked`` empty) is n/a with the observer's reason; a pass names what
  was checked, and ``note`` (what the machine cannot show: an offload on CPU).
"""
from __future__ import annotations

from dataclasses import dataclass

from .statediff import diff_state_dicts, format_diff
from .verdict import Verdict, fail, na, passed


@dataclass(frozen=True, kw_only=True)
class FlagSeen:
    """One thing a save flag must leave as it was, or a difference already found."""

    what: str = ""
    """How a difference of the pair reads (``"rank 0: rank0_only=True differs from
    rank0_only=False"``)."""
    want: dict | None = None
    """The dict without the flag (or as the flag documents it)."""
    got: dict | None = None
    """The dict with the flag."""
    found: str = ""
    """A difference the observer saw itself ("" for none)."""
    problem: Verdict | None = None
    """Why the flagged save cannot be judged (module rules); None where it can."""


@dataclass(frozen=True, kw_only=True)
class FlagsSeen:
    """What one save showed of its flags."""

    seen: tuple[FlagSeen, ...] = ()
    """Every pair and difference, in order."""
    checked: tuple[str, ...] = ()
    """What could be checked, as a pass names it (``"rank0_only as documented"``)."""
    not_checked: str = ""
    """Why nothing could be checked (the n/a reason where ``checked`` is empty)."""
    note: str = ""
    """What a pass adds: what this machine cannot show ("" for nothing)."""


def p9_flags(flags: FlagsSeen) -> Verdict:
    """P9 of what a save showed of its flags (module rules)."""
    first = next((s.problem for s in flags.seen if s.problem is not None), None)
    if first is not None:
        return first
    problems = []
    for s in flags.seen:
        if s.found:
            problems.append(s.found)
            continue
        diffs = diff_state_dicts(s.want, s.got)
        if diffs:
            problems.append(f"{s.what}:\n" + format_diff(diffs))
    if problems:
        return fail("\n".join(problems))
    if not flags.checked:
        return na(flags.not_checked)
    return passed("; ".join([*flags.checked, *([flags.note] if flags.note else [])]))
