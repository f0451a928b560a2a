"""``run --shard I/N``: one of N parts of a selection, for a CI job matrix; ``merge`` puts
the parts' reports back together (report/merge.py).

Rules
- The parts are a function of the selected case ids alone (never of the machine, the clock
  or the order the tier lists them in), so N jobs on N machines agree on who runs what, and
  every case is in exactly one part.
- Cases that share a save (run/saves.py ``by_save``) stay in one part, where one save
  serves them; the bounds cases of one API path stay in one part, where the path's
  world-size scaling is fitted over all of them (bounds/rules.py).
- Groups go to parts by their estimated cost, largest first, each to the part with the
  least so far (ties to the lowest index): a case costs 1, a bounds case ``BOUNDS_COST``
  (it runs alone and is measured several times).
- A part that would be empty (fewer groups than parts) is a usage error naming the counts.
"""
from __future__ import annotations

import re
from typing import Sequence

from ..cases import Case
from .saves import by_save

BOUNDS_COST = 8
"""What a bounds case costs against one ordinary case (it runs alone, measured several
times). From the quick tier on 2 cores (2026-11-29): its 792 other cases took 128 s
(0.16 s each) and its 840 with the 48 bounds cases 193 s, so about 1.35 s a bounds case,
8.4 times one other; only the parts' balance depends on it, never a verdict."""

_SPEC = re.compile(r"^\s*([1-9][0-9]*)\s*/\s*([1-9][0-9]*)\s*$")


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/4"`` -> ``(2, 4)`` (1-based part of N); ValueError naming the text otherwise."""
    m = _SPEC.match(str(text))
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"--shard is written I/N with 1 <= I <= N, e.g. 2/4; got {text!r}")
    return int(m.group(1)), int(m.group(2))


def _groups(cases: Sequence[Case]) -> list[list[Case]]:
    plain = [(i, c) for i, c in enumerate(cases) if not c.bounds]
    out = [[c for _, c in g] for g in by_save(plain)]
    bounds: dict[str, list[Case]] = {}
    for c in cases:
        if c.bounds:
            bounds.setdefault(c.api, []).append(c)
    return out + list(bounds.values())


def split(cases: Sequence[Case], count: int) -> list[list[Case]]:
    """The ``count`` parts of ``cases`` (module rules), each in the order ``cases`` gives."""
    groups = sorted(_groups(cases), key=lambda g: min(c.id for c in g))
    if len(groups) < count:
        raise ValueError(f"{len(cases)} case(s) in {len(groups)} group(s) that share a save "
                         f"cannot fill {count} parts: use at most {len(groups)}")
    cost = [sum(BOUNDS_COST if c.bounds else 1 for c in g) for g in groups]
    load = [0] * count
    part_of: dict[str, int] = {}
    for k in sorted(range(len(groups)), key=lambda k: (-cost[k], min(c.id for c in groups[k]))):
        p = min(range(count), key=lambda j: (load[j], j))
        load[p] += cost[k]
        for c in groups[k]:
            part_of[c.id] = p
    return [[c for c in cases if part_of[c.id] == p] for p in range(count)]


def shard(cases: Sequence[Case], index: int, count: int) -> list[Case]:
    """Part ``index`` (1-based) of ``count`` of ``cases`` (module rules)."""
    return split(cases, count)[index - 1]
