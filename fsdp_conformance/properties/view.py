"""What one kind of round trip lets the judge see: the role behind which the run's API paths
and a user's own save/load code are judged by one orchestration (properties/roundtrip.py).

Rules
- A view says only what differs between kinds: where the state the save wrote comes from
  (torch's saved dict, or the state in memory at the save), which properties it can decide
  (torch's own dicts and files: P1, P4, P5, P8, P9), how P7 is seen (a resave of torch's
  dict, or the state around each of the user's calls), what the training state beside the
  optimizer holds, and a stage that raised.
- Everything else (P0, P2, P3, P6, P10, P11, the references, the single-process run, the
  precision) is judged the same way for every view.
- One module per view, as pytest-xdist has one per scheduler: ``properties/torch_files.py``
  (the run's paths), ``user/own_code.py`` (a user's save and load functions).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

from ..cases import Case
from .expectation import Expectation
from .family_refs import FamilyRefs
from .scheduler_probe import SchedulerProbe
from .training_state import TrainingSeen
from .verdict import Verdict


@dataclass(frozen=True, kw_only=True)
class Saved:
    """The state a round trip's save wrote, as one full dict."""

    full: dict | None
    """The full FQN-keyed optimizer state dict (None: it could not be had)."""
    bad: Verdict | None = None
    """Why there is none: the verdict every property that needs it carries."""
    per_rank: dict[int, dict] | None = None
    """Where each rank reads a file of its own (one file per rank), the full dict rank r's
    load meets: the ranks' shards with rank r's own copy of the entries every rank holds
    (params of ignored modules, trained per rank); None: every rank loads ``full``."""
    by_torch: bool = True
    """``full`` is the dict torch saved (judged against the modelled bug's expectation);
    False: the state in memory at the save, as a correct save writes it (the user's own
    format, unseen), so what a modelled bug's save writes is derived from it
    (``Expectation.saved``) and P2 judges it exactly."""


class RoundTripView(Protocol):
    """What one kind of round trip shows the judge (module rules)."""

    precision_always: bool
    """A P2/P6 verdict says the precision it was judged at even when it is the case's own
    (False: only where it is not: the run's details, which known pairs' digests read)."""

    @property
    def workdir(self) -> Path | None:
        """The case's files, bound as evidence for the effects that read them (None: none
        of torch's files to read)."""

    def undecided(self, case: Case) -> dict[str, Verdict]:
        """The round-trip properties this view cannot decide, each n/a with the reason."""

    def saved(self, case: Case, refs: FamilyRefs, save_obs: Sequence) -> Saved:
        """The state the save wrote (``Saved``)."""

    def stopped(self) -> Verdict | None:
        """The failure every load-side property (P3, P6, P7, P10, P11) carries when a save
        or load call raised before the load side's state existed; None: none did."""

    def resume_raised(self) -> Verdict | None:
        """P6's failure when training after the load raised; None: it did not."""

    def of_torch(self, case: Case, refs: FamilyRefs, full: dict, save_obs: Sequence,
                 load_obs: Sequence, exp: Expectation) -> dict[str, Verdict]:
        """The properties of torch's own dicts and files this view decides (P1, P4, P5,
        P8, P9; none where the format is not torch's)."""

    def p7(self, case: Case, refs: FamilyRefs, full: dict, save_obs: Sequence,
           load_obs: Sequence, exp: Expectation) -> Verdict:
        """P7 (properties/idempotent.py) as this view sees the saves and loads."""

    def training(self, case: Case, save_obs: Sequence, load_obs: Sequence,
                 local) -> TrainingSeen | None:
        """The training state beside the optimizer judged by P11 and P6 (None: none)."""

    def information(self, save_obs: Sequence, load_obs: Sequence) -> list[str]:
        """Lines P6 shows whatever its status, never a failure (a user's load restoring the
        random-number states or not); none for the run's paths."""

    def weights(self, save_obs: Sequence, load_obs: Sequence, exp: Expectation) -> list[str]:
        """P3's problems with the model weights after the load, where the load under test
        restores them, against ``exp`` (none where the suite does)."""


def training_seen(case: Case, save_obs: Sequence, load_obs: Sequence, local,
                  step: int | None) -> TrainingSeen:
    """The training state judged beside the optimizer: the scheduler (by what it does:
    ``scheduler_probe.SchedulerProbe``) and, where the load must restore one (``step``),
    the step."""
    return TrainingSeen(save_obs=save_obs, load_obs=load_obs, local=local, step=step,
                        held=("" if step is None else f"step {step} and ")
                        + "the scheduler restored", probe=SchedulerProbe(case))
