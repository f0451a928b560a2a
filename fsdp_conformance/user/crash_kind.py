"""A user's own save and load under a kill (P16): the crash kind of the plugin
(run/crash_kind.py is the run's, for the built-in paths).

Rules
- The user's stages (user/rank_side.py): train ``case.steps`` steps and save with the
  user's ``save_fn`` into the checkpoint directory; train ``steps + 1`` steps and save
  whole into a directory of its own (what save 2 writes when nothing stops it), then
  again with the kill armed (``rank_custom(..., kill=)``: sut/crash_points.py), into the
  same directory (layout "over": the trainer's own folders decide what an overwrite
  means: a "latest" folder, or step folders it marks complete) or a new one ("fresh");
  then the user's ``load_fn`` on a fresh model from that directory, let raise.
- What a correct load of each save gives is the reference's shard of the state in memory
  at that save (the format is the user's own); the weights too where the user's load
  restores them (``weights_theirs``). Whether save 2 is complete on disk is its files
  against its whole copy's (``run.crash_kind.complete_on_disk``). Judged by
  properties/crash_props.py.
- A save that returns on every rank never met its point (P16 n/a, with the point: a save
  without a DCP commit, say); the user's code raising elsewhere is the case's error.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from ..cases import Case, crash_parts
from ..properties.crash_props import p16_verdict, views_of
from ..properties.family_refs import family_refs
from ..properties.verdict import error
from ..properties.view import Saved
from ..run.crash_kind import (DecidesP16, after_kill, checkpoint_files, committed_ids,
                              complete_on_disk, describe)
from ..run.lifecycle import Outcome, Step, StepFailed
from ..sut.records import LoadRecord
from .kinds import CustomPathKind
from .rank_errors import rank_error_text
from .rank_side import CKPT_DIR, rank_custom, weights_theirs


@dataclass(frozen=True, kw_only=True)
class CustomCrashKind(DecidesP16, CustomPathKind):
    """The user's save killed at a chosen point, then the user's load (module rules): a
    custom path's case (its functions, model and known view) that decides P16 alone."""

    name = "custom-path crash"

    def run(self, step: Step) -> Outcome:
        from ..sut.crash_points import plan_of

        case = step.case
        if self.user is not None:
            self.user.register()
        point, ranks, layout = crash_parts(case.crash, case.world_size)
        first = replace(case, crash="")
        second = replace(first, steps=case.steps + 1)
        dir_2 = step.workdir if layout == "over" else step.workdir / "fresh"

        def stage(ws: int, which: str, at: Case, workdir: Path, label: str = "", kill=None,
                  timeout: float | None = None) -> list[dict]:
            """The user's stage ``which`` (rank_side.STAGES) on a pool of ``ws`` ranks,
            reported as ``which`` and ``label``."""
            return step.on_pool(f"{which} {label}".strip(), ws, rank_custom,
                                before=(self.user, self.custom), after=(which, kill), case=at,
                                workdir=workdir, timeout=timeout)

        whole = step.workdir / "save2-whole"
        try:
            save_1 = stage(case.world_size, "train", first, step.workdir)
            stage(case.world_size, "save", first, step.workdir)
            before = committed_ids(step.workdir / CKPT_DIR)
            save_2 = stage(case.world_size, "train", second, whole, "(save 2)")
            stage(case.world_size, "save", second, whole, "(save 2, whole)")
            stage(case.world_size, "train", second, dir_2, "(save 2, to be killed)")
        except StepFailed as exc:
            return Outcome(verdicts={"P16": error(
                "training or your save_fn raised before the kill:\n"
                + rank_error_text(exc.exc))})
        timeout = step.env.options.fault_timeout
        not_killed = after_kill(
            lambda: stage(case.world_size, "save", second, dir_2,
                          f"(save 2, killed at '{point}')",
                          kill=plan_of(case.crash, case.world_size, case.seed),
                          timeout=timeout),
            "your save_fn", point, ranks,
            lambda exc: f"your save_fn failed before its planned kill on rank(s) "
                        f"{list(ranks)}:\n" + rank_error_text(exc.exc))
        if not_killed is not None:
            return Outcome(verdicts={"P16": not_killed})
        missing = complete_on_disk(whole / CKPT_DIR, dir_2 / CKPT_DIR, before)
        shutil.rmtree(whole, ignore_errors=True)
        try:
            outcome: object = [LoadRecord(**o) for o in stage(
                case.dst_world_size, "load", first, dir_2, timeout=timeout)]
        except StepFailed as exc:
            outcome = exc.exc
        refs = family_refs(first)
        saved = [Saved(full=refs.gather(refs.layout, [o["local"] for o in obs]),
                       by_torch=False) for obs in (save_1, save_2)]
        weights = ([obs[0]["params"] for obs in (save_1, save_2)]
                   if weights_theirs(self.custom) else ())
        return Outcome(verdicts={"P16": p16_verdict(
            describe(case), outcome, views_of(refs, saved, weights), case.dst_world_size,
            files=checkpoint_files(dir_2 / CKPT_DIR), incomplete=missing)})
