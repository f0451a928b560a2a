"""What runs on the ranks of a user round trip: the save and load sides of a built-in path
for a user model (``rank_save`` / ``rank_load``), and the stages of the user's own save/load
code (``rank_custom``): train, save, load, resume, again (P7). Every function here is sent
to the ranks by reference, so each is module-level.

- A custom round trip runs under the case's family (``sut.family.RankFamily``: FSDP1's
  wrapping, or ``fully_shard`` on the case's mesh) and builds, trains and freezes as the
  run's round trip does (``sut.roundtrip``: ``build``, ``train_for_save``, ``wrap_side``):
  a model that freezes params at the save is frozen after training and loaded frozen, as
  the single-process baseline has it. The user's functions get the ``TrainState`` (model,
  optimizer, scheduler, step) or ``(model, optimizer, directory)``, as their signature says
  (``CustomPath.app_state``); the load side resumes at the ``state.step`` the load restored.
- A chain (``Case.links``): the resume stage keeps what resumed, with its step counter moved
  on, and the chain stage records it as the next checkpoint's save side and saves it with
  the user's save (properties/chain.py); that checkpoint's load and resume are the same
  stages again, run for ``Case.next_link``.
- A checkpoint write still running in ``torch.distributed.checkpoint`` when the user's save
  returns (``pending_writes``) is recorded for P7, then waited for, so the load reads a
  whole checkpoint and the verdict names the cause instead of a torn read.

Rules
- The stages of a custom round trip are separate pool calls; the model of the previous stage
  is held in the rank's cache (``ctx.cache``) between them, under the case id. Each stage
  returns a dict of the ``SaveRecord`` / ``LoadRecord`` fields it fills (``sut.records``;
  the controller merges a rank's stages into one record: user/kinds.py).
- ``rank_save`` / ``rank_load`` return the built-in path's records.
- The user's code is not wrapped: an exception on any rank reaches the controller with its
  traceback (and the stacks of ranks left waiting) at once, and the observations of the
  earlier stages survive it.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..cases import Case
from ..properties.chain import next_dir
from ..sut import fsdp1, roundtrip
from ..sut.family import rank_family
from ..sut.files import atomic_save
from ..sut.asks import ROUND_TRIP_ASKS, SideAsks
from ..sut.crash_points import armed
from ..sut.records import LoadRecord, SaveRecord
from ..api_paths import MODEL_FILE, api_path
from ..zoo import build_scheduler, scheduler_state
from .app_state import TrainState
from .diagnosis import after_load, model_names, note_on_raise
from .model import CustomPath, UserModel

CKPT_DIR = "ckpt"
CKPT_AGAIN_DIR = "ckpt-again"
# How long a stage waits for a checkpoint write the user's save left running (after
# recording it) before the next stage reads the directory.
PENDING_WAIT_S = 60.0


def _build(ctx, case: Case, load_side: bool):
    """A fresh ``TrainState`` (step 0) at this side's plan, built as the run's round trip
    builds it (``sut.roundtrip.build``: the load side frozen as at the save), and the
    optimizer's keys."""
    model, optim, sched, keys = roundtrip.build(ctx, case, load_side)
    return TrainState(model=model, optimizer=optim, scheduler=sched), keys


def _equip(case: Case, model):
    """A ``TrainState`` of ``model`` with a fresh optimizer (and scheduler) built on the
    parameters it holds now (``sut.roundtrip.equip``), and the optimizer's keys."""
    optim, sched, keys = roundtrip.equip(case, model, load_side=True)
    return TrainState(model=model, optimizer=optim, scheduler=sched), keys


_local = roundtrip.local_state


def _set_up(custom: CustomPath, state: TrainState) -> None:
    """The user's ``setup(state)`` (``CustomPath.setup``), where given: a framework's setup
    of the freshly built training state, which may replace its model, optimizer and
    scheduler in place."""
    if custom.setup is not None:
        built = state.model
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            custom.setup.resolve()(state)
        if state.model is not built:  # a wrapper trains with the model's own loss
            _carry_suite_attrs(built, state.model)


def _call(fn, custom: CustomPath, state: TrainState, directory) -> None:
    """The user's save or load, with the arguments its signature asks for."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if custom.app_state:
            fn(state, str(directory))
        else:
            fn(state.model, state.optimizer, str(directory))


def _in_done_callbacks(frame) -> bool:
    """Whether the thread runs a completed Future's done callbacks (``concurrent.futures``
    ``_invoke_callbacks``): its write has finished."""
    f = frame
    while f is not None:
        if f.f_code.co_name == "_invoke_callbacks" and "concurrent" in f.f_code.co_filename:
            return True
        f = f.f_back
    return False


def pending_writes() -> str:
    """The first thread (not this one) running code of ``torch.distributed.checkpoint``: a
    checkpoint write still going on (``dcp.async_save`` runs it in a thread and returns a
    Future); "" when none. A thread that runs the Future's done callbacks has finished the
    write: ``async_save`` closes its own stager in one (torch 2.13
    ``state_dict_saver.py:360``), which may still run after ``future.result()`` has
    returned, so such a thread is not a write in flight."""
    here = threading.get_ident()
    mark = os.sep.join(("torch", "distributed", "checkpoint"))
    for ident, frame in sys._current_frames().items():
        if ident == here or _in_done_callbacks(frame):
            continue
        f = frame
        while f is not None:
            if mark in f.f_code.co_filename:
                name = next((t.name for t in threading.enumerate() if t.ident == ident), ident)
                return (f"thread {name!r} in {f.f_code.co_filename.split(mark)[-1].lstrip(os.sep)}"
                        f":{f.f_lineno} ({f.f_code.co_name})")
            f = f.f_back
    return ""


def _wait_writes() -> None:
    """Wait (``PENDING_WAIT_S`` at most) until no checkpoint write runs in this process."""
    deadline = time.monotonic() + PENDING_WAIT_S
    while pending_writes() and time.monotonic() < deadline:
        time.sleep(0.01)


def _save_model_params(ctx, case: Case, model, workdir: Path):
    params = rank_family(case).full_params(model)
    if ctx.rank == 0:
        atomic_save(params, workdir / MODEL_FILE)
    return params


_CACHE = "fsdpc_roundtrip"
_RESUMED = "fsdpc_resumed"


def _stash(ctx, case: Case, state: TrainState, keys, resumed: list | None = None) -> None:
    """Keep the state for the case's next stage; ``resumed``: the resumed training's losses,
    for a chain's next save (held apart from the load side's own stages)."""
    if resumed is None:
        ctx.cache[_CACHE] = (case.id, state, keys)
    else:
        ctx.cache[_RESUMED] = (case.id, state, keys, resumed)


def _take(ctx, case: Case, resumed: bool = False):
    held = ctx.cache.pop(_RESUMED if resumed else _CACHE, None)
    if held is None or held[0] != case.id:
        raise RuntimeError(f"no model of {case.id} held on rank {ctx.rank}: the stages of a "
                           f"custom round trip ran out of order (or the pool was rebuilt)")
    return held[1:]


def weights_theirs(custom: CustomPath) -> bool:
    """Whether the user's load restores the model's weights: a training-state load
    (``load_fn(state, directory)``) or a model load function (``load_model``). Nothing is
    restored on its behalf then; an optimizer-only load gets the saved weights from the
    suite (its contract: it checkpoints the optimizer alone)."""
    return custom.app_state or custom.load_model is not None


def _carry_suite_attrs(built, loaded) -> None:
    """What the suite set on the model it built (``zoo.build_model``: the user's loss
    function, ``_fsdpc_*``) onto the model a load function returned in its place."""
    for k, v in vars(built).items():
        if k.startswith("_fsdpc_") and k not in vars(loaded):
            loaded.__dict__[k] = v


def _fresh_loaded(ctx, custom: CustomPath, case: Case, params, ckpt: Path):
    """A fresh model at the load world size/plan, then the user's load: with
    ``custom.load_model``, that first (on the model alone), then the optimizer built on the
    parameters the model holds after it, then ``custom.load``; else the optimizer built
    first, then ``custom.load`` (the order docs/reference/plugin.md documents). The LR
    scheduler is built with the optimizer, or, where the case builds it after the load
    (``Case.scheduler_after_load``), after ``custom.load`` from the step it restored
    (``scheduler(optimizer, step)``), unless the load built one. The saved weights are put
    into the fresh model only for an optimizer-only load (``weights_theirs``). Returns the
    state, the optimizer's keys and the model's names before the load (``model_names``),
    with ``"scheduler_replaced"``: the class of a scheduler the load put in place of the
    one built before it ("" if none)."""
    model = roundtrip.wrap_side(ctx, case, load_side=True)  # frozen as at the save
    if not weights_theirs(custom):
        rank_family(case).load_params(ctx, model, params)
    before = model_names(model)
    if custom.load_model is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = custom.load_model.resolve()(model, str(ckpt))
        if out is not None and out is not model:  # a model the load built (torchtune's meta
            _carry_suite_attrs(model, out)        # init): trained with the model's own loss
            model = out
    state, keys = _equip(case, model)  # no scheduler yet where it is built after the load
    _set_up(custom, state)
    built = state.scheduler
    try:
        _call(custom.load.resolve(), custom, state, ckpt)
    except Exception as exc:  # the user's error as it is, with the cause the model shows
        note_on_raise(exc, model, before)
        raise
    before["scheduler_replaced"] = (type(state.scheduler).__name__ if built is not None
                                    and state.scheduler is not built else "")
    if case.scheduler_after_load and state.scheduler is None:  # from the restored step
        step = state.step if isinstance(state.step, int) else case.steps
        state.scheduler = build_scheduler(state.optimizer, case.model, case.scheduler,
                                          step=step)
    return state, keys, before


def _save_record(ctx, custom: CustomPath, case: Case, state: TrainState, keys,
                 losses: list[float], workdir: Path) -> dict:
    """What a save side records of the state it is about to save at ``case.steps`` (the
    ``SaveRecord`` fields), rank 0's full params written beside the checkpoint; the
    checkpoint's directory made."""
    fam = rank_family(case)
    out: dict[str, Any] = {"rank": ctx.rank, "keys": keys, "losses": losses,
                           "meta": fam.meta(state.model),
                           "mesh_shape": roundtrip.mesh_of(state.model,
                                                  fam.mesh_shape(ctx, case, False)),
                           "local": _local(state.optimizer, keys),
                           "sched": scheduler_state(state.scheduler),
                           "step": state.step if custom.app_state else None,
                           "own_mixed_precision": fam.own_mixed_precision(state.model),
                           "ignored_params": _ignored_params(case, state.model)}
    workdir.mkdir(parents=True, exist_ok=True)
    params = _save_model_params(ctx, case, state.model, workdir)
    if ctx.rank == 0:
        out["params"] = params
    (workdir / CKPT_DIR).mkdir(parents=True, exist_ok=True)
    return out


def rng_digest() -> dict[str, str]:
    """A digest of each of this process's random-number states: ``"torch"`` (the CPU
    generator), ``"python"`` (``random``) and ``"numpy"`` (its global one, where numpy is
    imported)."""
    import hashlib
    import random

    def digest(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()[:16]

    out = {"torch": digest(torch.get_rng_state().numpy().tobytes()),
           "python": digest(repr(random.getstate()).encode())}
    np = sys.modules.get("numpy")
    if np is not None:
        out["numpy"] = digest(repr(np.random.get_state()[1].tolist()).encode())
    return out


def _rng_of_a_run(case: Case, rank: int) -> dict[str, str]:
    """Put this rank's random-number states where a run's are at its save (not the suite's
    per-call seed, which a fresh load side also starts from), so that a load restoring them
    is told from one that does not; returns their digests (``rng_digest``)."""
    import random

    seed = (case.seed * 1_000_003 + rank * 7919 + case.steps) % (2 ** 31)
    torch.manual_seed(seed)
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed)
    return rng_digest()


def _ignored_params(case: Case, model) -> dict | None:
    """This rank's own values of the params of the model's FSDP-ignored modules (None: it
    has none)."""
    from ..zoo import model_spec

    own = model_spec(case.model).ignored_prefixes
    if not own:
        return None
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters()
            if n.startswith(own)}


def _user_save(ctx, custom: CustomPath, state: TrainState, keys, workdir: Path,
               case: Case) -> dict:
    """The user's save into ``workdir`` (exceptions propagate: the pool reports every
    rank), the random-number states it met recorded (``_rng_of_a_run``); then what it left
    still writing (``pending_writes``), waited for."""
    rng = _rng_of_a_run(case, ctx.rank)
    t0 = time.perf_counter()
    _call(custom.save.resolve(), custom, state, workdir / CKPT_DIR)
    took = time.perf_counter() - t0
    pending = pending_writes()
    _wait_writes()
    return {"timings": {"save": took}, "after_save": _local(state.optimizer, keys),
            "pending": pending, "rng": rng}


def _stage_train(ctx, custom: CustomPath, case: Case, workdir: Path) -> dict:
    """Save side, 1: build, train ``case.steps`` steps, record; keep the state."""
    _clear(ctx)
    state, keys = _build(ctx, case, load_side=False)
    _set_up(custom, state)
    # trained, then frozen where the model freezes at the save, as the run's round trip does
    _, losses = roundtrip.train_for_save(ctx, case, state.model, state.optimizer,
                                         state.scheduler)
    state.step = case.steps
    out = _save_record(ctx, custom, case, state, keys, losses, workdir)
    _stash(ctx, case, state, keys)
    return out


def _stage_save(ctx, custom: CustomPath, case: Case, workdir: Path, kill=None) -> dict:
    """Save side, 2: the user's save (``_user_save``) of the state kept; ``kill``: a crash
    case's ``sut.crash_points.KillPlan``, armed around it (this rank may not return)."""
    state, keys = _take(ctx, case)
    with armed(kill, ctx.rank):
        return _user_save(ctx, custom, state, keys, workdir, case)


def _stage_chain(ctx, custom: CustomPath, case: Case, workdir: Path) -> dict:
    """A chain's next checkpoint (``Case.links``, properties/chain.py), on the load side that
    resumed: what it holds now recorded as ``Case.next_link``'s save side, then saved with
    the user's save under ``chain.next_dir(workdir)``: one stage, whose records are merged
    as the train and save stages' are."""
    state, keys, losses = _take(ctx, case, resumed=True)
    nxt, where = case.next_link(), next_dir(workdir)
    out = _save_record(ctx, custom, nxt, state, keys, losses, where)
    out.update(_user_save(ctx, custom, state, keys, where, nxt))
    return out


def _stage_load(ctx, custom: CustomPath, case: Case, workdir: Path) -> dict:
    """Load side, 1: fresh state with the saved params, the user's load, record; keep it."""
    _clear(ctx)
    params = torch.load(workdir / MODEL_FILE, weights_only=True)
    t0 = time.perf_counter()
    state, keys, before = _fresh_loaded(ctx, custom, case, params, workdir / CKPT_DIR)
    rng = rng_digest()
    fam = rank_family(case)
    out = {"rank": ctx.rank, "keys": keys, "meta": fam.meta(state.model),
           "mesh_shape": roundtrip.mesh_of(state.model, fam.mesh_shape(ctx, case, True)),
           "timings": {"load": time.perf_counter() - t0},
           "loaded": _local(state.optimizer, keys),
           "sched_loaded": scheduler_state(state.scheduler),
           "step_loaded": state.step if custom.app_state else None,
           "diagnosis": after_load(state.model, state.optimizer, before),
           "rng_loaded": rng}
    if weights_theirs(custom):
        loaded_params = fam.full_params(state.model)
        if ctx.rank == 0:
            out["params_loaded"] = loaded_params
    _stash(ctx, case, state, keys)
    return out


def _stage_resume(ctx, custom: CustomPath, case: Case, workdir: Path) -> dict:
    """Load side, 2: train ``case.resume_steps`` more steps on the loaded state, from the
    step it holds (the training state's; the save's step for optimizer-only functions)."""
    state, keys = _take(ctx, case)
    start = state.step if custom.app_state else case.steps
    if not isinstance(start, int) or isinstance(start, bool):
        raise TypeError(f"after load_fn, state.step is {start!r} ({type(start).__name__}); "
                        f"expected the int step the checkpoint was taken at")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        losses = fsdp1.train(ctx, case, state.model, state.optimizer, case.resume_steps,
                             start_step=start, sched=state.scheduler)
    state.step = start + case.resume_steps  # a trainer's step counter moves on
    out = {"losses": losses, "final_local": _local(state.optimizer, keys),
           "sched_final": scheduler_state(state.scheduler)}
    final = rank_family(case).full_params(state.model)
    if ctx.rank == 0:
        out["final_params"] = final
    if case.links > 1:  # the chain's next checkpoint saves what resumed (_stage_chain)
        _stash(ctx, case, state, keys, resumed=losses)
    return out


def _stage_again(ctx, custom: CustomPath, case: Case, workdir: Path) -> dict:
    """Load side, 3 (P7), on fresh states: load, save again at once, load that."""
    params = torch.load(workdir / MODEL_FILE, weights_only=True)
    again = workdir / f"{CKPT_AGAIN_DIR}-ws{ctx.world_size}"
    again.mkdir(parents=True, exist_ok=True)
    dist.barrier(group=ctx.group)
    state, keys, _ = _fresh_loaded(ctx, custom, case, params, workdir / CKPT_DIR)
    first = _local(state.optimizer, keys)
    _call(custom.save.resolve(), custom, state, again)
    _wait_writes()
    after = _local(state.optimizer, keys)
    del state
    state, keys, _ = _fresh_loaded(ctx, custom, case, params, again)
    return {"loaded_again": first, "after_resave": after,
            "reloaded": _local(state.optimizer, keys)}


def _clear(ctx) -> None:
    ctx.cache.pop(_CACHE, None)
    ctx.cache.pop(_RESUMED, None)


STAGES = {"train": _stage_train, "save": _stage_save, "load": _stage_load,
          "resume": _stage_resume, "again": _stage_again, "chain": _stage_chain}


def rank_custom(ctx, user: UserModel | None, custom: CustomPath, case: Case, workdir: str,
                stage: str, kill=None) -> dict:
    """One stage of a custom round trip on a rank (``STAGES``). The stages are separate
    pool calls, and the user's code is not wrapped: an exception on any rank reaches the
    controller with its traceback (and the stacks of ranks left waiting) at once, and the
    observations of the earlier stages survive it. ``kill``: the save stage of a crash
    case (P16) runs the user's save under it."""
    if user is not None:
        user.register()
    return STAGES[stage](ctx, custom, case, Path(workdir),
                         **({"kill": kill} if kill is not None else {}))


def rank_save(ctx, user: UserModel | None, custom: CustomPath | None, case: Case,
              workdir: str) -> SaveRecord:
    """Save side of a built-in path on a rank: register the user model, then
    ``sut.roundtrip.save_side``."""
    if user is not None:
        user.register()
    return api_path(case.api).save_side(ctx, case, workdir)


def rank_load(ctx, user: UserModel | None, custom: CustomPath | None, case: Case,
              workdir: str, asks: SideAsks = ROUND_TRIP_ASKS) -> LoadRecord:
    """Load side of a built-in path on a rank (see :func:`rank_save`; ``asks``: a chain's
    next save, sut/asks.py)."""
    if user is not None:
        user.register()
    return api_path(case.api).load_side(ctx, case, workdir, asks)

