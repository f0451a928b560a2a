"""The crash kind of case (P16): save, save again killed at a chosen point, load, judge.

Rules
- Save 1 runs as a round trip's save side (``case.steps`` steps) into the checkpoint's
  folder. Save 2 trains one step more (``steps + 1``: another state) and saves twice: once
  whole into a folder of its own (what a correct load of save 2 gives: its records only;
  the folder is removed), then with the kill armed (``SideAsks.kill``:
  sut/crash_points.py) into a new step folder (layout "fresh") or over save 1's folder
  ("over"). A killed rank never leaves the case waiting: the pool reports the death and
  the ranks it left in collectives within its error grace, and is rebuilt.
- A second save that returns on every rank never met its point: P16 is n/a with that
  reason (the path's save has no such point: a save without a DCP commit, say). A save
  that raised, or died elsewhere than at the kill, is an error of the case.
- The load runs on save 2's folder (fresh) or the shared one (over) at the case's load
  world size with ``fault_timeout``, let raise on every rank; its records or the pool's
  ``RankError`` are judged by properties/crash_props.py. The suite's own files beside the
  checkpoint (the model's params the load side reads first, not under test) are save 1's
  where save 2 was killed before writing them. Only P16 is decided; the planned death is
  the case's subject, never rerun as a machine's death is (run/lifecycle.py).
"""
from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from ..api_paths import MODEL_FILE, api_path
from ..cases import Case, crash_parts
from ..harness.errors import RankDied
from ..properties.catalogue import PROPS
from ..properties.crash_props import p16_verdict, views_of
from ..properties.verdict import Verdict, error, na
from ..sut.asks import SideAsks
from .lifecycle import Outcome, Step, StepFailed
from .roundtrip_kind import save_raised

ONLY_P16 = "crash case: only P16 is checked"
FRESH = SideAsks(keeps_training=False)
"""Save 2's asks: its own training (one step more than any kept one)."""
LOAD = SideAsks(load_raises=True, keeps_training=False)
"""The load after the kill: let raise on every rank (P16 judges each rank's outcome)."""


def describe(case: Case) -> str:
    """The kill in words (the verdict's first words)."""
    point, ranks, layout = crash_parts(case.crash, case.world_size)
    who = "every rank" if len(ranks) == case.world_size > 1 else f"rank {ranks[0]}"
    where = ("into save 1's directory" if layout == "over"
             else "into a new directory beside save 1's")
    return (f"save 2 (step {case.steps + 1}) killed at '{point}' on {who}, written {where}")


class DecidesP16:
    """What a crash kind decides (P16) and says of every other property."""

    def decides(self, case: Case) -> tuple[str, ...]:
        return ("P16",)

    def undecided(self, case: Case) -> dict[str, Verdict]:
        return {p: na(ONLY_P16) for p in PROPS if p != "P16"}


def never_reached(whose: str, point: str, ranks) -> Verdict:
    """P16 where the save completed on every rank without meeting its point."""
    return na(f"{whose} never reached the point '{point}' on rank(s) {list(ranks)}: it "
              f"completed on every rank (no such point in this save)")


def killed_as_planned(exc: StepFailed, ranks) -> bool:
    """Whether the failed save is the planned kill: every rank to kill died."""
    died = {f.rank for f in getattr(exc.exc, "failures", ()) if f.kind == "died"}
    return isinstance(exc.exc, RankDied) and set(ranks) <= died


class CrashKind(DecidesP16):
    """A save killed at a chosen point, then the load (module rules)."""

    name = "crash"

    def run(self, step: Step) -> Outcome:
        from ..sut.crash_points import plan_of

        case, path = step.case, api_path(step.case.api)
        point, ranks, layout = crash_parts(case.crash, case.world_size)
        first = replace(case, crash="")
        second = replace(first, steps=case.steps + 1)
        dir_1 = step.workdir / ("latest" if layout == "over" else f"step{first.steps}")
        dir_2 = dir_1 if layout == "over" else step.workdir / f"step{second.steps}"
        save_1 = step.on_pool("save 1", case.world_size, path.save_side, workdir=dir_1,
                              case=first)
        whole = step.workdir / "save2-whole"
        save_2 = step.on_pool("save 2 (whole, for its expected state)", case.world_size,
                              path.save_side, workdir=whole, case=second, after=(FRESH,))
        shutil.rmtree(whole, ignore_errors=True)
        for at, obs in ((first, save_1), (second, save_2)):
            failed = save_raised(at, obs)
            if failed is not None:
                return Outcome(verdicts={"P16": failed})
        plan = plan_of(case.crash, case.world_size, case.seed)
        try:
            step.on_pool(f"save 2 killed at '{point}'", case.world_size, path.save_side,
                         workdir=dir_2, case=second, after=(replace(FRESH, kill=plan),),
                         timeout=step.env.options.fault_timeout)
            return Outcome(verdicts={"P16": never_reached(f"the {case.api} save", point,
                                                          ranks)})
        except StepFailed as exc:
            if not killed_as_planned(exc, ranks):
                return Outcome(verdicts={"P16": error(
                    f"save 2 failed before its planned kill on rank(s) {list(ranks)}:\n{exc}")})
        if not (dir_2 / MODEL_FILE).exists():  # the suite's file, not under test (rules)
            shutil.copy2(dir_1 / MODEL_FILE, dir_2 / MODEL_FILE)
        try:
            outcome: object = step.on_pool("load after the kill", case.dst_world_size,
                                           path.load_side, workdir=dir_2, case=first,
                                           timeout=step.env.options.fault_timeout,
                                           after=(LOAD,))
        except StepFailed as exc:
            outcome = exc.exc
        saved = _saved(first, second, save_1, save_2)
        bad = next((s.bad for s in saved if s.full is None), None)
        if bad is not None:
            return Outcome(verdicts={"P16": bad})
        return Outcome(verdicts={"P16": p16_verdict(
            describe(case), outcome, views_of(first, saved), case.dst_world_size,
            files=_files(dir_2))})


def _files(folder: Path) -> list[str]:
    """The names of the files under the checkpoint folder (an error may name one)."""
    return sorted(p.name for p in folder.rglob("*") if p.is_file())


def _saved(first: Case, second: Case, save_1: list, save_2: list) -> list:
    """What each save wrote (``properties.view.Saved``), as the run's round trips read it."""
    from ..properties.family_refs import family_refs
    from ..properties.torch_files import TorchFiles

    return [TorchFiles(workdir=None).saved(at, family_refs(at), obs)
            for at, obs in ((first, save_1), (second, save_2))]
