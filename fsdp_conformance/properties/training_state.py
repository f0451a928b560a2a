"""What trainers checkpoint beside the optimizer: the LR scheduler and the step counter. One
definition: P11 (properties/groups.py) and P6 (``run_props.p6_resume``) add its problems
(``training_problems``, ``resumed_problems``).

Rules
- P11: on every save rank the scheduler's ``state_dict()`` at the save equals the
  single-process run's; on every load rank the scheduler's state right after the load
  equals the state at the save, and where a step is restored (a training state's
  ``step``, an app state's), it is the save's.
- P6: on every load rank the scheduler's state after resuming equals the uninterrupted
  run's (its ``last_epoch``, the learning rates it produced: ``_last_lr``, the child
  schedulers of a composition).
- Each difference is one line naming the key, the expected and the seen value, and the
  ranks it was seen on (``by_ranks``); a verdict takes them as more problems
  (``with_problems``). A scheduler field whose difference changes nothing the scheduler
  does (its lrs, its other fields: properties/scheduler_probe.py, by experiment) is
  information shown beside the verdict, never a problem.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .scheduler_probe import judged_diffs
from .verdict import Verdict, fail, passed


def by_ranks(per_rank: Sequence[tuple[int, list[str]]], side: str = "") -> list[str]:
    """Problems found on several ranks, each once: ``rank 0: X`` / ``ranks [0, 1, 2]: X``."""
    ranks: dict[str, list[int]] = {}
    for r, found in per_rank:
        for d in found:
            ranks.setdefault(d, []).append(r)
    return [f"{side}{'rank ' + str(rs[0]) if len(rs) == 1 else 'ranks ' + str(rs)}: {d}"
            for d, rs in ranks.items()]


@dataclass(frozen=True, kw_only=True)
class TrainingSeen:
    """What the ranks recorded of the training state beside the optimizer (P11's part)."""

    save_obs: Sequence[Any]
    """The save ranks' records (``sched``)."""
    load_obs: Sequence[Any]
    """The load ranks' records (``sched_loaded``, ``step_loaded``)."""
    local: Any
    """The single-process run (``sched_at_save``)."""
    step: int | None = None
    """The step the load must restore (None: nothing restores one)."""
    held: str = "the scheduler restored"
    """What a passing P11 adds that held."""
    probe: Any = None
    """The case's ``scheduler_probe.SchedulerProbe``: which scheduler differences change
    what the scheduler does (None: every difference is a problem)."""


def training_problems(seen: TrainingSeen) -> tuple[list[str], list[str]]:
    """P11's part (module rules; properties/groups.py adds them to P11's verdict), as
    (problems, information): a scheduler field whose difference changes nothing the
    scheduler does is information (properties/scheduler_probe.py)."""
    notes: list[tuple[int, list[str]]] = []

    def judged(rank: int, what: str, want, got) -> list[str]:
        problems, info = judged_diffs(what, want, got, seen.probe)
        notes.append((rank, info))
        return problems

    def loaded(o) -> list[str]:
        lines = ([] if seen.step is None or o.step_loaded == seen.step else
                 [f"the step after the load is {o.step_loaded!r}, expected {seen.step} (the "
                  f"step the checkpoint was taken at)"])
        return lines + judged(o.rank, "scheduler after the load vs at the save",
                              seen.local.sched_at_save, o.sched_loaded)

    problems = by_ranks([(o.rank, judged(o.rank, "scheduler vs the single-process run",
                                         seen.local.sched_at_save, o.sched))
                         for o in seen.save_obs], "save side, ")
    problems += by_ranks([(o.rank, loaded(o)) for o in seen.load_obs])
    return problems, by_ranks(notes)


def resumed_problems(load_obs: Sequence, local, probe=None) -> tuple[list[str], list[str]]:
    """P6's part (module rules; run_props.p6_resume adds them to P6's verdict): the
    scheduler after resuming vs the uninterrupted run, as (problems, information)."""
    found = [(o.rank, judged_diffs("scheduler after resuming vs the uninterrupted run",
                                   local.sched_at_end, o.sched_final, probe))
             for o in load_obs]
    return (by_ranks([(r, p) for r, (p, _) in found]),
            by_ranks([(r, n) for r, (_, n) in found]))


def with_problems(verdict: Verdict, problems: list[str], what: str,
                  notes: Sequence[str] = ()) -> Verdict:
    """``verdict`` with more problems: a fail listing them after its own (a pass becomes a
    fail; an error or n/a stays, with them added); no problems: a pass says ``what`` held.
    ``notes``: information shown after the rest, whatever the status (they never fail)."""
    if notes:
        v = with_problems(verdict, problems, what)
        return Verdict(v.status, v.detail + "\n\n" + "\n".join(notes))
    if not problems:
        return verdict if verdict.status != "pass" else passed(f"{verdict.detail}; {what}")
    text = "\n".join(problems)
    if verdict.status == "fail":
        return fail(verdict.detail + "\n\n" + text)
    if verdict.status == "pass":
        return fail(text)
    return Verdict(verdict.status, verdict.detail + "\n\n" + text)
