"""The API paths of the conformance run, FSDP1 side: one save and one load per path, run
as a round trip over disk, observed on every rank.

Paths (``Case.api``): one module each under ``sut/fsdp1_paths/`` (its save, write and load
steps and its P9 flip; fsdp1_paths/__init__.py), named by its record in ``sut/registry.py``.
This module is the round trip they share (``save_side`` / ``load_side``) and the helpers
their steps use.

Rules
- The save side trains ``case.steps`` steps (or takes the state a path before it trained
  alike: sut/trained.py), saves through the path (timed), writes the
  file(s) under the case's work directory, and also saves with the flags flipped (P9: the
  full paths with ``rank0_only=False`` and no offload, fsdp1.sharded without offload,
  fsdp1.dsd_sharded with ``cpu_offload=True``). The
  load side (another pool: ``case.dst_world_size``, ``case.dst_plan``) builds a fresh model
  and optimizer, loads the model's full params (not under test), loads the optimizer state
  through the path (timed), saves again (P7) and trains ``case.resume_steps`` more steps (P6);
  for a golden case (P12 alone: golden/kind.py) it stops after recording the loaded state.
- Everything returned is on CPU, cloned, in the reference's neutral named form. Ranks only
  record; the controller decides every verdict.
- What a side records is a ``records.SaveRecord`` / ``records.LoadRecord`` (its fields say
  which property reads what).
- A path that raises is recorded as a ``records.RecordedError`` (``common.guarded``: DCP's
  ``CheckpointException`` included; the rank marks the call failed so that the pool decides
  it within its error grace when other ranks are left waiting) except on the load side of a
  fault case (``case.fault``), where the exception propagates so the pool reports which
  ranks raised and which were left waiting (P15).
"""
from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from ..cases import Case
from ..zoo import build_optimizer, build_scheduler, scheduler_state
from . import fsdp1
from .trained import keep, trained
from .common import guarded, is_error, timed
from .records import LoadRecord, SaveRecord
from .registry import (DCP_DIR, FULL_FILE, MODEL_FILE, SCHED_FILE,  # noqa: F401 (re-exported)
                       api_path, is_full_path, paths_of, rank_file, resizable)
from .fsdp1 import to_cpu, flat_sharded_to_neutral, clean_name, named_local, optimizer_keys

ALL_RANKS_FLIP = ("all_ranks", {"rank0_only": False, "offload": False})
"""A full path's P9 flip: the same save on every rank, without offloading."""

FSDP1_PATHS = paths_of("fsdp1")


def _build(ctx, case: Case, load_side: bool):
    model = fsdp1.wrap_fsdp1(ctx, case, plan=case.dst_plan if load_side else case.plan)
    names = [(grouping_name(n, p), p) for n, p in model.named_parameters()]
    optim = build_optimizer(case.optimizer, names, case.groups, impl=case.impl)
    sched = (build_scheduler(optim, case.model, case.scheduler)
             if case.scheduler and not (load_side and case.scheduler_after_load) else None)
    return model, optim, sched, optimizer_keys(model, optim)


def grouping_name(name: str, param) -> str:
    """The name ``zoo.build_optimizer`` sorts a param into a group by: its clean FQN, or for
    a FlatParameter the FQNs it holds joined by "|" (so a unit lands in the group its
    original params are in, as in the single-process run)."""
    fqns = getattr(param, "_fqns", None)
    if fqns is None:
        return clean_name(name)
    prefix = clean_name(name)[: -len("_flat_param")]
    return "|".join(prefix + f for f in fqns)


def full_params(model) -> dict[str, torch.Tensor]:
    """Every param of the model, unsharded, by clean FQN (tied params once)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.summon_full_params(model, writeback=False):
        return {clean_name(n): p.detach().to("cpu", copy=True)
                for n, p in model.named_parameters()}


def load_params(ctx, model, params: dict[str, torch.Tensor]) -> None:
    """The saved params into the load side's FSDP1 model (not under test): every rank
    copies the whole of them in under ``summon_full_params``."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.summon_full_params(model, writeback=True), torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(params[clean_name(n)])


def steps(api: str):
    """The module of ``api``'s own steps (fsdp1_paths/__init__.py), by its record."""
    return api_path(api).sides()


def save_path(case: Case, model, optim, *, rank0_only: bool = True,
              offload: bool | None = None) -> Any:
    """The path's save call on this rank (what a trainer calls before writing); ``offload``
    None: the path's own default (its module's ``save`` signature: FSDP1's calls offload,
    DSD's sharded save does not)."""
    flags = {} if offload is None else {"offload": offload}
    return steps(case.api).save(case, model, optim, rank0_only=rank0_only, **flags)


def full_optim(model, optim, rank0_only: bool) -> Any:
    """FSDP1's legacy ``full_optim_state_dict`` (the legacy full, scatter and rekey saves)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return FSDP.full_optim_state_dict(model, optim, rank0_only=rank0_only)


def model_sharded_sd(model) -> dict:
    """The FSDP1 model's SHARDED_STATE_DICT (what a DCP checkpoint holds beside the optim)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType

    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        return model.state_dict()


def write_saved(ctx, case: Case, model, saved: Any, workdir: Path, sub: str = "") -> float:
    """Write what the path saved, as a trainer would; returns the seconds it took."""
    import torch.distributed as dist

    out = workdir / sub if sub else workdir
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    steps(case.api).write(ctx, case, model, saved, out)
    dist.barrier(group=ctx.group)
    return time.perf_counter() - t0


def write_full(ctx, saved: Any, out: Path) -> None:
    """A full path's write: rank 0 torch.saves the dict (the others hold ``{}``)."""
    if ctx.rank == 0:
        atomic_save(saved, out / FULL_FILE)


def write_dcp(ctx, model_sd: dict, saved: Any, out: Path) -> None:
    """A DCP path's write: ``dcp.save({"model", "optim"})`` on every rank."""
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": model_sd, "optim": saved}, checkpoint_id=str(out / DCP_DIR),
             process_group=ctx.group)


def _plain_pair(case: Case):
    """The unwrapped zoo model and the optimizer a plain trainer builds for it (the zoo's
    grouping): the ids of a PARAM_ID dict are positions in that optimizer's groups."""
    from .rekey import plain_model, plain_optimizer

    model = plain_model(case)
    return model, plain_optimizer(case, model)


def to_param_ids(case: Case, full: dict) -> dict:
    """A full FQN-keyed dict rekeyed to PARAM_ID for the unwrapped model (rekey path)."""
    from .rekey import rekey_osd

    return rekey_osd(full, "id", *_plain_pair(case))


def to_param_names(case: Case, ids: dict) -> dict:
    """A PARAM_ID dict of the unwrapped model rekeyed back to FQNs (rekey path)."""
    from .rekey import rekey_osd

    return rekey_osd(ids, "name", *_plain_pair(case))


def atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _record(case: Case, saved: Any, rank: int, keys: list[str]) -> Any:
    """The saved object in the neutral named form sent back to the controller."""
    if is_error(saved):
        return saved
    if not is_full_path(case.api):
        return flat_sharded_to_neutral(saved)
    return to_cpu(named_local(saved, keys)) if saved else {}


def devices_of(obj: Any) -> set[str]:
    if isinstance(obj, torch.Tensor):
        return {str(obj.device)}
    if hasattr(obj, "local_shards"):
        return {str(s.tensor.device) for s in obj.local_shards()}
    if hasattr(obj, "to_local"):
        return {str(obj.to_local().device)}
    if isinstance(obj, dict):
        return set().union(*(devices_of(v) for v in obj.values())) if obj else set()
    if isinstance(obj, (list, tuple)):
        return set().union(*(devices_of(v) for v in obj)) if obj else set()
    return set()


def save_side(ctx, case: Case, workdir: str) -> SaveRecord:
    """Train, save through the path, write it; record everything the properties need."""
    workdir = Path(workdir)
    tr = trained(ctx, case, lambda: _build(ctx, case, load_side=False),  # or the kept one
                 lambda m, o, s: fsdp1.train(ctx, case, m, o, case.steps, sched=s))
    model, optim, sched, keys, losses = tr.model, tr.optim, tr.sched, tr.keys, tr.losses
    sched_at_save = scheduler_state(sched)
    meta = fsdp1.flat_metadata(model)
    local = to_cpu(named_local(optim.state_dict(), keys))
    params = full_params(model)
    saved, t_save = guarded(save_path, case, model, optim)
    timings = {"save": t_save}
    saved_devices = sorted(devices_of(saved))
    record = _record(case, saved, ctx.rank, keys)
    if not is_error(saved):
        timings["write"] = write_saved(ctx, case, model, saved, workdir)
    saved_ids = None
    if ctx.rank == 0 and api_path(case.api).rekeys and not is_error(record):
        saved_ids = to_cpu(guarded(to_param_ids, case, saved)[0])
    if ctx.rank == 0:
        atomic_save(params, workdir / MODEL_FILE)
        if sched is not None:
            atomic_save(sched.state_dict(), workdir / SCHED_FILE)
    # P9: the same save with the flags flipped (the path's P9_FLIP)
    flips: dict[str, Any] = {"all_ranks": None, "unoffloaded": None, "offloaded": None}
    flip = steps(case.api).P9_FLIP
    if flip is not None:
        field, flags = flip
        flipped, _ = guarded(save_path, case, model, optim, **flags)
        flips[field] = _record(case, flipped, ctx.rank, keys)
    keep(tr)  # for the next path that trains alike (sut/trained.py)
    return SaveRecord(rank=ctx.rank, keys=keys, meta=meta, local=local, losses=losses,
                      reused_training=tr.reused,
                      timings=timings, saved=record, saved_devices=saved_devices,
                      params=params if ctx.rank == 0 else None, saved_ids=saved_ids,
                      **flips,
                      device=str(ctx.device), sched=sched_at_save)


def read_saved(ctx, case: Case, workdir: Path) -> tuple[Any, str]:
    """Read what the save side wrote, as a resuming trainer would: ``torch.load`` with
    ``weights_only=True``; if that refuses the file, note why (P8) and read it without."""
    rec = api_path(case.api)
    if rec.full_load == "scatter" and ctx.rank != 0:
        return None, ""  # rank 0 alone reads the file and scatters it
    if rec.full:
        path = workdir / FULL_FILE
    elif rec.writes == "per_rank":
        path = workdir / rank_file(ctx.rank)
    else:
        return None, ""
    try:
        return torch.load(path, weights_only=True), ""
    except Exception as exc:  # noqa: BLE001
        if case.fault and not _weights_only_refusal(exc):
            raise  # a damaged file: its own error is what P15 judges
        note = f"torch.load(weights_only=True) refused {path.name}: {type(exc).__name__}: {exc}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, weights_only=False), note


def _weights_only_refusal(exc: Exception) -> bool:
    """torch.load(weights_only=True) refusing a type it does not allow (not damage)."""
    return "Weights only load failed" in str(exc) and "Unsupported global" in str(exc)


def load_path(ctx, case: Case, model, optim, saved: Any, workdir: Path) -> None:
    """The path's load call on this rank, then ``optim.load_state_dict`` (DSD's
    ``set_optimizer_state_dict`` loads the optimizer itself)."""
    flat = steps(case.api).load(ctx, case, model, optim, saved, workdir)
    if flat is not None:
        optim.load_state_dict(flat)


def load_side(ctx, case: Case, workdir: str) -> LoadRecord:
    """Fresh model and optimizer at the load world size and plan; load, save again, resume."""
    workdir = Path(workdir)
    model, optim, sched, keys = _build(ctx, case, load_side=True)
    load_params(ctx, model, torch.load(workdir / MODEL_FILE, weights_only=True))
    head = dict(rank=ctx.rank, keys=keys, meta=fsdp1.flat_metadata(model))
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    saved, note = read_saved(ctx, case, workdir)
    timings["read"] = time.perf_counter() - t0
    reread = reread_ids = None
    if ctx.rank == 0 and api_path(case.api).rekeys:
        reread_ids = to_cpu(saved)
        names, _ = guarded(to_param_names, case, saved)
        reread = to_cpu(names)
    elif ctx.rank == 0 and is_full_path(case.api):
        reread = to_cpu(named_local(saved, keys)) if saved else {}
    elif api_path(case.api).writes == "per_rank" and saved is not None:
        reread = _record(case, saved, ctx.rank, keys)  # this rank's own file (P8)
    head.update(timings=timings, weights_only_refused=note, reread=reread,
                reread_ids=reread_ids)
    if case.fault:  # P15: let it raise, so the pool shows every rank's outcome
        _, timings["load"] = timed(load_path, ctx, case, model, optim, saved, workdir)
        return LoadRecord(**head, loaded=to_cpu(named_local(optim.state_dict(), keys)))
    res, timings["load"] = guarded(load_path, ctx, case, model, optim, saved, workdir)
    if is_error(res):
        return LoadRecord(**head, loaded=res)
    if case.scheduler_after_load:  # built now, on the loaded optimizer (Case)
        sched = build_scheduler(optim, case.model, case.scheduler)
    if sched is not None:
        sched.load_state_dict(torch.load(workdir / SCHED_FILE, weights_only=True))
    loaded = to_cpu(named_local(optim.state_dict(), keys))
    head.update(sched_loaded=scheduler_state(sched))
    if case.golden:  # P12 reads the loaded state alone (golden/kind.py): no resave, no resume
        return LoadRecord(**head, loaded=loaded)
    resaved, timings["resave"] = guarded(save_path, case, model, optim)
    resaved = _record(case, resaved, ctx.rank, keys)
    losses = fsdp1.train(ctx, case, model, optim, case.resume_steps,
                         start_step=case.steps, sched=sched)
    final_local = to_cpu(named_local(optim.state_dict(), keys))
    params = full_params(model)
    return LoadRecord(**head, loaded=loaded, resaved=resaved, losses=losses,
                      final_local=final_local, sched_final=scheduler_state(sched),
                      final_params=params)
