"""The plugin's kinds of case (run/lifecycle.py ``CaseKind``): a user's own model through a
built-in path, and a user's own save/load functions (``CustomPath``).

Rules
- A user model is registered (``UserModel.register``) in the controller and, before every
  call, on each rank (``rank_side``).
- Built-in path with a user model: the run's round trip (``run.roundtrip_kind``: a save
  that raised ends it, ``save_raised``; the load, the chain and the judging are one
  ``load_and_judge``), its properties those of ``round_trip_verdicts``, with P10 from the
  evidence where the zoo's rule does not know the model (``verdicts``).
- Custom path: separate stages (``rank_side.rank_custom``: train, save, load, resume,
  again); a stage that raises is recorded and the later stages that still make sense run.
  Each stage returns the fields it fills; merged per rank, they make one ``SaveRecord`` /
  ``LoadRecord`` (``sut.records``), judged as the built-in paths' records are.
  Failing to build or train the model under FSDP fails every property it decides; the file
  format is the user's own, so P1/P4/P5/P8/P9 are n/a.
- Known torch limitations see the case as the zoo case it stands for (``known_view``). In a
  custom path they are recognised by their exact effect only (``known.apply.recognise``,
  trying each built-in path of the case's family the user's code could have taken).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..cases import Case
from ..harness.errors import RankDied, RankError
from ..known.apply import recognise
from ..properties import chain
from ..properties.expectation import EXACT, Expectation
from ..properties.verdict import Verdict, fail
from ..run.lifecycle import Outcome, Step, StepFailed, all_props
from ..run.roundtrip_kind import RoundTripKind, load_and_judge, save_raised
from ..sut.records import LoadRecord, SaveRecord
from ..api_paths import paths_of
from .limitations import known_view
from .model import CustomPath, UserModel
from .own_code import OwnCode
from .spec import DEFAULT_PATHS
from .rank_side import CKPT_DIR, rank_custom, rank_load, rank_save
from .rank_errors import rank_error_text
from .verdicts import CUSTOM_DECIDES, custom_undecided, evaluate_custom, evaluate_user


def _death(exc: StepFailed) -> str:
    """The failure text when a rank process died in the stage (a signal, an OOM kill: the
    machine or a rare native crash, not necessarily the user's code), else ""."""
    return str(exc) if isinstance(exc.exc, RankDied) else ""

@dataclass(frozen=True, kw_only=True)
class UserModelKind(RoundTripKind):
    """A built-in API path with the user's own model (module rules)."""

    user: UserModel
    """The user's model, optimizer and data."""
    name = "user-model round-trip"

    def run(self, step: Step) -> Outcome:
        case = step.case
        self.user.register()
        save_obs = step.on_pool("save side", case.world_size, rank_save,
                                before=(self.user, None))
        step.timings["save"] = max(o.timings.get("save", 0.0) for o in save_obs)
        failed = save_raised(case, save_obs)
        if failed is not None:  # nothing was written: a load would only report a missing file
            return Outcome(verdicts=all_props(failed, self.decides(case)))
        return load_and_judge(step, save_obs, step.workdir, rank_load, evaluate_user,
                              self.decides(case), before=(self.user, None))

    def known_case(self, case: Case) -> Case:
        """The case known/entries.py sees (``known_view``)."""
        return known_view(case, self.user)


@dataclass(frozen=True, kw_only=True)
class CustomPathKind:
    """The user's own save and load functions (module rules)."""

    custom: CustomPath
    """The user's save/load functions."""
    user: UserModel | None = None
    """The user's model (None: the case's zoo model)."""
    name = "custom-path round-trip"

    def decides(self, case: Case) -> tuple[str, ...]:
        return CUSTOM_DECIDES

    def undecided(self, case: Case) -> dict[str, Verdict]:
        return custom_undecided()

    def known_case(self, case: Case) -> Case:
        """The case known/entries.py sees (``known_view``)."""
        return known_view(case, self.user)

    def run(self, step: Step) -> Outcome:
        case = step.case
        if self.user is not None:
            self.user.register()

        def stage(ws: int, name: str, at: Case = case, workdir=None) -> list[dict]:
            return step.on_pool(name if at is case else f"{name} (checkpoint "
                                f"{chain.number(case, at)})", ws, rank_custom,
                                before=(self.user, self.custom), after=(name,), case=at,
                                workdir=workdir)

        errors: dict[str, RankError] = {}
        died: list[str] = []  # the lifecycle reruns a case whose rank died (Outcome.died)
        try:
            save_obs = stage(case.world_size, "train")
        except StepFailed as exc:
            return Outcome(verdicts=all_props(fail(
                "building or training the model under FSDP raised:\n"
                + rank_error_text(exc.exc)), self.decides(case)), died=_death(exc))
        load_obs = None
        try:
            _merge(save_obs, stage(case.world_size, "save"))
            step.timings["save"] = max(o["timings"].get("save", 0.0) for o in save_obs)
        except StepFailed as exc:
            errors["save"] = exc.exc
            died.append(_death(exc))
        if "save" not in errors:
            try:
                load_obs = stage(case.dst_world_size, "load")
                step.timings["load"] = max(o["timings"].get("load", 0.0) for o in load_obs)
            except StepFailed as exc:
                errors["load"] = exc.exc
                died.append(_death(exc))
        links: list[chain.Link] = []
        if load_obs is not None:
            for name in ("resume", "again"):
                try:
                    _merge(load_obs, stage(case.dst_world_size, name))
                except StepFailed as exc:
                    errors[name] = exc.exc
                    died.append(_death(exc))
                if name == "resume" and not errors:  # what resumed saves the next checkpoint
                    links = _later_links(stage, case, step.workdir, died)  # before P7's loads
        saves, loads = _records(save_obs, load_obs)

        def judge(exp: Expectation) -> dict[str, Verdict]:
            app = self.custom.app_state
            v = chain.fold_links(
                evaluate_custom(case, saves, loads, errors, app_state=app, exp=exp,
                                workdir=step.workdir / CKPT_DIR), case,
                links, lambda link: evaluate_custom(
                    link.case, *_records(link.save_obs, link.load_obs), dict(link.errors),
                    app_state=app, exp=exp, continued=True, workdir=link.workdir / CKPT_DIR))
            return {p: v[p] for p in self.decides(case)}

        # known torch limitations, recognised in the user's code by their exact effect
        return Outcome(verdicts=recognise(known_view(case, self.user), _paths_first(case.family),
                                          judge(EXACT), judge),
                       died=next((d for d in died if d), ""))


def _merge(obs: list[dict], more: list[dict]) -> None:
    """One stage's records merged into the rank's record so far (timings added up)."""
    for o, m in zip(obs, more):
        o.update({k: v for k, v in m.items() if k != "timings"})
        o.setdefault("timings", {}).update(m.get("timings", {}))


def _records(save_obs: list[dict], load_obs: list[dict] | None):
    """The merged stages as one rank's save / load side, typed as the built-in paths' are
    (a stage field that is not a record field fails here, by name)."""
    return ([SaveRecord(**o) for o in save_obs],
            None if load_obs is None else [LoadRecord(**o) for o in load_obs])


def _later_links(stage, case: Case, workdir, died: list[str]) -> list[chain.Link]:
    """The chain's later checkpoints (properties/chain.py): the resumed state saved with the
    user's save ("chain" stage, on the ranks that resumed), then loaded and resumed at the
    next link's world size; a stage that raised ends the chain there (its error is that
    checkpoint's verdict)."""
    links: list[chain.Link] = []
    cur = case
    while cur.links > 1:
        nxt, workdir = cur.next_link(), chain.next_dir(workdir)
        errors: dict[str, RankError] = {}
        load_obs = None
        try:
            save_obs = stage(nxt.world_size, "chain", cur, workdir=workdir.parent)
        except StepFailed as exc:
            died.append(_death(exc))
            links.append(chain.Link(case=nxt, save_obs=(), load_obs=None, workdir=workdir,
                                    failed=OwnCode(errors={"save": exc.exc}).stopped()))
            break
        try:
            load_obs = stage(nxt.dst_world_size, "load", nxt, workdir)
            _merge(load_obs, stage(nxt.dst_world_size, "resume", nxt, workdir))
        except StepFailed as exc:
            errors["load" if load_obs is None else "resume"] = exc.exc
            died.append(_death(exc))
        links.append(chain.Link(case=nxt, save_obs=save_obs, load_obs=load_obs,
                                workdir=workdir, errors=errors))
        if errors:
            break
        cur = nxt
    return links


def _paths_first(family: str) -> list[str]:
    """The family's built-in paths, the ones a trainer calls today (the default paths of the
    quick tier) first: the path a recognised entry is named through."""
    every = list(paths_of(family))
    first = [a for a in DEFAULT_PATHS[(int(family[-1]), "quick")] if a in every]
    return first + [a for a in every if a not in first]
