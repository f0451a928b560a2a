"""The conformance run: every case through the one lifecycle (run/lifecycle.py), in order.

Rules
- One run directory (a fresh temporary directory, removed at the end) holds every case's
  work directory; nothing is written anywhere else.
- The run knows kinds only through their records and hooks (run/kinds.py): a case whose
  kind says ``again`` runs once more after every other case, and that later result stands
  (the bounds kind: a case still failing P13 or P14, since load on a shared machine comes in
  bursts); once every case is decided, each kind's ``finish`` passes over the results and
  adds its block for the run (``Run.scaling``: the bounds kind's scaling fit, folded into
  P13 of each path's largest-world-size bounds case; the report stores the same block).
- Lanes: every case but those of a kind that runs ``alone`` (bounds) runs on one of
  ``lanes`` lanes side by side, each
  lane a thread of the controller with pools of its own (``CaseEnv.lane``), taking the next
  case from one shared queue. A case is decided as it would be alone (its own seed, work
  directory and ranks; the controller's seeded draws are serialised, zoo ``seeded``), so a
  run gives the same verdicts and bits with any number of lanes. The cases that run alone
  (P13/P14 time and memory) run afterwards, one at a time on lane 0, the other lanes idle.
  ``default_lanes``: one per two cores on a CPU machine (gloo), 2 to 4 (as the memory
  holds), 1 on a single core; on 2 cores the CPU is
  otherwise a third idle (ws-1 cases, the controller judging, gloo's round trips, ranks
  waiting for a stranded peer), measured on 2 cores: the 548-case quick tier took 262 s on
  one lane and 179 s on two, with the same verdicts.
- Round trips that differ only in how they load share one save (run/saves.py): the cases
  are grouped by save, a lane takes a whole group, and its kept save serves the group's
  other cases.
- Results are kept and returned in the order the cases were given; ``on_result`` sees each
  result as it lands, on the calling thread.
- An interrupted run (Ctrl-C, SIGTERM, the CI job's time limit) keeps what it decided:
  ``run_all`` returns the results of the cases decided so far with ``interrupted`` saying
  why, and the caller writes them as an incomplete report. The pools are torn down (every
  rank killed) before the interruption reaches the caller.
"""
from __future__ import annotations

import os
import queue
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ..cases import Case
from .kinds import finish_kinds, kind_of, kind_record
from .lifecycle import CaseEnv, execute
from .saves import SaveCache, by_save
from ..options import DEFAULT_TIMEOUT_S, RunOptions


@dataclass(frozen=True, kw_only=True)
class Run:
    """What a run decided."""

    results: list
    """One ``CaseResult`` per decided case, in the order the cases were given."""
    scaling: dict = field(default_factory=dict)
    """What the kinds' ``finish`` added for the run as a whole: the scaling fit per
    path/phase over the bounds cases (bounds.rules.scaling_block); empty when the run had
    none."""
    interrupted: str = ""
    """Why the run stopped before every case was decided ("" = it did not)."""
    planned: int = 0
    """How many cases the run was given."""
    shared_saves: int = 0
    """Round trips that loaded from a save an earlier case of their lane ran (run/saves.py)
    instead of saving again."""
    reused_trainings: int = 0
    """Round trips whose save side took the model and optimizer a case of another path
    trained alike on their lane (sut/trained.py) instead of training."""


class RunInterrupted(KeyboardInterrupt):
    """The run was asked to stop (SIGTERM): handled like Ctrl-C, with its own reason."""


def run_case(case: Case, rundir: Path, options: RunOptions = RunOptions(), *, lane: int = 0,
             saves: SaveCache | None = None):
    """One case's ``CaseResult`` (run/lifecycle.py ``execute``) on the pools of ``lane``
    (``saves``: the lane's kept save, run/saves.py); never raises for a torch, rank or
    suite failure."""
    env = CaseEnv(rundir=Path(rundir), options=options, lane=lane, saves=saves)
    return execute(case, env, kind_of(case))


LANE_MEMORY_GIB = 6
"""Memory one lane may hold: its warm pools of world sizes 1-4 (10 rank processes of about
350 MiB, measured on the quick tier) and the controller's share, with room to spare."""


def _memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):  # not POSIX: no bound from memory
        return float("inf")


def default_lanes(backend: str | None) -> int:
    """How many lanes a run uses unless told (module rules): with gloo, one per two cores,
    at least 2 on a machine of 2 or more cores (measured on 2 cores: 2 lanes take 0.68 of
    one lane's time) and at most 4 (the controller judges every case in one process; more
    lanes wait on it), and no more than the memory holds (``LANE_MEMORY_GIB`` each); 1 on a
    single core; NCCL: 1 (its ranks hold a GPU each). Beyond that, split the run across
    jobs (``run --shard I/N``)."""
    if backend == "nccl":
        return 1
    cores = os.cpu_count() or 1
    if cores < 2:
        return 1
    return max(1, min(4, max(2, cores // 2), int(_memory_gib() // LANE_MEMORY_GIB)))


def _run_lanes(groups: Sequence[Sequence[tuple[int, Case]]], lanes: int, decide: Callable,
               land: Callable[[int, object], None]) -> None:
    """``decide(case, lane)`` for every ``(index, case)`` of ``groups`` on ``lanes``
    threads, a lane taking a whole group at a time (run/saves.py: its cases share a save);
    ``land(index, result)`` on this thread as each result lands. An interruption (or any
    exception here) kills every pool's ranks, so no lane stays inside a call, and
    propagates."""
    from ..harness import close_pools

    work: queue.SimpleQueue = queue.SimpleQueue()
    for group in groups:
        work.put(list(group))
    todo = [item for group in groups for item in group]
    done: queue.SimpleQueue = queue.SimpleQueue()
    stop = threading.Event()

    def lane(n: int) -> None:
        while not stop.is_set():
            try:
                group = work.get_nowait()
            except queue.Empty:
                return
            for i, case in group:
                if stop.is_set():
                    return
                try:
                    done.put((i, decide(case, n), None))
                except BaseException as exc:  # noqa: BLE001  (handed to the calling thread)
                    done.put((i, None, exc))
                    return

    threads = [threading.Thread(target=lane, args=(n,), name=f"fsdpc-lane{n}", daemon=True)
               for n in range(lanes)]
    for t in threads:
        t.start()
    try:
        for _ in range(len(todo)):
            while True:
                try:
                    i, result, exc = done.get(timeout=0.5)
                    break
                except queue.Empty:
                    if not any(t.is_alive() for t in threads):
                        raise RuntimeError("every lane of the run stopped with cases left")
            if exc is not None:
                raise exc
            land(i, result)
    except BaseException:
        stop.set()
        close_pools(kill=True)
        for t in threads:  # a lane inside a case ends it (its calls fail) and takes no other
            t.join(30.0)
        close_pools(kill=True)  # any pool a lane started for that case's next call
        raise
    for t in threads:
        t.join()


def run_all(cases: Sequence[Case], options: RunOptions = RunOptions(), *,
            on_result: Callable[[object], None] | None = None) -> Run:
    """Run every case (module rules: lanes, then the cases that run alone, one at a time);
    ``on_result`` sees each result as it lands. ``options.lanes`` None: ``default_lanes``.
    Ctrl-C or ``RunInterrupted`` ends the run early with the results so far."""
    lanes = default_lanes(options.backend) if options.lanes is None else options.lanes
    if lanes < 1:
        raise ValueError(f"lanes must be at least 1, got {lanes}")
    decided: dict[int, object] = {}
    rundir = Path(tempfile.mkdtemp(prefix="fsdpc-run-"))
    interrupted = ""

    caches = {n: SaveCache(rundir / f"saves-lane{n}") for n in range(lanes)}

    def decide(case: Case, lane: int = 0):
        return run_case(case, rundir, options, lane=lane, saves=caches[lane])

    def land(i: int, r) -> None:
        decided[i] = r
        if on_result is not None:
            on_result(r)

    side = [(i, c) for i, c in enumerate(cases) if not kind_record(c).alone]
    alone = [(i, c) for i, c in enumerate(cases) if kind_record(c).alone]
    try:
        if lanes > 1 and len(side) > 1:
            _run_lanes(by_save(side), lanes, decide, land)
        else:
            alone = [item for group in by_save(side) for item in group] + alone
        for i, case in alone:
            land(i, decide(case))
        for i, r in list(decided.items()):  # once more, later (module rules)
            again = getattr(kind_of(r.case), "again", None)
            if again is not None and again(r):
                decided[i] = decide(r.case)
    except KeyboardInterrupt as exc:
        interrupted = (str(exc) or "interrupted (Ctrl-C)") if isinstance(exc, RunInterrupted) \
            else "interrupted (Ctrl-C)"
        interrupted += f" after {len(decided)} of {len(cases)} cases"
    finally:
        shutil.rmtree(rundir, ignore_errors=True)
    results, block = finish_kinds([decided[i] for i in sorted(decided)], options)
    return Run(results=results, scaling=block, interrupted=interrupted, planned=len(cases),
               shared_saves=sum(c.shared for c in caches.values()),
               reused_trainings=sum(c.reused_trainings for c in caches.values()))


def run_cases(cases: Sequence[Case], *, backend: str | None = None,
              timeout: float = DEFAULT_TIMEOUT_S,
              fault_timeout: float | None = None,
              on_result: Callable[[object], None] | None = None,
              calibration: str | os.PathLike | None = None) -> list:
    """Every case's ``CaseResult`` (``run_all`` with these options; ``fault_timeout`` None:
    ``options.fault_timeout_for(timeout)``); an interruption propagates as KeyboardInterrupt
    (a library call has no report to keep)."""
    run = run_all(cases, RunOptions(
        backend=backend, timeout=timeout, fault_timeout=fault_timeout,
        calibration=None if calibration is None else str(calibration)), on_result=on_result)
    if run.interrupted:
        raise KeyboardInterrupt(run.interrupted)
    return run.results
