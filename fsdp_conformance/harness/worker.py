"""The rank process of a spawned pool: join the process group once, then serve calls.

Protocol on the duplex connection (controller <-> this rank), all messages pickled tuples:
  controller -> rank: ("call", call_id, fn, args, kwargs, seed) | ("stop",)
  rank -> controller: ("ready", pid) | ("ok", call_id, result, marks)
                      | ("err", call_id, type_name, traceback)
  ``marks``: the ``outcome.FailureMark``s the call made (failures it caught and returned as
  values); empty for a call that went well.

Lifetime rules: the rank exits when the controller closes the lifeline (its death included,
SIGKILL too), when it gets ("stop",), or when its connection breaks. SIGINT is ignored here:
Ctrl-C is the controller's to handle, and it tears the ranks down. SIGUSR1 makes faulthandler
write every thread's Python stack to ``scratch/stacks.txt`` (the controller reads it on a hang).

Rank set-up: ``$FSDPC_RANK_SETUP`` ("pkg.module" or "pkg.module:function") is imported (and
the function called) on every rank after the process group is up and before the rank serves
any call: a patch of torch under test, such as a candidate fix, or the self-test's removal of
the legacy FSDP1 functions (suites/conformance/removed_api.py). A set-up that raises stops the
rank before it is ready, so the pool fails to start with the traceback in the rank's log.

Garbage collection: what is alive when the rank is ready (torch's modules, the process
group: about 290,000 objects) is moved to the collector's permanent generation
(``gc.freeze``), so a full collection traverses only what calls create: 0.01 ms instead of
about 190 ms. The peak measurement collects before every measured call (bounds/timing.py),
and the interpreter's own full collections cost the same.
"""
from __future__ import annotations

import faulthandler
import gc
import os
import signal
import sys
import threading
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch  # noqa: F401  (preloaded by the forkserver: ranks start without paying the import)
import torch.distributed as dist

from . import outcome, wire
from .context import RankContext
from .seeding import seed_everything

RANK_THREADS_ENV = "OMP_NUM_THREADS"
STACK_FILE = "stacks.txt"
LOG_FILE = "rank.log"
RANK_SETUP_ENV = "FSDPC_RANK_SETUP"


def run_rank_setup() -> None:
    """Import ``$FSDPC_RANK_SETUP``'s module and call its function, if one is named (module
    docstring)."""
    import importlib

    spec = os.environ.get(RANK_SETUP_ENV, "").strip()
    if not spec:
        return
    module, _, func = spec.partition(":")
    mod = importlib.import_module(module)
    if func:
        getattr(mod, func)()


def set_rank_threads() -> int:
    """Give this rank the intra-op threads torchrun gives each of several ranks on one node:
    ``$OMP_NUM_THREADS`` where the controller's environment sets it, else 1 (torchrun's
    default, torch/distributed/run.py, "to avoid your system being overloaded"); the variable
    is set to match, for user code that reads it. Returns the thread count.

    Why not torch's own default (one thread per core): a pool's ranks, and two lanes' pools,
    share the cores already, and an idle OpenMP worker busy-waits after every parallel
    region. That spin is CPU time of the rank's process: it made the "work" P13 measures
    (``bounds/timing.py``) of a 1-rank ``fsdp1.dsd_full`` load 8 ms in one measurement and
    4 ms in the next, on the same process, for the same call."""
    threads = int(os.environ.get(RANK_THREADS_ENV) or 1)
    os.environ[RANK_THREADS_ENV] = str(threads)
    torch.set_num_threads(threads)
    return threads


def _watch_lifeline(lifeline) -> None:
    """Exit this process as soon as the controller's end of the lifeline is closed."""
    try:
        while True:
            if lifeline.poll(0.5):
                lifeline.recv()  # EOFError when the controller is gone
    except (EOFError, OSError):
        pass
    os._exit(3)


def _redirect_output(scratch: Path) -> None:
    log = open(scratch / LOG_FILE, "ab", buffering=0)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)


def _device_for(backend: str, local_rank: int):
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def run_call(ctx: RankContext, fn, args: tuple, kwargs: dict, seed: int) -> Any:
    """Seed, then call ``fn(ctx, *args, **kwargs)``; shared by spawned and attached ranks.
    The call starts with no failure marks (``outcome.start_call``)."""
    ctx.seed = seed
    outcome.start_call()
    seed_everything(seed)
    return fn(ctx, *args, **kwargs)


def torchrun_env(rank: int, world_size: int, host: str, port: int) -> dict[str, str]:
    """The environment torchrun gives a rank, for user code that reads it (accelerate's
    ``PartialState``, Lightning, torchtitan): one node, local rank = rank. MASTER_ADDR /
    MASTER_PORT name the pool's rendezvous store; the default process group is already
    initialised on it when user code runs, so code that checks
    ``torch.distributed.is_initialized()`` first (as those trainers do) uses it."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size), "GROUP_RANK": "0", "NODE_RANK": "0",
            "MASTER_ADDR": host, "MASTER_PORT": str(port)}


def main(conn, lifeline, rank: int, world_size: int, backend: str, store_host: str,
         store_port: int, prefix: str, scratch: str, generation: int, pg_timeout_s: float) -> None:
    """Entry point of one rank process (target of the pool's forkserver Process)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_lifeline, args=(lifeline,), daemon=True, name="lifeline").start()
    scratch_dir = Path(scratch)
    scratch_dir.mkdir(parents=True, exist_ok=True)
    _redirect_output(scratch_dir)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    stack_file = open(scratch_dir / STACK_FILE, "a", buffering=1)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)

    set_rank_threads()
    device = _device_for(backend, rank)
    os.environ.update(torchrun_env(rank, world_size, store_host, store_port))
    store = dist.PrefixStore(prefix, dist.TCPStore(store_host, store_port, is_master=False,
                                                   timeout=timedelta(seconds=pg_timeout_s)))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=pg_timeout_s))
    ctx = RankContext(rank=rank, world_size=world_size, local_rank=rank, backend=backend,
                      device=device, group=dist.group.WORLD, scratch=scratch_dir,
                      generation=generation)
    run_rank_setup()
    gc.collect()
    gc.freeze()
    wire.send(conn, ("ready", os.getpid()))
    serve(conn, ctx)
    os._exit(0)


def serve(conn, ctx: RankContext) -> None:
    """Serve calls until ("stop",) or a broken connection."""
    while True:
        try:
            msg = wire.recv(conn)
        except (EOFError, OSError):
            return
        if msg[0] == "stop":
            return
        _, call_id, fn, args, kwargs, seed = msg
        try:
            result = run_call(ctx, fn, args, kwargs, seed)
            reply = ("ok", call_id, result, outcome.take_marks())
            try:
                wire.send(conn, reply)
            except Exception as exc:  # result not picklable: say so instead of dying
                wire.send(conn, ("err", call_id, type(exc).__name__,
                           f"result of {getattr(fn, '__qualname__', fn)} could not be sent "
                           f"to the controller: {exc!r}"))
        except BaseException as exc:  # noqa: BLE001  (SystemExit from fn is an error too)
            sys.stderr.flush()
            wire.send(conn, ("err", call_id, type(exc).__name__, traceback.format_exc()))
