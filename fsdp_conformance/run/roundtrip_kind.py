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
- A chain (``Case.links``, properties/chain.py): each load side that has a next checkpoint
  saves it after resuming (``SideAsks.save_next``, under the case's own directory); each is
  loaded on a pool of its own world size and judged with the first (``chain.fold``).
"""
from __future__ import annotations

import shutil

from ..cases import Case
from ..properties.catalogue import (NO_REKEY, ONLY_BOUNDS, ONLY_CRASH, ONLY_FAULT, ONLY_GOLDEN,
                                     PROPS)
from ..properties.expectation import EXACT, Expectation
from ..properties.roundtrip import ROUND_TRIP, round_trip_verdicts
from ..properties.verdict import Verdict, error, na
from ..properties import chain
from ..sut.asks import ROUND_TRIP_ASKS, SideAsks
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
               "P15": na(ONLY_FAULT), "P16": na(ONLY_CRASH)}
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
            failed = save_raised(case, save_obs)
            if failed is not None:  # nothing was written: there is nothing to load
                if keeps:
                    shutil.rmtree(savedir, ignore_errors=True)
                return Outcome(verdicts=all_props(failed, self.decides(case)))
            if keeps:
                cache.put(key, save_obs, savedir)
        return load_and_judge(step, save_obs, savedir, path.load_side, round_trip_verdicts,
                              self.decides(case))


def load_and_judge(step: Step, save_obs: list, savedir, load_fn, verdicts_fn,
                   decides: tuple[str, ...], *, before: tuple = ()) -> Outcome:
    """The round trip after a save that wrote its checkpoint, the same for the run's paths
    and a user's model on them (user/kinds.py): ``load_fn(ctx, *before, case, savedir,
    asks)`` on a pool of the load world size, the chain's later checkpoints
    (``later_links``), then ``verdicts_fn(case, save_obs, load_obs, workdir, exp=,
    continued=)`` for the first and each later checkpoint, folded (``chain.fold_links``)
    into the properties ``decides`` names; judged again under every expectation the known
    limitations bring (``Outcome.judge``)."""
    case = step.case
    load_obs = step.on_pool("load side", case.dst_world_size, load_fn, workdir=savedir,
                            before=before, after=(chain_asks(case, step.workdir),))
    step.timings["load"] = max(o.timings.get("load", 0.0) for o in load_obs)
    links = later_links(step, case, load_obs, load_fn, before=before)

    def judge(exp: Expectation) -> dict[str, Verdict]:
        v = chain.fold_links(
            verdicts_fn(case, save_obs, load_obs, savedir, exp=exp), case, links,
            lambda link: verdicts_fn(link.case, link.save_obs, link.load_obs, link.workdir,
                                     exp=exp, continued=True))
        return {p: v[p] for p in decides}

    return Outcome(verdicts=judge(EXACT), judge=judge)


def save_raised(case: Case, save_obs) -> Verdict | None:
    """The error every property carries where torch raised in the path's save call on a
    rank (recorded, not raised: nothing was written, so there is nothing to load); None
    where no save raised."""
    failed = [o for o in save_obs if error_of(o.saved)]
    if not failed:
        return None
    return error(f"torch raised in the {case.api} save call on rank {failed[0].rank}, so "
                 f"nothing could be loaded:\n{error_of(failed[0].saved)}")


def chain_asks(case: Case, workdir) -> SideAsks:
    """What a load side is asked: to save the chain's next checkpoint after resuming, under
    ``workdir`` (``chain.next_dir``), where the case has one."""
    return SideAsks(save_next=str(chain.next_dir(workdir))) if case.links > 1 else ROUND_TRIP_ASKS


def later_links(step: Step, case: Case, load_obs: list, load_fn, *,
                before: tuple = ()) -> list[chain.Link]:
    """The chain's later checkpoints (properties/chain.py), each saved by the load side
    before it and loaded on a pool of its own (``load_fn(ctx, *before, case, workdir,
    asks)``: the path's load side); stops at one whose save raised (nothing to load) or
    whose previous load side did not resume (its own verdicts say why)."""
    links, cur, cur_load, workdir = [], case, load_obs, step.workdir
    while cur.links > 1:
        saves = [o.next_save for o in cur_load]
        nxt, workdir = cur.next_link(), chain.next_dir(workdir)
        if any(s is None for s in saves):
            break
        failed = save_raised(case, saves)
        if failed is not None:
            links.append(chain.Link(case=nxt, save_obs=saves, load_obs=None, workdir=workdir,
                                    failed=failed))
            break
        cur_load = step.on_pool(f"load side of checkpoint {chain.number(case, nxt)}",
                                nxt.dst_world_size, load_fn, workdir=workdir, before=before,
                                after=(chain_asks(nxt, workdir),), case=nxt)
        links.append(chain.Link(case=nxt, save_obs=saves, load_obs=cur_load, workdir=workdir))
        cur = nxt
    return links


assert set(PROPS) >= set(ROUND_TRIP)
