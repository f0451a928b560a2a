"""RankPool: N live rank processes that join one process group once and then run many calls.

Rules
- Ranks are forked from a forkserver that has already imported torch, so starting (and
  rebuilding) a pool does not pay ``import torch`` per rank.
- The rendezvous store is a TCPStore hosted by the controller on port 0: the OS picks a free
  port, so pools, pytest-xdist workers and concurrent runs on one machine never collide.
- ``run`` waits at most ``timeout`` seconds. Outcomes:
    every rank returned            -> list of results in rank order
    some rank raised               -> RankError with each failing rank's traceback; ranks still
                                      running after a short grace (blocked in a collective that
                                      the failed rank never joined) are shown with their stacks,
                                      and the pool is rebuilt on the next call
    some rank returned a failure   -> (the rank caught it, returned it as a value and said so
                                      with ``outcome.mark_failed``, as ``sut.common.guarded``
                                      does) the same grace: if every rank finishes within it,
                                      the results are returned as usual, failures inside them;
                                      if not, RankError with the marked ranks' tracebacks
                                      (kind "exception <Type> (returned)") and the stacks of
                                      the ranks still running ("stuck-after-error"), and the
                                      pool is rebuilt on the next call
    a rank process exited          -> RankDied (exit code / signal, log tail); pool rebuilt
    the timeout passed             -> RankTimeout with every unfinished rank's Python stack;
                                      pool rebuilt
    Ctrl-C in the controller       -> every rank is killed, the pool is closed, the
                                      KeyboardInterrupt propagates
- The grace (``ERROR_GRACE_S``) starts when a failed rank's call ends (raised, or returned
  marked), never at the mark itself: a rank that marks a failure and goes on working is
  still running, not failed. So a call is decided within the grace of its first failure
  whenever the failed rank comes back, instead of at the timeout.
- A rank function is refused in the controller, before any rank is spawned or called, when
  the ranks could not import it (``refs.check_importable``: lambdas, nested functions, a
  ``__main__`` without a file); so is starting a pool from a ``__main__`` the rank processes
  cannot re-run (a script read from stdin).
- Every rank hashes strings with the same fixed seed (``RANK_HASH_SEED``), whatever the
  controller's: torch's output orders dicts and sets by string hash in places (a
  FlatParameter's FQNs in an error message, the keys of a dummy step's state), so a
  per-process random seed made one case's verdict text differ between two runs of the
  same code. The forkserver is started with ``PYTHONHASHSEED`` set; the ranks fork from it.
- No rank outlives the controller: each holds a lifeline pipe whose other end only the
  controller holds; when it closes (exit, crash or SIGKILL) the rank exits.
"""
from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import threading
import time
from datetime import timedelta
from multiprocessing.connection import wait as mp_wait
from pathlib import Path
from typing import Any, Callable, Sequence

from . import wire
from .errors import PoolClosed, RankDied, RankError, RankFailure, RankTimeout
from .refs import check_importable, main_rerun_problem
from .worker import LOG_FILE, STACK_FILE
from ..options import DEFAULT_TIMEOUT_S

START_TIMEOUT_S = 120.0
ERROR_GRACE_S = 3.0
DEATH_EXIT_WAIT_S = 10.0
"""How long a rank whose connection closed may take to exit before its death is described
without an exit code: a rank aborting writes its crash report first, which a loaded machine
can stretch past a second."""
_LOG_TAIL_LINES = 30
_CRASH_REASON_LINES = 6  # lines kept above "Fatal Python error" (the C++ reason)

_mp_context = None

RANK_PRELOAD = ("torch.distributed.fsdp", "torch.distributed.checkpoint",
                "torch.distributed.checkpoint.state_dict", "torch._dynamo",
                "fsdp_conformance.sut.roundtrip")
"""Modules the forkserver imports once, so that no rank pays for them: the FSDP and DCP
packages, ``torch._dynamo`` (imported lazily by the first optimizer step or DTensor op:
1.2 s of CPU per rank) and the suite's rank-side paths (with the zoo and the reference).
Together they were 1.7 s of the first call on every started or rebuilt pool."""


_CONTEXT_LOCK = threading.Lock()

RANK_HASH_SEED = "0"
"""``PYTHONHASHSEED`` of the forkserver, and so of every rank: same case, same bits and the
same text, every run."""


def _context():
    """The forkserver context, preloaded with the worker module (and so with torch) and with
    what every conformance case imports on its first call (``RANK_PRELOAD``), its server
    started with ``PYTHONHASHSEED=RANK_HASH_SEED`` (the controller's own environment is left
    as it was), checked on every call: a forkserver that died is started again, seeded."""
    global _mp_context
    with _CONTEXT_LOCK:  # two lanes start their first pools at once
        if _mp_context is None:
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(["fsdp_conformance.harness.worker", *RANK_PRELOAD])
            _mp_context = ctx
        _start_forkserver_seeded()  # every pool start: a forkserver that died restarts seeded
    return _mp_context


def _start_forkserver_seeded() -> None:
    """Start the forkserver now, with the fixed hash seed in its environment. A forkserver
    this process already started (for its own use) is kept as it is."""
    from multiprocessing import forkserver

    before = os.environ.get("PYTHONHASHSEED")
    os.environ["PYTHONHASHSEED"] = RANK_HASH_SEED
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONHASHSEED"]
        else:
            os.environ["PYTHONHASHSEED"] = before


def pick_backend(world_size: int, backend: str | None) -> str:
    """``None`` picks NCCL when there is one CUDA device per rank, else gloo."""
    if backend is not None:
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo', 'nccl' or None, got {backend!r}")
        if backend == "nccl":
            import torch

            n = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if n < world_size:
                raise ValueError(f"backend 'nccl' needs one CUDA device per rank: world size "
                                 f"{world_size}, CUDA devices visible: {n}")
        return backend
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl"
    return "gloo"


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name} (exit code {code})"
    return f"exited with code {code}"


def _log_size(path: Path) -> int:
    """The size of a rank's log now (0 if it has none yet)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _tail(path: Path, lines: int = _LOG_TAIL_LINES, since: int = 0) -> str:
    """The last ``lines`` lines a rank wrote to its log from byte ``since`` on (the call's
    start: what an earlier call on the rank printed is not this call's failure); when the
    rank crashed (a "Fatal Python error" line) further up, the lines just before that one
    come first: that is where the C++ reason of an abort is ("terminate called after
    throwing ...", "what(): ..."), above a Python stack that fills the tail."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(since if since <= size else 0, size - 50000))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    all_lines = data.splitlines()
    tail = all_lines[-lines:]
    start = len(all_lines) - len(tail)
    fatal = [i for i, ln in enumerate(all_lines) if ln.startswith("Fatal Python error")]
    if fatal and fatal[-1] < start:
        head = all_lines[max(0, fatal[-1] - _CRASH_REASON_LINES):fatal[-1] + 1]
        return "\n".join(head + ["[...]"] + tail)
    return "\n".join(tail)


class RankPool:
    """``world_size`` live ranks running functions on request. Use as a context manager.

    ``pool.run(fn, *args, timeout=..., seed=...)`` calls the importable function
    ``fn(ctx, *args)`` on every rank and returns the per-rank results in rank order.
    """

    def __init__(self, world_size: int, backend: str | None = None, *,
                 timeout: float = DEFAULT_TIMEOUT_S, pg_timeout: float = 1800.0,
                 scratch_root: str | os.PathLike | None = None):
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        self.world_size = world_size
        self.backend = pick_backend(world_size, backend)
        self.timeout = float(timeout)
        self.pg_timeout = float(pg_timeout)
        self._scratch_root = scratch_root
        self._tmp: Path | None = None
        self._procs: list = []
        self._conns: list = []
        self._lifelines: list = []
        self._store = None
        self._generation = 0
        self._call_ids = itertools.count()
        self._broken = True  # not started yet
        self._log_starts: list[int] = []  # each rank's log size when the current call was sent
        self._closed = False
        self._teardown_lock = threading.Lock()  # one thread closes a generation's handles
        self.rebuilds = 0

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> "RankPool":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return not self._broken and not self._closed

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    @property
    def scratch(self) -> Path:
        """Root of the per-rank scratch directories (``rank<N>/`` under it)."""
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix=f"fsdpc-pool-ws{self.world_size}-",
                                              dir=self._scratch_root))
        return self._tmp

    def rank_dir(self, rank: int) -> Path:
        return self.scratch / f"g{self._generation}" / f"rank{rank}"

    def start(self) -> None:
        """Start the ranks and the process group (idempotent while healthy)."""
        if self._closed:
            raise PoolClosed("this RankPool was closed")
        if not self._broken:
            return
        problem = main_rerun_problem()
        if problem is not None:
            raise RuntimeError(f"cannot start a RankPool: {problem}")
        self._teardown(graceful=False)
        self._generation += 1
        import torch.distributed as dist

        self._store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                    timeout=timedelta(seconds=self.pg_timeout))
        ctx = _context()
        prefix = f"fsdpc/{os.getpid()}/{id(self)}/{self._generation}/"
        try:
            for rank in range(self.world_size):
                parent, child = ctx.Pipe(duplex=True)
                life_r, life_w = ctx.Pipe(duplex=False)
                rank_dir = self.rank_dir(rank)
                rank_dir.mkdir(parents=True, exist_ok=True)
                from . import worker

                proc = ctx.Process(
                    target=worker.main, name=f"fsdpc-rank{rank}", daemon=True,
                    args=(child, life_r, rank, self.world_size, self.backend, "127.0.0.1",
                          self._store.port, prefix, str(rank_dir), self._generation,
                          self.pg_timeout))
                proc.start()
                child.close()
                life_r.close()
                self._procs.append(proc)
                self._conns.append(parent)
                self._lifelines.append(life_w)
            self._await_ready()
            if self._closed:  # closed by another thread while these ranks started
                raise PoolClosed("this RankPool was closed while it started")
        except BaseException:
            self._teardown(graceful=False)
            self._broken = True
            raise
        self._broken = False

    def _await_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        pending = set(range(self.world_size))
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                fails = [RankFailure(r, "hung", "did not join the process group in "
                                     f"{START_TIMEOUT_S:.0f}s", _tail(self.rank_dir(r) / LOG_FILE))
                         for r in sorted(pending)]
                raise RankTimeout(f"pool start (world size {self.world_size}) timed out", fails)
            objs = {self._conns[r]: r for r in pending}
            objs.update({self._procs[r].sentinel: r for r in pending})
            for obj in mp_wait(list(objs), timeout=left):
                r = objs[obj]
                if r not in pending:
                    continue
                if obj is self._conns[r] and self._conns[r].poll():
                    try:
                        msg = wire.recv(self._conns[r])
                    except (EOFError, OSError):
                        msg = None
                    if msg and msg[0] == "ready":
                        pending.discard(r)
                        continue
                self._procs[r].join(DEATH_EXIT_WAIT_S)
                raise RankDied(f"rank {r} failed while starting the pool "
                               f"(world size {self.world_size})",
                               [RankFailure(r, "died", _describe_exit(self._procs[r].exitcode),
                                            _tail(self.rank_dir(r) / LOG_FILE))])

    def close(self, *, kill: bool = False) -> None:
        """Stop every rank and remove the scratch directories (``kill``: kill the ranks at
        once instead of asking them to stop; a call in flight on another thread then sees
        them die)."""
        if self._closed:
            return
        self._closed = True
        self._teardown(graceful=not (self._broken or kill))
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def _teardown(self, graceful: bool) -> None:
        """Stop this generation's ranks and close its handles, exactly once: the lists are
        taken under a lock, so a run's main thread killing the pool (an interrupted run) and
        a lane thread marking it broken at the same moment never both close one connection
        (a second close of a descriptor number closes whatever reused it, e.g. a directory
        scan's handle in the scratch removal)."""
        with self._teardown_lock:
            procs, conns, lifelines = self._procs, self._conns, self._lifelines
            self._procs, self._conns, self._lifelines = [], [], []
            self._store = None
        if graceful:
            for conn in conns:
                try:
                    wire.send(conn, ("stop",))
                except (OSError, ValueError):
                    pass
            deadline = time.monotonic() + 3.0
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(5.0)
        for c in conns + lifelines:
            try:
                c.close()
            except OSError:
                pass

    # ----------------------------------------------------------------- calls
    def run(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None,
            seed: int = 0, **kwargs: Any) -> list[Any]:
        """Run ``fn(ctx, *args, **kwargs)`` on every rank; return results in rank order."""
        return self.run_each(fn, [args] * self.world_size, timeout=timeout, seed=seed, **kwargs)

    def run_each(self, fn: Callable[..., Any], per_rank_args: Sequence[tuple], *,
                 timeout: float | None = None, seed: int = 0, **kwargs: Any) -> list[Any]:
        """Like ``run`` but rank ``r`` gets ``per_rank_args[r]`` (e.g. its own shard)."""
        if len(per_rank_args) != self.world_size:
            raise ValueError(f"per_rank_args has {len(per_rank_args)} entries, "
                             f"world size is {self.world_size}")
        check_importable(fn)
        if self._broken:
            if self._generation > 0:
                self.rebuilds += 1
            self.start()
        timeout = self.timeout if timeout is None else float(timeout)
        call_id = next(self._call_ids)
        self._log_starts = [_log_size(self.rank_dir(r) / LOG_FILE)
                            for r in range(self.world_size)]
        try:
            for r, conn in enumerate(self._conns):
                try:
                    wire.send(conn, ("call", call_id, fn, tuple(per_rank_args[r]), kwargs, seed))
                except (BrokenPipeError, ConnectionResetError):
                    pass  # that rank is dead: _collect sees its sentinel and reports it
            return self._collect(call_id, fn, timeout)
        except KeyboardInterrupt:
            self._broken = True
            self.close()
            raise

    def _call_tail(self, rank: int, lines: int = _LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines rank ``rank`` wrote to its log during the current call
        (from where its log stood when the call was sent; all of it before any call)."""
        since = self._log_starts[rank] if rank < len(self._log_starts) else 0
        return _tail(self.rank_dir(rank) / LOG_FILE, lines, since)

    def _collect(self, call_id: int, fn, timeout: float) -> list[Any]:
        name = getattr(fn, "__qualname__", repr(fn))
        deadline = time.monotonic() + timeout
        results: dict[int, Any] = {}
        errors: dict[int, RankFailure] = {}
        died: dict[int, RankFailure] = {}
        marked: dict[int, RankFailure] = {}  # returned, but said the call failed on it
        pending = set(range(self.world_size))
        grace_deadline = None
        while pending:
            now = time.monotonic()
            limit = deadline if grace_deadline is None else min(deadline, grace_deadline)
            if now >= limit:
                break
            objs = {}
            for r in pending:
                objs[self._conns[r]] = r
                objs[self._procs[r].sentinel] = r
            for obj in mp_wait(list(objs), timeout=limit - now):
                r = objs[obj]
                if r not in pending:
                    continue
                conn = self._conns[r]
                msg = None
                if conn.poll():
                    try:
                        msg = wire.recv(conn)
                    except (EOFError, OSError):
                        msg = None
                if msg is None:
                    self._procs[r].join(DEATH_EXIT_WAIT_S)
                    died[r] = RankFailure(r, "died", _describe_exit(self._procs[r].exitcode),
                                          self._call_tail(r))
                    pending.discard(r)
                elif msg[1] != call_id:
                    continue  # stale reply of an earlier call (cannot happen in a healthy pool)
                elif msg[0] == "ok":
                    results[r] = msg[2]
                    if len(msg) > 3 and msg[3]:
                        marked[r] = _marked_failure(r, msg[3], self._call_tail(r, 10))
                    pending.discard(r)
                else:
                    errors[r] = RankFailure(r, f"exception {msg[2]}", msg[3],
                                            self._call_tail(r, 10))
                    pending.discard(r)
            if (errors or died or marked) and pending and grace_deadline is None:
                grace_deadline = time.monotonic() + ERROR_GRACE_S

        if not pending and not errors and not died:
            return [results[r] for r in range(self.world_size)]
        if marked and pending and not errors and not died:
            stuck = self._stacks(pending, "stuck-after-error")
            self._mark_broken()
            raise RankError(f"{name} failed on rank(s) {sorted(marked)} (caught there and "
                            f"returned as its result; world size {self.world_size}); rank(s) "
                            f"{sorted(pending)} did not finish (blocked waiting for the failed "
                            f"rank?) and the pool will be rebuilt", [*marked.values(), *stuck])

        if died:
            others = self._stacks(pending, "stuck-after-error")
            self._mark_broken()
            raise RankDied(f"{name}: rank(s) {sorted(died)} died during the call "
                           f"(world size {self.world_size}); the pool will be rebuilt",
                           [*died.values(), *errors.values(), *others])
        if errors:
            fails = [*errors.values()]
            if pending:
                fails += self._stacks(pending, "stuck-after-error")
                self._mark_broken()
                tail = (f"; rank(s) {sorted(pending)} did not finish (blocked waiting for the "
                        f"failed rank?) and the pool will be rebuilt")
            else:
                tail = ""
                self._check_health()
            raise RankError(f"{name} raised on rank(s) {sorted(errors)} "
                            f"(world size {self.world_size}){tail}", fails)
        stacks = self._stacks(pending, "hung")
        self._mark_broken()
        raise RankTimeout(f"{name} timed out after {timeout:.1f}s on rank(s) {sorted(pending)} "
                          f"(world size {self.world_size}); finished: {sorted(results)}; "
                          f"the pool will be rebuilt", stacks)

    def _stacks(self, ranks, kind: str) -> list[RankFailure]:
        """Ask each rank for its Python stacks (SIGUSR1 -> faulthandler) and read them."""
        ranks = sorted(ranks)
        offsets = {}
        for r in ranks:
            path = self.rank_dir(r) / STACK_FILE
            offsets[r] = path.stat().st_size if path.exists() else 0
            try:
                os.kill(self._procs[r].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        out = []
        deadline = time.monotonic() + 2.0
        for r in ranks:
            path = self.rank_dir(r) / STACK_FILE
            text, last = "", -1
            while time.monotonic() < deadline:
                size = path.stat().st_size if path.exists() else 0
                if size > offsets[r] and size == last:
                    break
                last = size
                time.sleep(0.05)
            try:
                with open(path, "rb") as f:
                    f.seek(offsets[r])
                    text = f.read().decode("utf-8", "replace")
            except OSError:
                pass
            out.append(RankFailure(r, kind, "Python stacks when the call was abandoned:\n"
                                   + (text.strip() or "(no stack could be read)"),
                                   self._call_tail(r, 10)))
        return out

    def _check_health(self) -> None:
        """After a call that raised on some rank, make sure the group still works; if a quick
        barrier does not pass, rebuild on the next call."""
        try:
            self._collect_barrier()
        except RankError:
            self._mark_broken()

    def _collect_barrier(self) -> None:
        call_id = next(self._call_ids)
        for conn in self._conns:
            wire.send(conn, ("call", call_id, _barrier, (), {}, 0))
        self._collect(call_id, _barrier, 15.0)

    def _mark_broken(self) -> None:
        self._broken = True
        self._teardown(graceful=False)


def _marked_failure(rank: int, marks, log_tail: str) -> RankFailure:
    """A rank that returned with failure marks (``outcome.FailureMark``), as a RankFailure:
    the first mark's type in ``kind``, every mark's traceback in ``detail``."""
    detail = "\n".join(m.detail.rstrip() for m in marks)
    return RankFailure(rank, f"exception {marks[0].exc_type} (returned)", detail, log_tail)


def _barrier(ctx) -> None:
    import torch.distributed as dist

    dist.barrier(group=ctx.group)
