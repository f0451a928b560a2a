"""One case lifecycle: ``execute(case, env)`` for every kind of case.

Rules
- A kind of case (``CaseKind``: round trip, fault, golden fixture, bounds, a user's own path)
  says which properties it decides (``decides``), what the others are (``undecided``: n/a
  with the reason) and how to run (``run``). Everything else is the lifecycle's, and only
  here: the case's work directory (created empty, removed afterwards, nothing written
  anywhere else), the pools (``Step.on_pool``), the timings (``total`` always), turning a
  rank failure into verdicts, the known torch limitations, and the ``CaseResult``.
- ``execute`` never raises for a torch, rank or suite failure:
    a pool call that raises, dies or times out (``StepFailed``) -> every property the kind
        decides is "error" naming the step ("save side failed: ...", "load side hung: ...")
        with every rank's traceback or stack (the pool rebuilds itself); but when every
        failing rank raised ``NotApplicableHere`` (torch refused the configuration on this
        machine, sut/records.py), each is "n/a" with torch's refusal as the reason;
    any other exception -> "error" of origin "suite": a bug of this package, never turned
        "known" by a torch limitation.
- A rank process that died in a pool call (a signal: SIGABRT, SIGSEGV; an OOM kill; an
  exit), whether the call failed the step or the kind judged the death itself
  (``Outcome.died``: a user's own save that killed a rank), may be the machine or a rare
  race in torch's native code, not what the case checks:
  the case runs once more from the start on a fresh pool, and the second attempt's verdicts
  stand. The first death is never dropped: ``CaseResult.rerun`` keeps its failure text
  (which rank, which signal, the C++ reason and stack from the rank's log) and every report
  lists the case. A death that comes again is the case's "error" as before. (A fault
  case's load that kills a rank is judged by P15 itself, never rerun.)
  Ctrl-C (KeyboardInterrupt) and SystemExit propagate: the run decides what to keep.
- A removed torch API (run/removal.py) turns the verdicts that show it "removed"; then the
  known torch limitations (``known.apply``) are applied to every verdict of every kind, once,
  here: the kind's ``Outcome.judge`` is called again under each applicable ``Effect`` model
  while the case's files still exist (``known.apply.rejudge``), and every verdict is checked
  against the entries that match the case (``apply_known``). A kind never applies them itself.
"""
from __future__ import annotations

import hashlib
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from ..cases import Case
from ..properties.catalogue import PROPS
from ..properties.expectation import Expectation
from ..properties.verdict import Verdict, error, na, suite_error
from ..report.result import CaseResult
from ..options import RunOptions


@dataclass(frozen=True, kw_only=True)
class CaseEnv:
    """Where and how a case runs (one per run; the lifecycle adds the work directory)."""

    rundir: Path
    """The run's directory: each case gets a fresh sub-directory, removed after the case."""
    options: RunOptions = RunOptions()
    """The run's options (backend, timeouts, calibration), as the user gave them."""
    lane: int = 0
    """Which lane of the run executes the case: each lane has pools of its own
    (harness/registry.py), so cases on different lanes run side by side."""
    saves: Any = None
    """The lane's ``run.saves.SaveCache`` (round trips that differ only in how they load
    share a save); None: every case saves on its own."""


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What a kind's ``run`` decided."""

    verdicts: Mapping[str, Verdict]
    """Verdict of each property the kind decides (``CaseKind.decides``)."""
    measurements: Mapping[str, dict] = field(default_factory=dict)
    """A bounds case's measurements ({phase: measurement}); empty for other kinds."""
    judge: Callable[[Expectation], Mapping[str, Verdict]] | None = None
    """The kind's judge: its verdicts computed again from what its ranks recorded, against
    the expectation it is given. The lifecycle gives it each applicable known bug's
    ``Effect`` model
    (``known.apply.rejudge``) and checks the known limitations against those verdicts, in
    one place for every kind; None where nothing can be judged again."""
    died: str = ""
    """A rank process died in one of the kind's pool calls and the kind judged it itself
    (a user's own save that kills a rank): the death's text. The lifecycle runs the case
    once more, as for a death it sees (module rules); the second attempt's verdicts stand."""


class StepFailed(Exception):
    """A pool call of a case failed (a rank raised, died or hung): ``step`` names it."""

    def __init__(self, step: str, exc: BaseException, *, hung: bool) -> None:
        super().__init__(f"{step} {'hung' if hung else 'failed'}: {exc}")
        self.step, self.exc, self.hung = step, exc, hung


@dataclass(kw_only=True)
class Step:
    """The case being run, as a kind sees it: its work directory, its environment, its
    timings (seconds, by step) and the one way to run a rank function on a pool."""

    case: Case
    """The case."""
    env: CaseEnv
    """The run's environment."""
    workdir: Path
    """The case's own work directory (exists, empty at the start)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds by step ("save", "load"); the lifecycle adds "total"."""

    def on_pool(self, step: str, world_size: int, fn: Callable[..., Any], *,
                timeout: float | None = None, before: tuple = (), after: tuple = (),
                workdir: Path | None = None, case: Case | None = None) -> list:
        """``fn(ctx, *before, case, workdir, *after)`` on every rank of a pool of
        ``world_size`` ranks (``workdir``: the case's own unless given; ``case``: the
        step's unless given: a chain's later checkpoint); the ranks' results in rank order.
        A rank that raised, died or hung -> ``StepFailed``."""
        from ..harness import get_pool
        from ..harness.errors import RankError, RankTimeout

        try:
            return get_pool(world_size, self.env.options.backend, lane=self.env.lane).run(
                fn, *before, case or self.case, str(workdir or self.workdir), *after,
                seed=self.case.seed,
                timeout=self.env.options.timeout if timeout is None else timeout)
        except RankError as exc:
            raise StepFailed(step, exc, hung=isinstance(exc, RankTimeout)) from exc


class CaseKind(Protocol):
    """One kind of case. ``run`` may raise ``StepFailed`` (through ``Step.on_pool``); any
    other exception it lets out is a bug of the suite."""

    name: str

    def decides(self, case: Case) -> tuple[str, ...]:
        """The properties this case decides."""

    def undecided(self, case: Case) -> dict[str, Verdict]:
        """Every other property, n/a with the reason."""

    def run(self, step: Step) -> Outcome:
        """Run the case and decide ``decides(case)``."""

    # optional: ``known_case(case) -> Case``, the case the known limitations are looked up
    # for (a user's own model is matched as the zoo case it stands for; ``known_case``)
    # optional, for the run (run/execute.py): ``again(result) -> bool``, whether a decided
    # case runs once more after every other case, that later result standing; and
    # ``finish(results, options) -> (results, block)``, the run's results once every case is
    # decided, with what the kind adds for the run as a whole (``Run.scaling``)


def not_applicable_here(exc: StepFailed) -> str:
    """The reason, when every rank that failed the step raised ``NotApplicableHere`` (torch
    refused the configuration on this machine: sut/records.py); else ""."""
    from ..sut.records import NotApplicableHere

    fails = getattr(exc.exc, "failures", ())
    tag = f"exception {NotApplicableHere.__name__}"
    if not fails or any(f.kind != tag for f in fails):
        return ""
    last = [ln for ln in fails[0].detail.strip().splitlines() if ln.strip()][-1]
    return last.split(f"{NotApplicableHere.__name__}: ", 1)[-1]


def workdir_of(case: Case, rundir: Path) -> Path:
    """The case's work directory under ``rundir`` (a digest of its id: stable, short)."""
    return rundir / hashlib.sha1(case.id.encode()).hexdigest()[:16]


def all_props(v: Verdict, props: Sequence[str] = PROPS) -> dict[str, Verdict]:
    return {p: v for p in props}


def execute(case: Case, env: CaseEnv, kind: CaseKind) -> CaseResult:
    """Run one case of ``kind`` (run/kinds.py ``kind_of`` picks the run's) and return its
    ``CaseResult`` (module rules)."""
    from ..known.apply import apply_known
    from .removal import mark_removed

    t0 = time.perf_counter()
    first_death = ""
    for attempt in range(2):
        step, decided, measurements, modelled, died = _attempt(case, env, kind)
        if not died or attempt:
            break
        first_death = died  # a rank died: once more on a fresh pool (module rules)
    if first_death:
        first_death = (f"{first_death}\n(second attempt: "
                       f"{'a rank died again' if died else 'completed'})")
    verdicts = {**kind.undecided(case), **decided}
    missing = [p for p in PROPS if p not in verdicts]
    if missing:
        raise AssertionError(f"{kind.name} case {case.id}: no verdict for {missing}")
    step.timings["total"] = time.perf_counter() - t0
    ordered = mark_removed(case, {p: verdicts[p] for p in PROPS})
    judged = apply_known(known_case(kind, case), ordered, modelled)
    return CaseResult(case, judged, dict(step.timings), dict(measurements), rerun=first_death)


def known_case(kind: CaseKind, case: Case) -> Case:
    """The case the known limitations are looked up for: the kind's ``known_case(case)``
    where it has one (a user's optimizer counts as the zoo optimizer of its class), else
    ``case``."""
    view = getattr(kind, "known_case", None)
    return view(case) if view is not None else case


def _attempt(case: Case, env: CaseEnv, kind: CaseKind) -> tuple:
    """One run of the case in a fresh work directory: ``(step, decided, measurements,
    modelled, died)``, ``died`` the failure text when a rank process died in a pool call
    (harness ``RankDied``), else ""."""
    from ..harness.errors import RankDied

    workdir = workdir_of(case, env.rundir)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    step = Step(case=case, env=env, workdir=workdir)
    measurements: Mapping[str, dict] = {}
    modelled: Mapping[str, Mapping[str, Verdict]] = {}
    died = ""
    try:
        try:
            out = kind.run(step)
            decided, measurements, died = dict(out.verdicts), out.measurements, out.died
            if out.judge is not None:  # while the case's files are still there
                from ..known.apply import rejudge

                modelled = rejudge(known_case(kind, case), decided, out.judge)
        except StepFailed as exc:
            why = not_applicable_here(exc)
            decided = all_props(na(why) if why else error(str(exc)), kind.decides(case))
            if isinstance(exc.exc, RankDied):
                died = str(exc)
        except Exception:  # noqa: BLE001  (a bug of the suite: say so, keep going)
            decided = all_props(suite_error(f"the suite failed while running this {kind.name} "
                                            f"case:\n" + traceback.format_exc()),
                                kind.decides(case))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return step, decided, measurements, modelled, died
