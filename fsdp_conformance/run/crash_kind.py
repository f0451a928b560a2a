"""The crash kind of case (P16): save, save again killed at a chosen point, load, judge.

Rules
- Save 1 runs as a round trip's save side (``case.steps`` steps) into the checkpoint's
  folder. Save 2 trains one step more (``steps + 1``: another state) and saves twice: once
  whole into a folder of its own (its records: what a correct load of save 2 gives; its
  files: what save 2 writes when nothing stops it), then with the kill armed
  (``SideAsks.kill``: sut/crash_points.py) into a new step folder (layout "fresh") or over
  save 1's folder ("over"). A killed rank never leaves the case waiting: the pool reports
  the death and the ranks it left in collectives within its error grace, and is rebuilt.
- A second save that returns on every rank never met its point: P16 is n/a with that
  reason (the path's save has no such point: a save without a DCP commit, say). A save
  where a rank the plan does not kill died, or none died, is an error of the case; ranks
  that raised or waited because a killed peer died first are the kill's doing.
- Save 2 is complete on disk where every file of its whole copy is in its folder with the
  same bytes and each DCP ``.metadata`` is its own (``complete_on_disk``: a ``save_id``
  save 1 did not commit); then the newest complete save is save 2, else save 1.
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
from typing import Callable

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


def after_kill(killed_save: Callable[[], object], whose: str, point: str, ranks,
               failed: Callable[[StepFailed], str]) -> Verdict | None:
    """Run ``killed_save`` (a pool call that SIGKILLs ``ranks`` at ``point``): None where it
    died as planned (module rules: some rank died, only ranks the plan kills; a rank that
    raised or waited is one whose peer died first), else P16's verdict: n/a where the save
    completed on every rank without meeting its point, an error with ``failed(exc)`` where
    it failed otherwise."""
    try:
        killed_save()
    except StepFailed as exc:
        died = {f.rank for f in getattr(exc.exc, "failures", ()) if f.kind == "died"}
        if isinstance(exc.exc, RankDied) and died and died <= set(ranks):
            return None
        return error(failed(exc))
    return na(f"{whose} never reached the point '{point}' on rank(s) {list(ranks)}: it "
              f"completed on every rank (those ranks write no data file in this save, or it "
              f"has no such point)")


def committed_ids(folder: Path) -> set[str]:
    """The ``save_id`` of every DCP ``.metadata`` under ``folder`` (what a save committed)."""
    return {i for f in folder.rglob("*.metadata") if (i := _save_id(f))}


def _save_id(path: Path) -> str:
    import pickle

    try:
        with open(path, "rb") as fh:
            meta = pickle.load(fh)
        return str(getattr(getattr(meta, "storage_meta", None), "save_id", "") or "")
    except Exception:  # noqa: BLE001  (a torn or foreign file commits nothing)
        return ""


def complete_on_disk(whole: Path, folder: Path, before: set[str]) -> str:
    """Whether the killed save is complete in ``folder``: every file its whole copy wrote
    under ``whole`` is there with the same bytes, each DCP ``.metadata`` one this save wrote
    (a ``save_id`` not among ``before``, the earlier save's), the suite's own files aside.
    Returns "" when complete, else what is missing (module rules)."""
    from ..sut.crash_points import SUITE_FILES

    for f in sorted(p for p in whole.rglob("*") if p.is_file()):
        rel = f.relative_to(whole)
        if rel.name in SUITE_FILES:
            continue
        there = folder / rel
        if not there.is_file():
            return f"{rel} is missing"
        if rel.name.endswith(".metadata"):
            committed = _save_id(there)
            if not committed or committed in before:
                return f"{rel} is the earlier save's, not its own commit"
        elif there.read_bytes() != f.read_bytes():
            have, want = there.stat().st_size, f.stat().st_size
            return (f"{rel} holds {have} of its {want} bytes" if have != want else
                    f"{rel} holds other bytes than this save writes")
    return ""


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
        before = committed_ids(dir_1)
        whole = step.workdir / "save2-whole"
        save_2 = step.on_pool("save 2 (whole, for its expected state)", case.world_size,
                              path.save_side, workdir=whole, case=second, after=(FRESH,))
        for at, obs in ((first, save_1), (second, save_2)):
            failed = save_raised(at, obs)
            if failed is not None:
                return Outcome(verdicts={"P16": failed})
        plan = plan_of(case.crash, case.world_size, case.seed)
        not_killed = after_kill(
            lambda: step.on_pool(f"save 2 killed at '{point}'", case.world_size,
                                 path.save_side, workdir=dir_2, case=second,
                                 after=(replace(FRESH, kill=plan),),
                                 timeout=step.env.options.fault_timeout),
            f"the {case.api} save", point, ranks,
            lambda exc: f"save 2 failed other than by its planned kill on rank(s) "
                        f"{list(ranks)}:\n{exc}")
        if not_killed is not None:
            return Outcome(verdicts={"P16": not_killed})
        missing = complete_on_disk(whole, dir_2, before)
        shutil.rmtree(whole, ignore_errors=True)
        dir_2.mkdir(parents=True, exist_ok=True)  # killed at "start": nothing made it
        if not (dir_2 / MODEL_FILE).exists():  # the suite's file, not under test (rules)
            shutil.copy2(dir_1 / MODEL_FILE, dir_2 / MODEL_FILE)
        try:
            outcome: object = step.on_pool("load after the kill", case.dst_world_size,
                                           path.load_side, workdir=dir_2, case=first,
                                           timeout=step.env.options.fault_timeout,
                                           after=(LOAD,))
        except StepFailed as exc:
            outcome = exc.exc
        from ..properties.family_refs import family_refs
        from ..properties.torch_files import TorchFiles

        refs = family_refs(first)  # save 2's layouts are save 1's: only its steps differ
        saved = [TorchFiles(workdir=None).saved(at, refs, obs)
                 for at, obs in ((first, save_1), (second, save_2))]
        bad = next((s.bad for s in saved if s.full is None), None)
        if bad is not None:
            return Outcome(verdicts={"P16": bad})
        return Outcome(verdicts={"P16": p16_verdict(
            describe(case), outcome, views_of(refs, saved), case.dst_world_size,
            files=checkpoint_files(dir_2), incomplete=missing)})


def checkpoint_files(folder: Path) -> list[str]:
    """The names of the files under a checkpoint folder (an error may name one); none where
    the folder was never made."""
    return sorted(p.name for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
