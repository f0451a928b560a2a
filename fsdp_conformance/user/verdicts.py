"""The verdicts of a user round trip, judged by the one round-trip judge
(properties/roundtrip.py ``judge_round_trip``) through the view of what ran: a built-in path
with a user model (``evaluate_user``: ``TorchFiles``, at the precision of the user's own
mixed precision) and the user's own save/load code (``evaluate_custom``: ``OwnCode``).

Rules
- A custom round trip decides P0, P2, P3, P6, P7, P10 and P11 (``CUSTOM_DECIDES``); the rest
  are n/a with the reason (``custom_undecided``).
- The named resume bugs found in a custom round trip's records (user/diagnosis.py) are
  written first in each failing P0, P3, P6 and P11.
"""
from __future__ import annotations

from pathlib import Path

from ..cases import Case
from ..properties.catalogue import ONLY_BOUNDS, ONLY_CRASH, ONLY_GOLDEN
from ..properties.expectation import EXACT, Expectation
from ..properties.roundtrip import judge_round_trip
from ..properties.torch_files import TorchFiles
from ..properties.verdict import Verdict, na
from ..sut.records import LoadRecord, SaveRecord
from .diagnosis import likely_causes, stateless_at_save, with_causes
from .own_code import NOT_THEIRS, THEIRS, OwnCode

CUSTOM_DECIDES: tuple[str, ...] = ("P0", "P2", "P3", "P6", "P7", "P10", "P11")
"""The properties a custom-path round trip decides."""


def custom_undecided() -> dict[str, Verdict]:
    """The n/a of a custom-path round trip beyond P0-P11's (``OwnCode.undecided``)."""
    return {"P12": na(ONLY_GOLDEN), **{p: na(w) for p, w in ONLY_BOUNDS.items()},
            "P15": na("not a bad-input case"), "P16": na(ONLY_CRASH),
            **{p: na(THEIRS) for p in NOT_THEIRS}}


def evaluate_custom(case: Case, save_obs: list[SaveRecord], load_obs: list[LoadRecord] | None,
                    errors: dict | None = None, app_state: bool = False, *,
                    exp: Expectation = EXACT, continued: bool = False,
                    workdir: Path | None = None) -> dict[str, Verdict]:
    """P0-P11 of a custom-path round trip (user/own_code.py), against ``exp``, the likely
    causes first in the failing ones. ``errors``: the RankError of a stage ("save", "load",
    "resume", "again"), if it raised; ``load_obs`` is None when the load side never ran.
    ``app_state``: the user's functions checkpoint the training state (step and scheduler
    judged too). ``continued``: a chain's later checkpoint (properties/chain.py).
    ``workdir``: the directory the user's save wrote (``OwnCode.workdir``)."""
    view = OwnCode(errors=errors or {}, app_state=app_state, workdir=workdir)
    v = judge_round_trip(case, save_obs, load_obs, view, exp=exp, continued=continued)
    if view.stopped() is not None or load_obs is None:  # the call that raised is the cause,
        raised = (errors or {}).get("load")
        return with_causes(v, stateless_at_save(save_obs, str(raised)) if raised is not None
                           else [], props=("P3",))  # and what the checkpoint lacked
    return with_causes(v, _causes(case, save_obs, load_obs, app_state))


def _causes(case: Case, save_obs, load_obs, app_state: bool) -> list[str]:
    """The named resume bugs (user/diagnosis.py) in a custom round trip's records."""
    from ..properties.baseline import fresh_training
    from ..zoo import model_spec, scheduler_state

    _, optim, sched, _ = fresh_training(case)
    return likely_causes(save_obs, load_obs, fresh_groups=optim.state_dict()["param_groups"],
                         fresh_sched=scheduler_state(sched),
                         saved_step=case.steps if app_state else None,
                         ignored=model_spec(case.model).ignored)


def evaluate_user(case: Case, save_obs: list[SaveRecord], load_obs: list[LoadRecord],
                  workdir: Path, *, exp: Expectation = EXACT,
                  continued: bool = False) -> dict[str, Verdict]:
    """A built-in path with a user model (``TorchFiles``), against ``exp``; P2 and P6 always
    say the precision of the user's own mixed precision they were judged at.
    ``continued``: a chain's later checkpoint (properties/chain.py)."""
    return judge_round_trip(case, save_obs, load_obs,
                            TorchFiles(workdir=workdir, precision_always=True), exp=exp,
                            continued=continued)
