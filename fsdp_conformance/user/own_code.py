"""The round-trip view of a user's own save and load functions (properties/view.py): the
file format is the user's, so what is judged is what the load restores.

Rules
- The state the save wrote is the gather of the save side's local dicts at the save (the
  state in memory: a correct save writes it); under a modelled torch bug, what that bug's
  save would have written (``Expectation.saved``), since no saved dict is observed.
- P1, P4, P5, P8 and P9 judge torch's own dicts and files: n/a.
- Where the user's load restores the weights (a training-state load, a model load
  function: ``rank_side.weights_theirs``), the suite restores nothing on its behalf, and P3
  also requires the weights right after the load to be the saved ones, bitwise ("weights
  not restored" otherwise).
- A save or load function that raised fails every load-side property with the ranks'
  errors (user/rank_errors.py); training after the load that raised fails P6.
- P7: the save leaves the optimizer unchanged, and load -> save -> load gives bitwise the
  state of the first load (properties/idempotent.py, given the state around each call);
  it also fails when the checkpoint was still being written when ``save_fn`` returned (an
  ``async_save`` whose Future was not waited for: ``rank_side.pending_writes``).
- With the training state (``save_fn(state, directory)``): P11 also holds the step the load
  restored (== the save's) and the scheduler's state after the load, P6 the scheduler's
  state after resuming.
- Whether the load restored each rank's random-number states is information shown in P6
  (``diagnosis.rng_note``), never a verdict: the suite's training draws none.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .. import reference as ref
from ..cases import Case
from ..properties.expectation import Expectation
from ..properties.family_refs import FamilyRefs
from ..properties.idempotent import SameState, p7_idempotent
from ..properties.training_state import TrainingSeen, with_problems
from ..properties.verdict import Verdict, error, fail, na
from ..properties.view import Saved, training_seen
from ..sut.records import LoadRecord, SaveRecord
from .diagnosis import rng_note, weights_not_restored
from .rank_errors import rank_error_text

THEIRS = "the file format is the user's own: judged by what the load restores (P3, P7)"
NOT_THEIRS: tuple[str, ...] = ("P1", "P4", "P5", "P8", "P9")
"""The properties of torch's own dicts and files: n/a (``THEIRS``)."""


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


@dataclass(frozen=True, kw_only=True)
class OwnCode:
    """The view of a user's save and load functions (module rules)."""

    errors: dict = field(default_factory=dict)
    """The RankError of each stage that raised ("save", "load", "resume", "again")."""
    app_state: bool = False
    """The user's functions checkpoint the training state (step and scheduler judged)."""
    precision_always: bool = True
    """See ``RoundTripView.precision_always``."""
    workdir: Path | None = None
    """The directory the user's save wrote, bound as evidence for the known effects that
    read torch's files where there are some (a DCP checkpoint's metadata: which rank's file
    holds a key); None: nothing to read."""

    def undecided(self, case: Case) -> dict[str, Verdict]:
        return {p: na(THEIRS) for p in NOT_THEIRS}

    def saved(self, case: Case, refs: FamilyRefs, save_obs: Sequence) -> Saved:
        try:
            full = refs.gather(refs.layout, [o.local for o in save_obs])
        except ref.StateDictMismatch as exc:
            return Saved(full=None, bad=error(
                f"reference gather rejected torch's local dicts: {exc}"), by_torch=False)
        return Saved(full=full, by_torch=False)

    def stopped(self) -> Verdict | None:
        for stage, what in (("save", "the save function"), ("load", "the load function")):
            if self.errors.get(stage) is not None:
                return fail(f"{what} raised:\n" + rank_error_text(self.errors[stage]))
        return None

    def resume_raised(self) -> Verdict | None:
        if self.errors.get("resume") is None:
            return None
        return fail("training after the load raised (the loaded state cannot be trained "
                    "on):\n" + rank_error_text(self.errors["resume"]))

    def of_torch(self, case: Case, refs: FamilyRefs, full: dict, save_obs: Sequence,
                 load_obs: Sequence, exp: Expectation) -> dict[str, Verdict]:
        return {}

    def p7(self, case: Case, refs: FamilyRefs, full: dict, save_obs: Sequence,
           load_obs: Sequence, exp: Expectation) -> Verdict:
        pairs, raised = _around_calls(save_obs, load_obs, self.errors.get("again"))
        return with_problems(p7_idempotent(pairs, raised=raised, summary=(
            "the save leaves the state unchanged; load -> save -> load bitwise the same")),
            _pending_saves(save_obs), "the save was complete when save_fn returned")

    def information(self, save_obs: Sequence, load_obs: Sequence) -> list[str]:
        note = rng_note(save_obs, load_obs)
        return [note] if note else []

    def weights(self, save_obs: Sequence, load_obs: Sequence, exp: Expectation) -> list[str]:
        found = weights_not_restored(save_obs, load_obs, exp)
        return [found] if found else []

    def training(self, case: Case, save_obs: Sequence, load_obs: Sequence,
                 local) -> TrainingSeen | None:
        return training_seen(case, save_obs, load_obs, local, case.steps) if self.app_state else None
