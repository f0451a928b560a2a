"""Whether a difference in an LR scheduler's state changes what the scheduler does: decided
by experiment, for the case's own scheduler class (the zoo's or a user's), never by a list of
field names.

Rules
- A restored scheduler is right when it drives the same learning rate in every param group
  as the expected one and holds the same value of every field its class's code reads. Which
  fields those are is found by running the class: a fresh scheduler of the case
  (``baseline.fresh_training``) is restored from the expected state, and another from the
  expected state with the observed values of the differing fields put in; each then steps
  ``PROBE_STEPS`` times, both from the optimizer's lrs of the expected state (its
  ``_last_lr``: the optimizer's own lr is judged with its param groups, not here). The
  difference is consequential when any group's lr after any step, any other field at the
  end, or what raised differs between the two.
- Each differing field is tried alone, then all the inconsequential ones together (two
  fields that matter only jointly are not let through). A field whose substitution changes
  nothing is information, shown beside the verdict, never a failure (torchtune rebuilds its
  ``LambdaLR`` from the step, so ``_step_count`` restarts: ``LambdaLR`` never reads it); a
  consequential one fails, naming the field and the first lr (or field) that differs.
- Where the experiment cannot be run (no scheduler to build, a state that does not load)
  every difference is consequential: nothing is let through unproven.
"""
from __future__ import annotations

import copy
import functools
import warnings
from dataclasses import dataclass

from ..cases import Case
from .baseline import fresh_training

PROBE_STEPS = 100
"""Steps each probe scheduler takes: far past every resumed run of the suite, so a field read
only at a later step (a step size, a warm-up length) shows."""


def state_diffs(what: str, want: dict | None, got: dict | None) -> list[str]:
    """The keys where two scheduler ``state_dict()``s differ: ``what: key: want X, got Y``."""
    if want == got:
        return []
    if want is None or got is None:
        return [f"{what}: expected {'no scheduler state' if want is None else want}, got "
                f"{'none' if got is None else got}"]
    return [f"{what}: {k!r}: expected {want.get(k, '<missing>')!r}, got {got.get(k, '<missing>')!r}"
            for k in sorted(set(want) | set(got), key=str) if want.get(k) != got.get(k)]


def _run(case: Case, state: dict, start: list | None = None
         ) -> tuple[list[list[float]], dict | None, str]:
    """Step a fresh scheduler of ``case`` restored from ``state``, its optimizer's groups at
    the lrs ``start`` (the expected state's ``_last_lr``: the optimizer's lr is the
    optimizer's to restore, judged by P11's param groups, not a scheduler field): the lrs
    after each step, the state at the end, and what raised ("" if nothing)."""
    _, optim, sched, _ = fresh_training(case)
    if sched is None:
        return [], None, "the case builds no scheduler"
    try:
        sched.load_state_dict(copy.deepcopy(state))
    except Exception as exc:  # noqa: BLE001  (a state that does not load: consequential)
        return [], None, f"load_state_dict raised {type(exc).__name__}: {exc}"
    for group, lr in zip(optim.param_groups, state.get("_last_lr") if start is None else start):
        group["lr"] = lr
    lrs: list[list[float]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lr_scheduler.step() before optimizer.step()
        for _ in range(PROBE_STEPS):
            try:
                sched.step()
            except Exception as exc:  # noqa: BLE001
                return lrs, sched.state_dict(), f"step {len(lrs) + 1} raised " \
                                                 f"{type(exc).__name__}: {exc}"
            lrs.append([g["lr"] for g in optim.param_groups])
    return lrs, copy.deepcopy(sched.state_dict()), ""


def _first_difference(a, b, skip: set[str]) -> str:
    """The first way run ``b`` differs from run ``a`` (``_run``'s results), "" if none."""
    (lrs_a, end_a, raised_a), (lrs_b, end_b, raised_b) = a, b
    for step, (la, lb) in enumerate(zip(lrs_a, lrs_b), 1):
        for g, (x, y) in enumerate(zip(la, lb)):
            if x != y:
                return (f"the lr of group {g} after {step} step(s) would be {y!r} instead of "
                        f"{x!r}")
    if raised_a != raised_b:
        return f"it raises where the expected one does not: {raised_b}" if raised_b else \
            f"it does not raise where the expected one does ({raised_a})"
    if len(lrs_a) != len(lrs_b):
        return f"it steps {len(lrs_b)} time(s) where the expected one steps {len(lrs_a)}"
    for k in sorted(set(end_a or {}) | set(end_b or {}), key=str):
        if k in skip:
            continue
        if (end_a or {}).get(k) != (end_b or {}).get(k):
            return (f"its {k!r} after {len(lrs_a)} step(s) would be {(end_b or {}).get(k)!r} "
                    f"instead of {(end_a or {}).get(k)!r}")
    return ""


@dataclass(frozen=True)
class SchedulerProbe:
    """The experiment of the module rules for one case's scheduler."""

    case: Case
    """The case whose scheduler (``baseline.fresh_training``) is stepped."""

    def consequences(self, want: dict, got: dict) -> dict[str, str]:
        """For every field where ``got`` differs from ``want``: "" where putting ``got``'s
        value in changes nothing (information), else the first difference it makes."""
        keys = sorted((k for k in set(want) | set(got) if want.get(k) != got.get(k)), key=str)
        if not keys:
            return {}
        start = want.get("_last_lr") or []
        base = _run(self.case, want, start)
        if base[2] and not base[0] and base[1] is None:  # nothing to probe with
            return {k: f"not proven harmless ({base[2]})" for k in keys}
        out = {}
        for k in keys:
            trial = {**want, k: copy.deepcopy(got[k])} if k in got else \
                {x: v for x, v in want.items() if x != k}
            out[k] = _first_difference(base, _run(self.case, trial, start), {k})
        harmless = [k for k in keys if not out[k]]
        if len(harmless) > 1:
            trial = {**want, **{k: copy.deepcopy(got[k]) for k in harmless if k in got}}
            trial = {x: v for x, v in trial.items() if x in got or x not in harmless}
            joint = _first_difference(base, _run(self.case, trial, start), set(harmless))
            if joint:
                out.update({k: f"with {harmless} together, {joint}" for k in harmless})
        return out

    @functools.cached_property
    def name(self) -> str:
        """The scheduler's class name (what reads or does not read a field); built once per
        probe, which judges every rank's differences of the case."""
        sched = fresh_training(self.case)[2]
        return type(sched).__name__ if sched is not None else "the scheduler"


def judged_diffs(what: str, want: dict | None, got: dict | None,
                 probe: SchedulerProbe | None) -> tuple[list[str], list[str]]:
    """The differences of two scheduler ``state_dict()``s as (problems, information): a
    field whose observed value changes nothing the scheduler does (``SchedulerProbe``) is
    information; every other difference is a problem naming what it changes. Without a
    probe (or a state), every difference is a problem."""
    if want == got:
        return [], []
    if probe is None or want is None or got is None:
        return state_diffs(what, want, got), []
    effects = probe.consequences(want, got)
    name = probe.name
    problems, notes = [], []
    for k, effect in effects.items():
        line = (f"{what}: {k!r}: expected {want.get(k, '<missing>')!r}, got "
                f"{got.get(k, '<missing>')!r}")
        if effect:
            problems.append(f"{line} ({name} reads it: {effect})")
        else:
            notes.append(f"{line} (information: {name} does not read it: with it, every "
                         f"group's lr over the next {PROBE_STEPS} steps and every other "
                         f"field are the same)")
    return problems, notes
