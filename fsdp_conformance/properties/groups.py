"""P11, written once: every param group (its hyperparameters, extra keys such as
``initial_lr``, its params) and what trainers checkpoint beside the optimizer (the LR
scheduler, the step counter) survive the save and the load, exactly. Every observer (the
conformance run's paths of either family, a user's own path, the FSDP2 differential
observer) hands it the saved full dict, one ``LoadedGroups`` per (load path, rank) and what
else it saw.

Rules
- With ``at_save`` (the optimizer's own groups at the save: the single-process run's), the
  saved dict's groups equal them, params compared per group as sets (their order follows
  FSDP's units, not the optimizer's).
- On every rank that loaded, the groups after the load equal the saved dict's as this torch
  is expected to load them (properties/expectation.py, as on that rank): every value with its
  type (a tuple stays a tuple). Params are compared too where the groups name them by FQN
  (``LoadedGroups.by_fqn``: a dict from the state-dict API); an optimizer's own
  ``state_dict()`` of flat params names units, not FQNs, so there only the rest is compared.
- A rank with no groups (its load raised, or it did not run) is not compared; when no rank
  was, P11 is that rank's problem: a load that raised is an error (P11 checked nothing after
  the load), one the observer reports under another property is n/a.
- With ``training`` (``TrainingSeen``), its problems (properties/training_state.py) are more
  problems of P11; a pass says what held.
- Every difference on every rank is reported.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..sut.records import error_of
from .expectation import EXACT, Expectation
from .statediff import diff_state_dicts, format_diff
from .training_state import TrainingSeen, training_problems, with_problems
from .verdict import Verdict, error, fail, passed


@dataclass(frozen=True, kw_only=True)
class LoadedGroups:
    """The param groups one rank's optimizer holds after one load path."""

    rank: int
    """The rank."""
    label: str = ""
    """The load path ("" for a round trip's one load)."""
    got: list | None = None
    """Its ``param_groups`` (neutral named form); None when there are none to compare."""
    problem: Verdict | None = None
    """Why there are none: "error" (the load raised), "n/a" (another property reports it,
    or the path did not run)."""
    by_fqn: bool = False
    """The groups name their params by FQN: the params are compared too (module rules)."""


def _hyper(groups: list[dict]) -> list[dict]:
    return [{k: v for k, v in g.items() if k != "params"} for g in groups]


def canon_groups(d: dict) -> dict:
    """``d`` with each param group's ``params`` sorted: the order of FQNs inside a group
    follows the FSDP units' flat order, not the optimizer's, and carries no meaning in an
    FQN-keyed dict (which params are in which group does)."""
    return {**d, "param_groups": [{**g, "params": sorted(g["params"], key=str)}
                                  for g in d.get("param_groups", [])]}


def loaded_groups(load_obs: Sequence) -> list[LoadedGroups]:
    """What P11 judges of a round trip's load ranks' records (``sut.records.LoadRecord``):
    the groups of each rank's optimizer after the load, or the error its load raised."""
    out = []
    for o in load_obs:
        e = error_of(o.loaded)
        out.append(LoadedGroups(rank=o.rank, problem=error(e)) if e else
                   LoadedGroups(rank=o.rank, got=o.loaded["param_groups"]))
    return out


def p11_groups(full: dict, loaded: Sequence[LoadedGroups], *, at_save: dict | None = None,
               training: TrainingSeen | None = None, exp: Expectation = EXACT,
               in_memory: bool = False) -> Verdict:
    """P11 of the saved full dict ``full``, as this torch is expected to save and load under
    ``exp`` (module rules). ``in_memory``: ``full`` is the optimizer's state in memory at
    the save, not a dict torch saved (a user's own format): a difference from ``at_save``
    is then the training's, before any checkpoint, and is said so."""
    problems = []
    if at_save is not None:
        diffs = diff_state_dicts(canon_groups(exp.saved(at_save))["param_groups"],
                                 canon_groups(full)["param_groups"])
        if diffs:
            problems.append(("the optimizer's param_groups at the save (in memory, before any "
                             "checkpoint) differ from the single-process run's at the same "
                             "step: the training drove them apart, not the checkpoint"
                             if in_memory else
                             "saved param_groups differ from the optimizer's") + ":\n"
                            + format_diff(diffs))
    compared = 0
    for s in loaded:
        if s.got is None:
            continue
        compared += 1
        want = exp.on_rank(s.rank).loaded(full).get("param_groups", [])
        diffs = (diff_state_dicts(want, s.got) if s.by_fqn
                 else diff_state_dicts(_hyper(want), _hyper(s.got)))
        if diffs:
            problems.append(f"rank {s.rank}: param_groups after {s.label or 'loading'} differ"
                            f":\n" + format_diff(diffs))
    extra, notes = training_problems(training) if training is not None else ([], [])
    if problems:
        return with_problems(fail("\n\n".join(problems)), extra, "", notes)
    missing = [s.problem for s in loaded if s.got is None and s.problem is not None]
    if loaded and not compared and missing:
        first = missing[0]
        verdict = (error("load failed on every rank, so no param group after loading could "
                         "be compared: " + first.detail) if first.status == "error" else first)
        return with_problems(verdict, extra, "", notes)  # an error or n/a: with them added
    want = _hyper(exp.loaded(full).get("param_groups", []))
    keys = sorted({k for g in want for k in g})
    label = {s.label for s in loaded if s.label}
    verdict = passed(f"{', '.join(sorted(label)) + ': ' if label else ''}{len(want)} group(s), "
                     f"keys {keys}")
    return with_problems(verdict, extra, training.held, notes) if training is not None \
        else verdict
