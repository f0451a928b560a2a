"""Attach mode: the same ``run`` API on the ranks of a ``torchrun`` job.

Rules
- ``attach()`` on rank 0 returns an ``AttachedPool`` (rank 0 is the controller *and* a rank);
  on every other rank it serves calls until rank 0 closes the pool, then exits the process
  with code 0: code after ``attach()`` only ever runs on rank 0.
- Calls travel over a gloo control group (so NCCL jobs work too); results are gathered to
  rank 0 in rank order. The job's own process group is ``ctx.group``.
- Every call has a deadline. A watchdog thread on each rank writes that rank's Python stacks
  to the job's store when the deadline passes. If rank 0 is free it raises ``RankTimeout``
  with all stacks; if rank 0 itself is stuck (typically inside a collective another rank
  skipped) its watchdog prints the ``RankTimeout`` report with every rank's stacks and exits
  the process with code 124. Either way the other ranks are told to exit (code 124), so
  torchrun ends the job: a hung call never leaves a hung job. An attached pool cannot be
  rebuilt; after a timeout it is closed.
- After a timeout no rank exits before every rank has removed its scratch directory:
  torchrun stops every rank (SIGTERM) as soon as one exits non-zero. The told ranks clean up,
  say so in the store and wait for rank 0's release; rank 0 waits for them, cleans up, then
  releases them: at once when it is stuck, at its interpreter's exit when it is free (so its
  program can handle the ``RankTimeout``). Both waits are bounded by ``LEFT_WAIT_S``.
- ``close()`` (also run at exit on rank 0 if the caller forgot it) ends the job cleanly: every
  rank removes its scratch directory, meets the others at a barrier (60 s timeout; a rank that
  times out says so and leaves without destroying anything), then destroys the control group
  and, if ``attach()`` created it, the default process group, and drops every handle the pool
  holds on them (``ctx.group``, ``ctx.cache``, the store). On rank 0 ``close()`` returns only
  once the gloo threads those groups started have ended (bounded wait; if something else still
  holds a group it says so on stderr). ``destroy_process_group`` alone does not stop them:
  gloo's ``shutdown()`` is a no-op, its worker threads are joined only when the last reference
  to the group goes. A gloo group alive at interpreter exit can abort the process with
  "terminate called without an active exception" (pytorch#190489), which torchrun reports as
  a failed job although every call succeeded: a thread that has to take the GIL back while the
  interpreter finalizes (a gloo worker dropping its last collective, or a Python thread
  running the group's destructor) is ended by ``pthread_exit`` inside a ``noexcept``
  destructor.
- A call's watchdog thread holds the pool; it is joined (bounded) before the call returns or
  raises, so no thread but the caller's can drop the last reference to the pool or its groups.
"""
from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
import time
import traceback
from datetime import timedelta
from typing import Any, Callable, Sequence

from .context import RankContext
from .errors import PoolClosed, RankError, RankFailure, RankTimeout
from .pool import DEFAULT_TIMEOUT_S
from .refs import check_importable
from .worker import run_call

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_attached: "AttachedPool | None" = None
TIMEOUT_EXIT_CODE = 124
WATCHDOG_JOIN_S = 10.0  # a finished call's watchdog returns at once (<= 0.2 s on ranks 1..N-1)
GLOO_THREADS_GONE_S = 5.0  # the groups' destructor joins their threads; this only bounds it
LEFT_WAIT_S = 30.0  # after a timeout: the longest wait for a rank's clean-up or rank 0's release


def in_torchrun() -> bool:
    """True when this process was started by torchrun (or any launcher setting its env)."""
    return all(k in os.environ for k in _ENV)


def attached_pool() -> "AttachedPool | None":
    return _attached


def _gloo_threads() -> set[int]:
    """Ids of this process's native threads that gloo started (``gloo_tcp_loop``,
    ``pt_gloo_runloop``). Linux only (``/proc/self/task``); empty elsewhere."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return set()
    found = set()
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if "gloo" in f.read():
                    found.add(int(tid))
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
    return found


def _python_stacks() -> str:
    frames = sys._current_frames()
    out = []
    for th in threading.enumerate():
        if th.ident in frames and th.name != "fsdpc-watchdog":
            out.append(f"Thread {th.name} (most recent call last):\n"
                       + "".join(traceback.format_stack(frames[th.ident])))
    return "\n".join(out)


class _Watchdog:
    """Per-call deadline on one rank: on expiry publish this rank's stacks; on rank 0, if the
    main thread is still inside the call, report every rank's stacks and exit 124."""

    def __init__(self, pool: "AttachedPool", call_id: int, timeout: float):
        self.pool, self.call_id, self.timeout = pool, call_id, timeout
        self.started = time.monotonic()
        """When the call began: its deadline is ``started + timeout`` on every rank."""
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True, name="fsdpc-watchdog")
        self.thread.start()

    def stop(self) -> None:
        """The call is over: wake the thread and wait (bounded) until it has ended, so that
        it no longer holds the pool (see Rules)."""
        self.done.set()
        if self.thread is not threading.current_thread():
            self.thread.join(WATCHDOG_JOIN_S)

    def _watch(self) -> None:
        if self.done.wait(self.timeout):
            return
        p = self.pool
        p._store.set(f"stack/{self.call_id}/{p.rank}", _python_stacks())
        if p.rank != 0:
            # Wait for rank 0's verdict; it either raises RankTimeout or exits the job.
            while not self.done.is_set():
                if p._store.check([f"abandon/{self.call_id}"]):
                    p._leave(self.call_id)
                time.sleep(0.2)
            return
        if self.done.wait(p.stack_grace):
            return  # the controller path raised RankTimeout itself
        err = p._timeout_error(self.call_id, self.timeout, main_thread_stuck=True)
        sys.stderr.write(f"\nfsdp_conformance.harness.RankTimeout: {err}\n")
        sys.stderr.flush()
        p._abandon(self.call_id)
        p._release()
        os._exit(TIMEOUT_EXIT_CODE)


class AttachedPool:
    """The ranks of a torchrun job seen as a pool (rank 0's handle)."""

    stack_grace = 3.0

    def __init__(self, backend: str | None, timeout: float):
        import torch
        import torch.distributed as dist

        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        gloo_before = _gloo_threads()
        if not dist.is_initialized():
            if backend is None:
                backend = "nccl" if torch.cuda.is_available() else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(self.local_rank)
            dist.init_process_group(backend)
            self._owns_default_group = True
        else:
            self._owns_default_group = False
        self.backend = dist.get_backend()
        self.timeout = float(timeout)
        self._ctrl = dist.new_group(backend="gloo", timeout=timedelta(days=1))
        # The gloo threads of the groups made here: close() waits until they have ended.
        self._gloo_tids = _gloo_threads() - gloo_before
        self._store = dist.PrefixStore(
            f"fsdpc-attach/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/",
            dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timedelta(seconds=60)))
        device = (torch.device("cuda", self.local_rank) if self.backend == "nccl"
                  else torch.device("cpu"))
        import tempfile
        from pathlib import Path

        scratch = Path(tempfile.mkdtemp(prefix=f"fsdpc-attach-rank{self.rank}-"))
        self.ctx = RankContext(rank=self.rank, world_size=self.world_size,
                               local_rank=self.local_rank, backend=self.backend, device=device,
                               group=dist.group.WORLD, scratch=scratch)
        self._next_id = 0
        self._closed = False
        self._abandoned: int | None = None  # the timed-out call the other ranks were told of

    # ------------------------------------------------------------ shared by all ranks
    def _execute(self, call_id: int, fn, args, kwargs, seed, timeout) -> tuple:
        dog = _Watchdog(self, call_id, timeout)
        try:
            reply = ("ok", run_call(self.ctx, fn, args, kwargs, seed))
        except BaseException as exc:  # noqa: BLE001
            reply = ("err", type(exc).__name__, traceback.format_exc())
        return reply, dog

    def _finish(self, call_id: int, reply, dog: _Watchdog, timeout: float) -> list | None:
        import torch.distributed as dist

        gathered = [None] * self.world_size if self.rank == 0 else None
        # monitored_barrier names the ranks that do not arrive in time (gloo only). It must
        # give up at the call's deadline, as the watchdog counts it (from the call's start):
        # later, and a free rank 0 whose own part took longer than the watchdog's grace
        # would be taken for stuck.
        deadline_left = max(1.0, timeout - (time.monotonic() - dog.started))
        try:
            dist.monitored_barrier(group=self._ctrl, timeout=timedelta(seconds=deadline_left),
                                   wait_all_ranks=True)
        except RuntimeError:
            if self.rank == 0:
                dog.stop()
                err = self._timeout_error(call_id, timeout, main_thread_stuck=False)
                self._closed = True  # whatever happens next, close() must not broadcast
                self._abandon(call_id)
                raise err from None
            raise
        dist.gather_object(reply, gathered, dst=0, group=self._ctrl)
        dog.stop()
        return gathered

    def _timeout_error(self, call_id: int, timeout: float, main_thread_stuck: bool) -> RankTimeout:
        deadline = time.monotonic() + self.stack_grace
        fails = []
        for r in range(self.world_size):
            key = f"stack/{call_id}/{r}"
            self._wait_for([key], until=deadline, every=0.1)
            if r == 0 and not main_thread_stuck:
                continue
            text = (self._store.get(key).decode("utf-8", "replace")
                    if self._store.check([key]) else "(rank finished or sent no stack)")
            fails.append(RankFailure(r, "hung", "Python stacks at the deadline:\n" + text))
        where = "rank 0 itself is stuck" if main_thread_stuck else "ranks did not arrive"
        return RankTimeout(f"call {call_id} timed out after {timeout:.1f}s in the torchrun job "
                           f"(world size {self.world_size}; {where})", fails)

    # ------------------------------------------------------------ rank 0 (controller)
    def run(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None,
            seed: int = 0, **kwargs: Any) -> list[Any]:
        return self.run_each(fn, [args] * self.world_size, timeout=timeout, seed=seed, **kwargs)

    def run_each(self, fn, per_rank_args: Sequence[tuple], *, timeout: float | None = None,
                 seed: int = 0, **kwargs: Any) -> list[Any]:
        import torch.distributed as dist

        if self._closed:
            raise PoolClosed("this attached pool is closed (after close() or a timeout)")
        if len(per_rank_args) != self.world_size:
            raise ValueError(f"per_rank_args has {len(per_rank_args)} entries, "
                             f"world size is {self.world_size}")
        check_importable(fn)
        timeout = self.timeout if timeout is None else float(timeout)
        call_id = self._next_id
        self._next_id += 1
        msg = [("call", call_id, fn, list(per_rank_args), kwargs, seed, timeout)]
        dist.broadcast_object_list(msg, src=0, group=self._ctrl)
        reply, dog = self._execute(call_id, fn, per_rank_args[0], kwargs, seed, timeout)
        gathered = self._finish(call_id, reply, dog, timeout)
        errors = [RankFailure(r, f"exception {g[1]}", g[2])
                  for r, g in enumerate(gathered) if g[0] == "err"]
        if errors:
            name = getattr(fn, "__qualname__", repr(fn))
            raise RankError(f"{name} raised on rank(s) {[f.rank for f in errors]} "
                            f"(torchrun job, world size {self.world_size})", errors)
        return [g[1] for g in gathered]

    def close(self) -> None:
        import torch.distributed as dist

        global _attached
        if self._closed:
            return
        self._closed = True
        dist.broadcast_object_list([("stop",)], src=0, group=self._ctrl)
        _attached = None
        self._teardown()

    def _remove_scratch(self) -> None:
        import shutil

        shutil.rmtree(self.ctx.scratch, ignore_errors=True)

    def _wait_for(self, keys: list[str], *, until: float, every: float = 0.05) -> None:
        """Poll the job's store until every key of ``keys`` is set or ``time.monotonic()``
        reaches ``until``, whichever comes first."""
        while keys and not self._store.check(keys) and time.monotonic() < until:
            time.sleep(every)

    def _abandon(self, call_id: int) -> None:
        """Rank 0, a timed-out call: tell the other ranks to leave, wait (at most
        ``LEFT_WAIT_S``) until each has removed its scratch directory and said so, then
        remove rank 0's own. The told ranks exit only on ``_release``: torchrun stops every
        rank with SIGTERM as soon as one exits non-zero, so no rank may exit while another
        still has clean-up to do. A rank that is already dead never answers; that only costs
        the bounded wait."""
        self._abandoned = call_id
        self._store.set(f"abandon/{call_id}", "1")
        self._wait_for([f"left/{call_id}/{r}" for r in range(1, self.world_size)],
                       until=time.monotonic() + LEFT_WAIT_S)
        self._remove_scratch()

    def _release(self) -> None:
        """Rank 0, after ``_abandon``: let the told ranks exit (code 124), which ends the job.
        Rank 0 stuck in the call does this at once; a free rank 0 at its interpreter's exit,
        so that its own program is not stopped while it handles the ``RankTimeout``."""
        if self._abandoned is not None and self._store is not None:
            self._store.set(f"release/{self._abandoned}", "1")

    def _leave(self, call_id: int) -> None:
        """Ranks 1..N-1, told to leave after a timed-out call (no teardown can be trusted):
        remove the scratch directory, tell rank 0, wait (at most ``LEFT_WAIT_S``) for its
        release, exit with code 124."""
        self._remove_scratch()
        try:
            self._store.set(f"left/{call_id}/{self.rank}", "1")
            self._wait_for([f"release/{call_id}"], until=time.monotonic() + LEFT_WAIT_S)
        except Exception:  # noqa: BLE001 - the store is gone with rank 0's agent: just leave
            pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(TIMEOUT_EXIT_CODE)

    def _teardown(self) -> None:
        """All ranks, after "stop": remove the rank's scratch directory, meet, destroy the
        groups this pool made and drop the pool's handles on them; rank 0 (which goes on to
        the interpreter's exit) then waits until their gloo threads have ended (see Rules)."""
        import torch.distributed as dist

        self._remove_scratch()

        try:
            dist.monitored_barrier(group=self._ctrl, timeout=timedelta(seconds=60),
                                   wait_all_ranks=True)
        except RuntimeError as exc:
            # A rank that never arrives may still be inside the group; destroying it here
            # could hang, so leave it and say why.
            sys.stderr.write(f"fsdp_conformance: attached pool closed without tearing down "
                             f"its process groups on rank {self.rank}: {exc}\n")
            return
        dist.destroy_process_group(self._ctrl)
        if self._owns_default_group:
            dist.destroy_process_group()
        # destroy_process_group only forgets the groups; a gloo group's threads stop when its
        # last reference goes. Drop ours here, on this thread, while the interpreter is whole.
        self._ctrl = None
        self.ctx.group = None
        self.ctx.cache.clear()
        self._store = None
        if self.rank == 0:  # the other ranks leave with os._exit: no interpreter exit there
            self._wait_gloo_threads_gone()

    def _wait_gloo_threads_gone(self) -> None:
        alive = self._gloo_tids & _gloo_threads()
        if alive:
            gc.collect()  # a group held only by garbage cycles (a module, an FSDP wrapper)
        deadline = time.monotonic() + GLOO_THREADS_GONE_S
        while alive and time.monotonic() < deadline:
            time.sleep(0.01)
            alive = self._gloo_tids & _gloo_threads()
        if alive:
            sys.stderr.write(
                f"fsdp_conformance: {len(alive)} gloo thread(s) of the process groups the "
                f"attached pool destroyed are still running on rank {self.rank}: something "
                f"still holds those groups (a global, a model wrapped on them, a kept "
                f"ctx.group). If it still does when the interpreter exits, the process can "
                f"abort with 'terminate called without an active exception'.\n")

    def __enter__(self) -> "AttachedPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ ranks 1..N-1
    def serve(self) -> None:
        import torch.distributed as dist

        while True:
            box = [None]
            dist.broadcast_object_list(box, src=0, group=self._ctrl)
            msg = box[0]
            if msg[0] == "stop":
                self._teardown()
                return
            _, call_id, fn, per_rank, kwargs, seed, timeout = msg
            reply, dog = self._execute(call_id, fn, per_rank[self.rank], kwargs, seed, timeout)
            self._finish(call_id, reply, dog, timeout)


def attach(backend: str | None = None, *, timeout: float = DEFAULT_TIMEOUT_S) -> AttachedPool:
    """Attach to the torchrun job this process belongs to.

    Returns the pool on rank 0. On other ranks: serves rank 0's calls, then exits the process
    (code 0) when rank 0 closes the pool, so this call never returns there.
    """
    global _attached
    if not in_torchrun():
        raise RuntimeError("attach() needs a torchrun job: RANK, WORLD_SIZE, LOCAL_RANK, "
                           f"MASTER_ADDR and MASTER_PORT must be set (missing: "
                           f"{[k for k in _ENV if k not in os.environ]})")
    if _attached is not None:
        return _attached
    pool = AttachedPool(backend, timeout)
    if pool.rank != 0:
        try:
            pool.serve()
        except BaseException:
            pool._remove_scratch()  # a serving rank that fails still leaves nothing behind
            raise
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    _attached = pool
    atexit.register(_close_at_exit)
    return pool


def _close_at_exit() -> None:
    """Rank 0 at interpreter exit: close a pool the caller left open, so the serving ranks
    exit and the process groups are torn down while the interpreter is still whole."""
    if _attached is not None and not _attached._closed:
        _attached.close()
    elif _attached is not None:
        _attached._release()  # after a RankTimeout: the told ranks may now exit
