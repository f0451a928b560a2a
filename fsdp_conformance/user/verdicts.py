"""The verdicts of a user round trip, from the observations the ranks sent back: a built-in
path with a user model (``evaluate_user``: the round trip's P0-P11, at the precision of the
user's own mixed precision) and the user's own save/load code (``evaluate_custom``).

Rules (custom save/load)
- The file format is the user's; judged are P0 (layout), P2 (training matches one process:
  the state in memory at the save, so never under a modelled bug's save),
  P3 (each rank's state after the load == ``reference.shard_full`` of the state at the save,
  bitwise; under a modelled torch bug, of that state as the bug's save would have written it:
  ``Expectation.saved``, since no saved dict of the user's is observed), P6 (resumed training == uninterrupted), P7 (the save leaves the optimizer
  unchanged, and load -> save -> load gives bitwise the state of the first load:
  properties/idempotent.py, given the state around each call), P10
  (partial state) and P11 (param groups). P1, P4, P5, P8 and P9 judge torch's own dicts and
  files: n/a. The references are the case family's (FSDP1 flat units, or FSDP2's
  per-parameter DTensor shards).
- With the training state (``save_fn(state, directory)``): P11 also holds the step the load
  restored (== the save's) and the scheduler's state after the load (== at the save, == the
  single-process run's), P6 the scheduler's state after resuming (its learning rates).
- P7 also fails when the checkpoint was still being written when ``save_fn`` returned (an
  ``async_save`` whose Future was not waited for: ``rank_side.pending_writes``).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from .. import reference as ref
from .diagnosis import likely_causes, with_causes
from ..cases import Case
from ..properties.fault_props import exception_line
from ..properties.baseline import local_run
from ..properties.expectation import EXACT, Expectation
from ..properties import run_props as rp
from ..properties.precision import judged_dtype, own_mp_of, with_precision
from ..properties.groups import loaded_groups, p11_groups
from ..properties.idempotent import SameState, p7_idempotent
from ..properties.partial import loaded_dicts, p10_partial
from ..properties.training_state import TrainingSeen, with_problems
from ..properties.verdict import Verdict, error, fail, na
from ..sut.records import LoadRecord, SaveRecord
from ..properties.catalogue import ONLY_BOUNDS, ONLY_GOLDEN, PROPS
from ..properties.roundtrip import family_refs, round_trip_verdicts
from ..zoo import model_spec


THEIRS = "the file format is the user's own: judged by what the load restores (P3, P7)"
CUSTOM_DECIDES: tuple[str, ...] = ("P0", "P2", "P3", "P6", "P7", "P10", "P11")
"""The properties a custom-path round trip decides."""


def custom_undecided() -> dict[str, Verdict]:
    """The n/a of a custom-path round trip: torch's own dicts and files are not involved."""
    out = {p: na(THEIRS) for p in ("P1", "P4", "P5", "P8", "P9")}
    out.update({"P12": na(ONLY_GOLDEN), **{p: na(w) for p, w in ONLY_BOUNDS.items()},
                "P15": na("not a bad-input case")})
    return out


def _tail(tb: str, lines: int = 12) -> str:
    return "\n".join(tb.strip().splitlines()[-lines:])


_FRAME = re.compile(r'\s*File "(?P<file>[^"]+)", line \d+, in .*')
_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])


def _library_frame(path: str) -> bool:
    return ("site-packages" in path or "dist-packages" in path or path.startswith(_PACKAGE_DIR)
            or path.startswith("<") or "/lib/python3" in path)


def user_frames(tb: str, tail: int = 4) -> str:
    """A traceback cut to what the user needs: the frames of the user's own code (not this
    package's, not an installed library's), then the frame that raised and the exception.
    The whole traceback's last lines when no user frame is in it."""
    # Python 3.11's position markers (^^^, ~~~) point into lines this cut may drop
    lines = [ln for ln in tb.strip().splitlines() if ln.strip(" ^~")]
    keep, i = [], 0
    while i < len(lines):
        m = _FRAME.match(lines[i])
        if m and not _library_frame(m.group("file")):
            keep.append(lines[i])
            if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]):
                keep.append(lines[i + 1])
                i += 1
        i += 1
    if not keep:
        return "\n".join(lines[-8:])
    frames = [j for j, ln in enumerate(lines) if _FRAME.match(ln)]
    last = lines[frames[-1]:] if frames else lines[-tail:]
    if last and last[0] in keep:  # it raised in the user's own frame
        return "\n".join(["your code:"] + keep + last[2:])
    return "\n".join(["your code:"] + keep + ["where it raised:"] + last)


def _crash_site(log: str, n: int = 10) -> str:
    """The first ``n`` lines of the faulthandler report in a dead rank's log (innermost
    frame first: where it died), or the log's last ``n`` lines when there is none."""
    lines = log.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.startswith(("Fatal Python error", "Current thread", "Thread 0x"))), None)
    return "\n".join(lines[start:start + n] if start is not None else lines[-n:])


def rank_error_text(exc) -> str:
    """A RankError as: each rank that died (how: a signal, an exit code) and the last lines
    of its log (a faulthandler stack), each raising rank's exception line, the ranks left
    waiting, then the first traceback's user frames. A rank that died is the cause: the
    others' errors (a peer's "Connection reset") follow from it."""
    fails = list(getattr(exc, "failures", []))
    died = [f for f in fails if f.kind == "died"]
    raised = [f for f in fails if f.kind.startswith("exception")]
    waiting = [f for f in fails if f not in died and f not in raised]
    lines = [f"rank {f.rank}: died, {f.detail.strip()}" for f in died]
    lines += [f"rank {f.rank}: {exception_line(f.detail)}" for f in raised]
    if waiting:
        lines.append(f"rank(s) {[f.rank for f in waiting]}: {waiting[0].kind} "
                     f"(blocked in a collective the failing rank never joined?)")
    if died and died[0].log_tail.strip():
        lines += [f"rank {died[0].rank}'s log, where it died:", _crash_site(died[0].log_tail)]
    if raised and not died:
        lines += ["traceback of rank %d:" % raised[0].rank, user_frames(raised[0].detail)]
    elif waiting and not died:
        lines.append(_tail(waiting[0].detail, 8))
    return "\n".join(lines) or str(exc)


def _around_calls(save_obs: list[SaveRecord], load_obs: list[LoadRecord],
                  again_error) -> tuple[list[SameState], list[str]]:
    """What P7 (properties/idempotent.py) judges of a user's own save and load: the
    optimizer's state around each call (the save leaves it as it was; loading the same
    checkpoint twice gives the same state; a save right after a load leaves it; load -> save
    -> load is a fixpoint), and what raised instead (the load -> save -> load stage)."""
    pairs = [SameState(what=f"rank {o.rank}: the save function changed the optimizer state "
                            f"(expected: the state before saving; got: after)",
                       want=o.local, got=o.after_save) for o in save_obs]
    if again_error is not None:
        return pairs, ["load -> save -> load raised:\n" + rank_error_text(again_error)]
    for o in load_obs:
        r = o.rank
        pairs += [
            SameState(what=f"rank {r}: loading the same checkpoint twice gives different states",
                      want=o.loaded, got=o.loaded_again),
            SameState(what=f"rank {r}: saving right after the load changed the optimizer state",
                      want=o.loaded_again, got=o.after_resave),
            SameState(what=f"rank {r}: load -> save -> load is not a fixpoint (expected: the "
                           f"state after the first load; got: after the second)",
                      want=o.loaded_again, got=o.reloaded)]
    return pairs, []


def _pending_saves(save_obs: Sequence[SaveRecord]) -> list[str]:
    """P7's problem of a save still being written when ``save_fn`` returned."""
    pending = [o for o in save_obs if o.pending]
    if not pending:
        return []
    return [f"the checkpoint was still being written when save_fn returned, on rank(s) "
            f"{[o.rank for o in pending]} (rank {pending[0].rank}: {pending[0].pending}): "
            f"dcp.async_save returns a Future, and the checkpoint exists only once it "
            f"completes; wait for it (future.result()) before the save counts as done"]


def evaluate_custom(case: Case, save_obs: list[SaveRecord], load_obs: list[LoadRecord] | None,
                    errors: dict | None = None, app_state: bool = False, *,
                    exp: Expectation = EXACT) -> dict[str, Verdict]:
    """Every property of a custom-path round trip (module docstring), against ``exp``.
    ``errors``: the RankError of a stage ("save", "load", "resume", "again"), if it raised;
    ``load_obs`` is None when the load side never ran. ``app_state``: the user's functions
    checkpoint the training state (step and scheduler judged too)."""
    errors = errors or {}
    refs = family_refs(case, exp)
    layout, dst, gather = refs.layout, refs.dst, refs.gather
    v: dict[str, Verdict] = {"P0": refs.p0(save_obs, load_obs, case.groups == 1)}
    v.update(custom_undecided())
    local = local_run(case, exp)
    try:
        full = gather(layout, [o.local for o in save_obs])
    except ref.StateDictMismatch as exc:
        bad = error(f"reference gather rejected torch's local dicts: {exc}")
        return {p: v.get(p, bad) for p in PROPS}
    ignored = model_spec(case.model).ignored
    why = (f"the model has ignored modules {list(ignored)}: FSDP trains them per rank, so no "
           f"single-process run can match") if ignored else ""
    mp = own_mp_of(save_obs)
    dt, _ = judged_dtype(case, mp)
    # P2: the state in memory, no save went through torch (EXACT)
    v["P2"] = na(why) if why else with_precision(
        case, rp.p2_trained(layout, [full], local, dt, exp=EXACT), own_mp=mp)
    for stage, what in (("save", "the save function"), ("load", "the load function")):
        if errors.get(stage) is not None:
            detail = f"{what} raised:\n" + rank_error_text(errors[stage])
            for p in ("P3", "P6", "P7", "P10", "P11"):
                v[p] = fail(detail)
            return {p: v[p] for p in PROPS}
    same = case.loads_where_saved
    # what a save would have written: the state at the save (under a modelled bug, as that
    # bug's save writes it; the identity otherwise)
    written = exp.saved(full)
    v["P3"] = refs.p3(written, load_obs, own=save_obs if same else None)
    if errors.get("resume") is not None:
        v["P6"] = fail("training after the load raised (the loaded state cannot be trained "
                       "on):\n" + rank_error_text(errors["resume"]))
    else:
        v["P6"] = rp.p6_resume(
            dst, load_obs, local, dt, gather=gather, resume_steps=case.resume_steps, case=case,
            start=rp.save_point(layout, save_obs, gather, exp=exp)
            if dt == "bf16" and not why else None, unmatched=why, own_mp=mp, exp=exp, scheduler=(
                "the scheduler after resuming as in the uninterrupted run"
                if app_state and local.sched_at_end is not None else None))
    pairs, raised = _around_calls(save_obs, load_obs, errors.get("again"))
    v["P7"] = with_problems(p7_idempotent(pairs, raised=raised, summary=(
        "the save leaves the state unchanged; load -> save -> load bitwise the same")),
        _pending_saves(save_obs), "the save was complete when save_fn returned")
    v["P10"] = p10_partial(case, layout=layout, dst=dst, full=None,
                           loaded=loaded_dicts(load_obs), local=local, gather=gather, exp=exp)
    v["P11"] = p11_groups(written, loaded_groups(load_obs), at_save=local.optim_at_save, exp=exp,
                          training=TrainingSeen(
                              save_obs=save_obs, load_obs=load_obs, local=local, step=case.steps,
                              held=f"step {case.steps} and the scheduler restored")
                          if app_state else None)
    return with_causes({p: v[p] for p in PROPS}, _causes(case, save_obs, load_obs, app_state))


def _causes(case: Case, save_obs, load_obs, app_state: bool) -> list[str]:
    """The named resume bugs (user/diagnosis.py) in a custom round trip's records."""
    from ..properties.baseline import fresh_training
    from ..zoo import scheduler_state

    _, optim, sched, _ = fresh_training(case)
    return likely_causes(save_obs, load_obs, fresh_groups=optim.state_dict()["param_groups"],
                         fresh_sched=scheduler_state(sched),
                         saved_step=case.steps if app_state else None)


def evaluate_user(case: Case, save_obs: list[SaveRecord], load_obs: list[LoadRecord],
                  workdir: Path, *, exp: Expectation = EXACT) -> dict[str, Verdict]:
    """A built-in path with a user model: ``round_trip_verdicts`` against ``exp``, with the
    precision of the user's own mixed precision for P2 and P6."""
    v = round_trip_verdicts(case, save_obs, load_obs, workdir, exp=exp)
    mp = own_mp_of(save_obs)
    if not judged_dtype(case, mp)[1]:  # else round_trip_verdicts said it already
        v.update({p: with_precision(case, v[p], own_mp=mp) for p in ("P2", "P6")})
    return v


