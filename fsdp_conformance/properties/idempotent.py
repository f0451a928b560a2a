"""P7, written once: save -> load -> save changes nothing. Every observer hands it the pairs
of states that idempotence says are one, each named by how a difference reads: the
conformance run's paths, what a path saves again right after loading against what it
saved (``run_props.resaved_pairs``); a user's own save/load functions, whose files are
theirs, the optimizer's state around each call (``user/own_code.py``).

Rules
- Every pair is compared bitwise (``statediff``); every difference of every pair is
  reported, in order, each as ``"<what>:\\n<diff>"``, together with what the observer found
  raised where a pair should have been (``raised``: a failure, since a path that cannot
  save again is not idempotent).
- A pair that cannot be had (``problem``: the re-save raised, the shards do not tile) makes
  the verdict that problem, the first in order.
- Nothing compared and nothing raised is a pass saying ``summary``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .statediff import diff_state_dicts, format_diff
from .verdict import Verdict, fail, passed


@dataclass(frozen=True, kw_only=True)
class SameState:
    """Two states that save -> load -> save says are one."""

    what: str = ""
    """How a difference reads (``"saving again right after loading gives a different
    dict"``, ``"rank 1: loading the same checkpoint twice gives different states"``)."""
    want: dict | None = None
    """The state before (what was saved, the state before the call)."""
    got: dict | None = None
    """The state after (what is saved again, the state after the call)."""
    problem: Verdict | None = None
    """Why the pair cannot be had (module rules); None where it can."""


def p7_idempotent(pairs: Sequence[SameState], *, raised: Sequence[str] = (),
                  summary: str = "bitwise the same") -> Verdict:
    """P7 of ``pairs`` (module rules)."""
    first = next((p.problem for p in pairs if p.problem is not None), None)
    if first is not None:
        return first
    problems = []
    for p in pairs:
        diffs = diff_state_dicts(p.want, p.got)
        if diffs:
            problems.append(f"{p.what}:\n" + format_diff(diffs))
    problems += raised
    return fail("\n\n".join(problems)) if problems else passed(summary)
