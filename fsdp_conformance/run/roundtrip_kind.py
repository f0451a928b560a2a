"""The round-trip kind of case (P0-P11): save at N on one pool, load at M on another, judge.

Rules
- The save side runs on a pool of ``case.world_size`` ranks, the load side on one of
  ``case.dst_world_size`` (the path's rank functions: api_paths.py).
- A save call that raised on a rank (recorded, not raised) means nothing was written: every
  property the case decides is "error" naming the rank and torch's traceback, and the load
  is not attempted.
- Otherwise every property is judged on the controller (properties/roundtrip.py).
- Cases that differ only in how they load share one save on a lane (run/saves.py): the
  save side runs for the first, the others load from its directory and are judged on its
  records.
"""
from __future__ import annotations

import shutil

from ..cases import Case
from ..properties.catalogue import NO_REKEY, ONLY_BOUNDS, ONLY_FAULT, ONLY_GOLDEN, PROPS
from ..properties.expectation import EXACT, Expectation
from ..properties.roundtrip import ROUND_TRIP, round_trip_verdicts
from ..properties.verdict import Verdict, error, na
from ..sut.records import error_of
from ..api_paths import api_path
from .lifecycle import Outcome, Step, all_props
from .saves import save_key


def _rekeys(case: Case) -> bool:
    return api_path(case.api).rekeys


class RoundTripKind:
    """Save, load, judge P0-P11 (module rules)."""

    name = "round-trip"

    def decides(self, case: Case) -> tuple[str, ...]:
        return tuple(p for p in ROUND_TRIP if p != "P5" or _rekeys(case))

    def undecided(self, case: Case) -> dict[str, Verdict]:
        out = {"P12": na(ONLY_GOLDEN), **{p: na(w) for p, w in ONLY_BOUNDS.items()},
               "P15": na(ONLY_FAULT)}
        if not _rekeys(case):
            out["P5"] = na(NO_REKEY)
        return out

    def run(self, step: Step) -> Outcome:
        case, path = step.case, api_path(step.case.api)
        cache, key = step.env.saves, save_key(step.case)
        keeps = cache is not None and key is not None
        kept = cache.get(key) if keeps else None
        if kept is not None:  # the same save, run for an earlier case of the lane (run/saves)
            save_obs, savedir = kept  # its time is its first case's
        else:
            savedir = cache.fresh_dir() if keeps else step.workdir
            save_obs = step.on_pool("save side", case.world_size, path.save_side,
                                    workdir=savedir)
            step.timings["save"] = max(o.timings.get("save", 0.0) for o in save_obs)
            if cache is not None and all(o.reused_training for o in save_obs):
                cache.reused_trainings += 1
            failed = [o for o in save_obs if error_of(o.saved)]
            if failed:  # nothing was written: there is nothing to load
                if keeps:
                    shutil.rmtree(savedir, ignore_errors=True)
                return Outcome(verdicts=all_props(error(
                    f"torch raised in the {case.api} save call on rank {failed[0].rank}, so "
                    f"nothing could be loaded:\n{error_of(failed[0].saved)}"),
                    self.decides(case)))
            if keeps:
                cache.put(key, save_obs, savedir)
        load_obs = step.on_pool("load side", case.dst_world_size, path.load_side,
                                workdir=savedir)
        step.timings["load"] = max(o.timings.get("load", 0.0) for o in load_obs)
        def judge(exp: Expectation) -> dict[str, Verdict]:
            v = round_trip_verdicts(case, save_obs, load_obs, savedir, exp=exp)
            return {p: v[p] for p in self.decides(case)}

        verdicts = judge(EXACT)
        return Outcome(verdicts=verdicts, judge=judge)


assert set(PROPS) >= set(ROUND_TRIP)
