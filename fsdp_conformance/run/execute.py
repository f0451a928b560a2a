"""The conformance run: every case through the one lifecycle (run/lifecycle.py), in order.

Rules
- One run directory (a fresh temporary directory, removed at the end) holds every case's
  work directory; nothing is written anywhere else.
- A bounds case still failing P13 or P14 after its own second measurement is measured again
  after every other case of the run (load on a shared machine comes in bursts of seconds to
  minutes), and that later result stands. Then the scaling fit of each path and phase over
  the run's bounds cases is computed, once (``Run.scaling``), and folds into P13 of the
  path's largest-world-size bounds case; the report stores the same block.
- An interrupted run (Ctrl-C, SIGTERM, the CI job's time limit) keeps what it decided:
  ``run_all`` returns the results of the cases decided so far with ``interrupted`` saying
  why, and the caller writes them as an incomplete report. The pools are torn down by the
  harness (every rank killed) before the interruption reaches here.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ..cases import Case
from .kinds import kind_of
from .lifecycle import CaseEnv, execute


@dataclass(frozen=True, kw_only=True)
class Run:
    """What a run decided."""

    results: list
    """One ``CaseResult`` per decided case, in the order the cases were given."""
    scaling: dict = field(default_factory=dict)
    """The scaling fit per path/phase over the bounds cases (bounds.rules.scaling_block);
    empty when the run had none."""
    interrupted: str = ""
    """Why the run stopped before every case was decided ("" = it did not)."""
    planned: int = 0
    """How many cases the run was given."""


class RunInterrupted(KeyboardInterrupt):
    """The run was asked to stop (SIGTERM): handled like Ctrl-C, with its own reason."""


def run_case(case: Case, rundir: Path, *, backend: str | None, timeout: float,
             fault_timeout: float = 30.0,
             calibration: str | os.PathLike | None = None):
    """One case's ``CaseResult`` (run/lifecycle.py ``execute``); never raises for a torch,
    rank or suite failure."""
    env = CaseEnv(rundir=Path(rundir), backend=backend, timeout=timeout,
                  fault_timeout=fault_timeout,
                  calibration=None if calibration is None else str(calibration))
    return execute(case, env, kind_of(case))


def apply_scaling(results: Sequence, block: dict) -> list:
    """``results`` with each path's scaling fit (``block``) folded into P13 of its
    largest-world-size bounds case of the fitted model."""
    from ..bounds import rules as bounds
    from ..properties.bounds_props import scaling_verdict

    out = list(results)
    for key, s in block.items():
        api = key.rsplit("/", 1)[0]
        idx = [i for i, r in enumerate(out) if r.case.bounds and r.case.api == api
               and r.case.model == bounds.BOUNDS_MODEL and r.measurements]
        if not idx:
            continue
        i = max(idx, key=lambda j: out[j].case.world_size)
        p13 = scaling_verdict(out[i].properties["P13"], s)
        out[i] = dataclasses.replace(out[i], properties={**out[i].properties, "P13": p13})
    return out


def run_all(cases: Sequence[Case], *, backend: str | None = None, timeout: float = 120.0,
            fault_timeout: float = 30.0,
            on_result: Callable[[object], None] | None = None,
            calibration: str | os.PathLike | None = None) -> Run:
    """Run every case in order (module rules); ``on_result`` sees each result as it lands.
    Ctrl-C or ``RunInterrupted`` ends the run early with the results so far."""
    results: list = []
    rundir = Path(tempfile.mkdtemp(prefix="fsdpc-run-"))
    interrupted = ""
    try:
        for case in cases:
            r = run_case(case, rundir, backend=backend, timeout=timeout,
                         fault_timeout=fault_timeout, calibration=calibration)
            results.append(r)
            if on_result is not None:
                on_result(r)
        for i, r in enumerate(results):  # failing bounds cases: once more, later (rules)
            if r.case.bounds and any(r.properties[p].status == "fail" for p in ("P13", "P14")):
                results[i] = run_case(r.case, rundir, backend=backend, timeout=timeout,
                                      fault_timeout=fault_timeout, calibration=calibration)
    except KeyboardInterrupt as exc:
        interrupted = (str(exc) or "interrupted (Ctrl-C)") if isinstance(exc, RunInterrupted) \
            else "interrupted (Ctrl-C)"
        interrupted += f" after {len(results)} of {len(cases)} cases"
    finally:
        shutil.rmtree(rundir, ignore_errors=True)
    from ..bounds.rules import scaling_of

    block = scaling_of(results, calibration)
    if block:
        results = apply_scaling(results, block)
    return Run(results=results, scaling=block, interrupted=interrupted, planned=len(cases))


def run_cases(cases: Sequence[Case], *, backend: str | None = None, timeout: float = 120.0,
              fault_timeout: float = 30.0,
              on_result: Callable[[object], None] | None = None,
              calibration: str | os.PathLike | None = None) -> list:
    """Every case's ``CaseResult`` (``run_all``); an interruption propagates as
    KeyboardInterrupt (a library call has no report to keep)."""
    run = run_all(cases, backend=backend, timeout=timeout, fault_timeout=fault_timeout,
                  on_result=on_result, calibration=calibration)
    if run.interrupted:
        raise KeyboardInterrupt(run.interrupted)
    return run.results
