"""What runs on the ranks of a user round trip: the save and load sides of a built-in path
for a user model (``rank_save`` / ``rank_load``), and the stages of the user's own save/load
code (``rank_custom``): train, save, load, resume, again (P7). Every function here is sent
to the ranks by reference, so each is module-level.

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
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..cases import Case
from ..sut.records import LoadRecord, SaveRecord
from ..sut.registry import api_path
from ..sut import fsdp1
from ..sut.fsdp1 import to_cpu, named_local
from ..sut.paths import MODEL_FILE, full_params, grouping_name, load_params
from ..zoo import build_optimizer
from .model import CustomPath, UserModel

CKPT_DIR = "ckpt"
CKPT_AGAIN_DIR = "ckpt-again"


def _build(ctx, case: Case, load_side: bool):
    model = fsdp1.wrap_fsdp1(ctx, case, plan=case.dst_plan if load_side else case.plan)
    named = [(grouping_name(n, p), p) for n, p in model.named_parameters()]
    optim = build_optimizer(case.optimizer, named, case.groups, impl=case.impl)
    return model, optim, fsdp1.optimizer_keys(model, optim)


def _local(optim, keys) -> dict:
    return to_cpu(named_local(optim.state_dict(), keys))


def _save_model_params(ctx, model, workdir: Path) -> None:
    params = full_params(model)
    if ctx.rank == 0:
        tmp = workdir / f".{MODEL_FILE}.tmp{os.getpid()}"
        torch.save(params, tmp)
        os.replace(tmp, workdir / MODEL_FILE)
    return params


_CACHE = "fsdpc_roundtrip"


def _stash(ctx, case: Case, model, optim, keys) -> None:
    ctx.cache[_CACHE] = (case.id, model, optim, keys)


def _take(ctx, case: Case, keep: bool = False):
    held = ctx.cache.get(_CACHE) if keep else ctx.cache.pop(_CACHE, None)
    if held is None or held[0] != case.id:
        raise RuntimeError(f"no model of {case.id} held on rank {ctx.rank}: the stages of a "
                           f"custom round trip ran out of order (or the pool was rebuilt)")
    return held[1:]


def _fresh_loaded(ctx, case: Case, workdir: Path, params, load, ckpt: Path):
    """A fresh model at the load world size/plan with the saved params, then ``load``."""
    model, optim, keys = _build(ctx, case, load_side=True)
    load_params(model, params)
    load(model, optim, str(ckpt))
    return model, optim, keys


def _stage_train(ctx, custom: CustomPath, case: Case, workdir: Path) -> dict:
    """Save side, 1: build, train ``case.steps`` steps, record; keep the model."""
    model, optim, keys = _build(ctx, case, load_side=False)
    losses = fsdp1.train(ctx, case, model, optim, case.steps)
    out: dict[str, Any] = {"rank": ctx.rank, "keys": keys, "losses": losses,
                           "meta": fsdp1.flat_metadata(model), "local": _local(optim, keys)}
    params = _save_model_params(ctx, model, workdir)
    if ctx.rank == 0:
        out["params"] = params
    (workdir / CKPT_DIR).mkdir(parents=True, exist_ok=True)
    _stash(ctx, case, model, optim, keys)
    return out


def _stage_save(ctx, custom: CustomPath, case: Case, workdir: Path) -> dict:
    """Save side, 2: the user's save (exceptions propagate: the pool reports every rank)."""
    model, optim, keys = _take(ctx, case)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        custom.save.resolve()(model, optim, str(workdir / CKPT_DIR))
    return {"timings": {"save": time.perf_counter() - t0}, "after_save": _local(optim, keys)}


def _stage_load(ctx, custom: CustomPath, case: Case, workdir: Path) -> dict:
    """Load side, 1: fresh model with the saved params, the user's load, record; keep it."""
    _clear(ctx)
    params = torch.load(workdir / MODEL_FILE, weights_only=True)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optim, keys = _fresh_loaded(ctx, case, workdir, params, custom.load.resolve(),
                                           workdir / CKPT_DIR)
    out = {"rank": ctx.rank, "keys": keys, "meta": fsdp1.flat_metadata(model),
           "timings": {"load": time.perf_counter() - t0}, "loaded": _local(optim, keys)}
    _stash(ctx, case, model, optim, keys)
    return out


def _stage_resume(ctx, custom: CustomPath, case: Case, workdir: Path) -> dict:
    """Load side, 2: train ``case.resume_steps`` more steps on the loaded model."""
    model, optim, keys = _take(ctx, case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        losses = fsdp1.train(ctx, case, model, optim, case.resume_steps, start_step=case.steps)
    out = {"losses": losses, "final_local": _local(optim, keys)}
    final = full_params(model)
    if ctx.rank == 0:
        out["final_params"] = final
    return out


def _stage_again(ctx, custom: CustomPath, case: Case, workdir: Path) -> dict:
    """Load side, 3 (P7), on fresh models: load, save again at once, load that."""
    params = torch.load(workdir / MODEL_FILE, weights_only=True)
    again = workdir / f"{CKPT_AGAIN_DIR}-ws{ctx.world_size}"
    again.mkdir(parents=True, exist_ok=True)
    dist.barrier(group=ctx.group)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optim, keys = _fresh_loaded(ctx, case, workdir, params, custom.load.resolve(),
                                           workdir / CKPT_DIR)
        first = _local(optim, keys)
        custom.save.resolve()(model, optim, str(again))
        after = _local(optim, keys)
        del model, optim
        model, optim, keys = _fresh_loaded(ctx, case, workdir, params, custom.load.resolve(),
                                           again)
    return {"loaded_again": first, "after_resave": after, "reloaded": _local(optim, keys)}


def _clear(ctx) -> None:
    ctx.cache.pop(_CACHE, None)


STAGES = {"train": _stage_train, "save": _stage_save, "load": _stage_load,
          "resume": _stage_resume, "again": _stage_again}


def rank_custom(ctx, user: UserModel | None, custom: CustomPath, case: Case, workdir: str,
                stage: str) -> dict:
    """One stage of a custom round trip on a rank (``STAGES``). The stages are separate
    pool calls, and the user's code is not wrapped: an exception on any rank reaches the
    controller with its traceback (and the stacks of ranks left waiting) at once, and the
    observations of the earlier stages survive it."""
    if user is not None:
        user.register()
    return STAGES[stage](ctx, custom, case, Path(workdir))


def rank_save(ctx, user: UserModel | None, custom: CustomPath | None, case: Case,
              workdir: str) -> SaveRecord:
    """Save side of a built-in path on a rank: register the user model, then
    ``sut.paths.save_side`` (or the FSDP2 adapter's)."""
    if user is not None:
        user.register()
    return api_path(case.api).save_side(ctx, case, workdir)


def rank_load(ctx, user: UserModel | None, custom: CustomPath | None, case: Case,
              workdir: str) -> LoadRecord:
    """Load side of a built-in path on a rank (see :func:`rank_save`)."""
    if user is not None:
        user.register()
    return api_path(case.api).load_side(ctx, case, workdir)

