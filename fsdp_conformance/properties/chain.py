"""A chain of checkpoints (``Case.links``): what a resume must restore is judged at every
checkpoint of a run that is saved, resumed, saved again and resumed again, as a trainer that
checkpoints every N steps is, not only at the first.

Rules
- Checkpoint n+1 is saved by what resumed from checkpoint n (its load side, after the resumed
  training, through the same path or the user's same save function) and is a round trip of
  its own (``Case.next_link``): loaded at the world size and plan the chain started from,
  trained on, and judged by the one round trip (properties/roundtrip.py) with the view of
  its kind.
- A later checkpoint decides what a resume must restore: P3 (the load restores what that
  save wrote, the weights too where the user's load restores them), P6 (the resumed
  training against the continuation of the state at that save, so a modelled or failing
  first link does not make the later ones fail again) and P11 (param groups, step and
  scheduler). The first checkpoint decides every other property.
- A later checkpoint's verdict is folded into the first's (``fold``): a failure or an error
  at a later checkpoint makes the property fail (or err) with the checkpoint named; a
  failure at the first keeps its own text and gains the later one's; a pass says the later
  checkpoints held too. Under a modelled torch bug every checkpoint is judged against the
  model, so a known limitation must explain every checkpoint of the chain.
- A checkpoint's directory is the ``NEXT_DIR`` under the one before it (one per link).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..cases import Case
from .verdict import Verdict, passed

LINKED: tuple[str, ...] = ("P3", "P6", "P11")
"""The properties a later checkpoint of a chain decides (module rules)."""

LATER_LINK = ("judged at the chain's first checkpoint (a later checkpoint decides what a "
              "resume must restore: P3, P6, P11)")
"""Why a later checkpoint's round trip leaves the other properties undecided."""

NEXT_DIR = "next-checkpoint"
"""The directory of a chain's next checkpoint, under the one before it."""


def next_dir(workdir: Path | str) -> Path:
    """Where the checkpoint after the one in ``workdir`` is written."""
    return Path(workdir) / NEXT_DIR


def number(first: Case, link: Case) -> int:
    """Which checkpoint of ``first``'s chain ``link`` is (the first is 1)."""
    return first.links - link.links + 1


def where(first: Case, link: Case) -> str:
    """A later checkpoint as a verdict names it."""
    return (f"checkpoint {number(first, link)} of the chain (saved at step {link.steps} on "
            f"{link.world_size} rank{'s' if link.world_size != 1 else ''} after resuming, "
            f"loaded on {link.dst_world_size})")


@dataclass(frozen=True, kw_only=True)
class Link:
    """A later checkpoint of a chain as its ranks recorded it."""

    case: Case
    """Its round trip (``Case.next_link`` of the one before)."""
    save_obs: Sequence[Any]
    """The save records (made by the previous checkpoint's load side, after resuming)."""
    load_obs: Sequence[Any] | None
    """The load records, None where the load never ran (the save raised)."""
    workdir: Path
    """Its directory (``next_dir`` of the previous one)."""
    errors: Mapping[str, Any] | None = None
    """A user's own code: the RankError of each stage that raised ("save", "load",
    "resume"); None for a built-in path (its errors are recorded in the records)."""
    failed: Verdict | None = None
    """The verdict every linked property carries when the save raised in torch (a
    built-in path: nothing to load); None otherwise."""


def fold(first: Mapping[str, Verdict], later: Mapping[str, Verdict], what: str,
         props: Sequence[str] = LINKED) -> dict[str, Verdict]:
    """``first``'s verdicts with a later checkpoint's (``what``: ``where``) folded into
    ``props`` (module rules)."""
    out = dict(first)
    for p in props:
        if p in out and p in later:
            out[p] = _folded(out[p], later[p], what)
    return out


def fold_links(first: Mapping[str, Verdict], case: Case, links: Sequence[Link],
               judge_link: Callable[[Link], Mapping[str, Verdict]]) -> dict[str, Verdict]:
    """``first`` (the verdicts of ``case``'s first checkpoint) with each later checkpoint's
    folded in (``fold``); ``judge_link(link)``: that checkpoint's verdicts (not called where
    its save raised: ``Link.failed`` is its verdict then)."""
    v = dict(first)
    for link in links:
        later = ({p: link.failed for p in LINKED} if link.failed is not None
                 else judge_link(link))
        v = fold(v, later, where(case, link.case))
    return v


def _folded(a: Verdict, b: Verdict, what: str) -> Verdict:
    if b.status == "pass":
        return passed(f"{a.detail}; held at {what} too") if a.status == "pass" else a
    if b.status not in ("fail", "error"):  # n/a (nothing to judge there), removed
        return a
    text = f"at {what}:\n{b.detail}"
    if a.status in ("pass", "n/a"):
        return Verdict(b.status, text, origin=b.origin)
    status = "fail" if "fail" in (a.status, b.status) else "error"
    origin = "suite" if "suite" in (a.origin, b.origin) else "torch"
    return Verdict(status, f"{a.detail}\n\n{text}", origin=origin)
