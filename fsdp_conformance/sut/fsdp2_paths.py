"""The API paths of the conformance run, FSDP2 side (``fully_shard`` +
``torch.distributed.checkpoint.state_dict``): one save and one load per path, run as a round
trip over disk, observed on every rank. Same interface, files and records
(``records.SaveRecord`` / ``LoadRecord``) as ``sut.paths`` (the FSDP1 side), so the runner,
the properties and ``faults`` treat both alike.

Paths (``Case.api``)
    fsdp2.full     ``get_optimizer_state_dict(full_state_dict=True, cpu_offload=True)`` (rank 0
                   gets the full dict, the others ``{}``) -> torch.save on rank 0 -> every rank
                   torch.load(weights_only=True) -> ``set_optimizer_state_dict(full_state_dict=True,
                   broadcast_from_rank0=True)``: rank 0 passes the dict, the others ``{}``
    fsdp2.sharded  ``get_optimizer_state_dict()`` (DTensor values) -> ``dcp.save({"model",
                   "optim"})`` at N -> at M, the documented resume recipe: the template is
                   ``get_optimizer_state_dict()`` of the fresh model and optimizer, filled in place
                   by ``dcp.load({"optim": template})``, then ``set_optimizer_state_dict``

Rules
- Model and wrapping: ``sut.fsdp2.wrap_fsdp2`` (the case's plan and tensor-parallel degree
  on the save side, its load plan and load degree on the load side; ``use_orig_params``
  means nothing to FSDP2 and is ignored). The
  optimizer is the zoo's, with the case's groups and implementation; keys are
  ``named_parameters()`` names in the optimizer's order.
- The load side loads the model's params from the full file the save side wrote, each
  rank copying its own piece in (``load_params``; not under test: buffers are not in the
  file), then the optimizer state through the path (timed), saves again (P7) and trains
  ``case.resume_steps`` more steps (P6); for a golden case (P12 alone: golden/kind.py) it
  stops after recording the loaded state.
- P9: fsdp2.full also saves with ``cpu_offload=False`` (every rank gets the full dict, on its
  device) into ``SaveRecord.all_ranks``; fsdp2.sharded also saves with ``cpu_offload=True``
  into ``SaveRecord.offloaded`` (with ``offloaded_devices``).
- Recorded forms: local dicts FQN-keyed with plain local tensors (``DTensor.to_local()``);
  a sharded dict's DTensor values as ``{"global_shape", "local", "offsets"}`` (torch's own
  global offset of the local piece), which ``run_props.assemble_sharded`` tiles.
- Everything returned is on CPU, cloned. A path that raises is recorded as a
  ``records.RecordedError`` (DCP's ``CheckpointException`` included), except: on the load side
  of a fault case (``case.fault``) the exception propagates, and a load that raised on some
  ranks while the others stay blocked in a collective raises too (``_load_guarded``); then
  the pool reports which ranks raised and which were left waiting, instead of a hang.
"""
from __future__ import annotations

import concurrent.futures
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from ..cases import Case
from ..zoo import build_optimizer, build_scheduler, freeze_at_save, scheduler_state
from .fsdp1 import named_local, optimizer_keys, train
from .fsdp2 import (local_to_cpu, is_dtensor, mesh_shape, own_mixed_precision, param_layout,
                    torch_piece, wrap_fsdp2)
from .common import guarded, is_error, timed
from .app_state import APP_KEY, AppState
from .trained import keep, trained
from .records import LoadRecord, SaveRecord
from .registry import paths_of
from .paths import (DCP_DIR, FULL_FILE, MODEL_FILE, SCHED_FILE, atomic_save, devices_of,
                    is_full_path, rank_file, read_saved, resizable)

__all__ = ["FSDP2_PATHS", "FULL_FILE", "MODEL_FILE", "SCHED_FILE", "DCP_DIR", "is_full_path",
           "resizable", "rank_file", "save_side", "load_side"]

FSDP2_PATHS = paths_of("fsdp2")
# How long a rank whose load call raised waits for the other ranks to return from theirs
# before it concludes they are blocked in a collective (see ``_load_guarded``).
STRAND_WAIT_S = 5.0


def _check(api: str) -> None:
    if api not in FSDP2_PATHS:
        raise ValueError(f"{api!r} is not an FSDP2 path of sut.fsdp2_paths; known: {FSDP2_PATHS}")


def _options(case: Case | None = None, **kw):
    """``StateDictOptions(**kw)``, flattened and without the model's frozen params where the
    case says (``Case.flatten_optimizer_state_dict``, ``Case.ignore_frozen_params``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    if case is not None and case.flatten_optimizer_state_dict:
        kw["flatten_optimizer_state_dict"] = True
    if case is not None and case.ignore_frozen_params:
        kw["ignore_frozen_params"] = True
    return StateDictOptions(**kw)


def _load_options(case: Case, **kw):
    """``_options`` of a load: ``strict=False`` where the case says (``Case.nonstrict``)."""
    if case.nonstrict:
        kw["strict"] = False
    return _options(case, **kw)


def _group_fqns(optim, keys: list[str]) -> list[list[str]]:
    """The optimizer's param groups as FQN lists (``keys``: the FQNs in the optimizer's
    order)."""
    out, i = [], 0
    for g in optim.param_groups:
        out.append(keys[i:i + len(g["params"])])
        i += len(g["params"])
    return out


def nested(case: Case, saved: Any, optim, keys: list[str]) -> Any:
    """What the path saved, in the nested form the properties read: a flattened dict
    (``Case.flatten_optimizer_state_dict``) through ``reference.keys.unflatten_osd`` with
    the optimizer's groups, any other as it is."""
    from ..reference.keys import unflatten_osd

    if not case.flatten_optimizer_state_dict or is_error(saved) or not saved:
        return saved
    return unflatten_osd(saved, _group_fqns(optim, keys))


def _build(ctx, case: Case, load_side: bool):
    model = wrap_fsdp2(ctx, case, plan=case.dst_plan if load_side else case.plan,
                       tensor_parallel=case.tensor_parallel_of(load_side))
    if load_side:  # a model frozen at the save is loaded frozen (zoo ModelSpec)
        freeze_at_save(model, case.model)
    optim = build_optimizer(case.optimizer, list(model.named_parameters()), case.groups,
                            impl=case.impl)
    sched = (build_scheduler(optim, case.model, case.scheduler)
             if case.scheduler and not (load_side and case.scheduler_after_load) else None)
    return model, optim, sched, optimizer_keys(model, optim)


def compiled_for(case: Case, model, load_side: bool):
    """What trains and checkpoints on this side: ``torch.compile(model, backend="eager")``
    where the case compiles this side (``Case.compiled``; its FQNs carry ``_orig_mod``, as
    a trainer's compiled model does), else the model itself. Layouts and params are still
    read from the FSDP module."""
    side = "load" if load_side else "save"
    if case.compiled not in (side, "both"):
        return model
    return torch.compile(model, backend="eager")


def local_state(optim, keys: list[str]) -> dict:
    """The rank's ``optim.state_dict()``: FQN-keyed, DTensors as their local tensors, CPU."""
    return local_to_cpu(named_local(optim.state_dict(), keys))


def full_params(model) -> dict[str, torch.Tensor]:
    """Every param of the model, unsharded (``full_tensor()``: a collective), by FQN."""
    out = {}
    for n, p in model.named_parameters():
        t = p.full_tensor() if is_dtensor(p) else p
        out[n] = t.detach().to("cpu", copy=True)
    return out


def load_params(ctx, model, params: dict[str, torch.Tensor]) -> None:
    """The saved params into the load side's model (not under test; every rank holds
    ``params``): each rank copies its own piece of every param the file has, at torch's
    offset and shape of that piece (``sut.fsdp2.torch_piece``, which P0 checks against the
    reference); plain (ignored) params whole. No state-dict API: torch
    2.13 and 2.15 raise a bare AssertionError loading a full model state dict on every
    rank into FSDP2 over tensor parallelism with uneven dp rows, and 2.8 fails the same
    load with ``broadcast_from_rank0`` (notes/repro/tp_uneven_full_load.py)."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n not in params:
                continue
            full = params[n]
            if is_dtensor(p):
                shape, off = torch_piece(p)
                full = full[tuple(slice(o, o + d) for o, d in zip(off, shape))]
                p = p.to_local()
            p.copy_(full)


def save_path(case: Case, model, optim, *, cpu_offload: bool | None = None) -> Any:
    """The path's save call on this rank (what a trainer calls before writing). The path's
    own ``cpu_offload`` unless told: a full path True (the rank-0-only form), a sharded one
    False (the default options)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    _check(case.api)
    if cpu_offload is None:
        cpu_offload = is_full_path(case.api)
    if is_full_path(case.api):
        return get_optimizer_state_dict(
            model, optim, options=_options(case, full_state_dict=True, cpu_offload=cpu_offload))
    if case.app_state:  # what the app state's state_dict() holds (sut/app_state.py)
        from torch.distributed.checkpoint.state_dict import get_state_dict

        return get_state_dict(model, optim, options=_options(case, cpu_offload=cpu_offload))[1]
    return get_optimizer_state_dict(model, optim, options=_options(case, cpu_offload=cpu_offload))


def sharded_to_neutral(sharded: dict) -> dict:
    """DTensor values -> ``{"global_shape", "local", "offsets"}`` (torch's global offset of
    the local piece); everything else CPU clones."""
    state = {}
    for fqn, st in sharded.get("state", {}).items():
        conv = {}
        for n, v in st.items():
            if is_dtensor(v):
                conv[n] = {"global_shape": tuple(v.shape), "dtensor": True,
                           "local": local_to_cpu(v.to_local()), "offsets": torch_piece(v)[1]}
            else:
                conv[n] = local_to_cpu(v)
        state[fqn] = conv
    return {"state": state, "param_groups": local_to_cpu(sharded.get("param_groups", []))}


def _record(case: Case, saved: Any, optim, keys: list[str]) -> Any:
    """The saved object in the neutral named form sent back to the controller (a flattened
    dict nested first: ``nested``)."""
    if is_error(saved):
        return saved
    saved = nested(case, saved, optim, keys)
    if not is_full_path(case.api):
        return sharded_to_neutral(saved)
    return local_to_cpu(named_local(saved, keys)) if saved else {}


_CHECKPOINT_GROUPS: dict[int, Any] = {}


def checkpoint_group(ctx):
    """A gloo group of the pool's ranks for ``dcp.async_save`` alone, created once per
    process group (a collective: every rank calls it on its first async save). The write's
    collectives run in a background thread; on the training group they meet the next
    step's FSDP all-gathers and a rank aborts (SIGABRT in gloo, seen on torch 2.13), so
    trainers give async checkpointing a group of its own (torchtitan's CheckpointManager
    does)."""
    import torch.distributed as dist

    key = id(ctx.group)
    if key not in _CHECKPOINT_GROUPS:
        ranks = dist.get_process_group_ranks(ctx.group)
        _CHECKPOINT_GROUPS[key] = dist.new_group(ranks=ranks, backend="gloo")
    return _CHECKPOINT_GROUPS[key]


WRITE_TIMEOUT_S = 60.0
"""How long the save side waits on ``dcp.async_save``'s Future (a write that never finishes
is an error naming it, not a hang until the pool's timeout)."""


def write_saved(ctx, case: Case, model, saved: Any, workdir: Path, racing=None,
                app=None) -> float:
    """Write what the path saved, as a trainer would; returns the seconds it took.
    ``Case.async_save``: ``dcp.async_save``, then ``racing()`` (the trainer's next step)
    while the write may still run, then the wait on its Future. ``Case.app_state``: DCP
    writes ``app`` (an ``AppState``) under ``APP_KEY`` instead of the saved dict."""
    import torch.distributed as dist

    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if is_full_path(case.api):
        if ctx.rank == 0:
            atomic_save(saved, workdir / FULL_FILE)
    else:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = ({APP_KEY: app} if case.app_state
                 else {"model": get_model_state_dict(model, options=_options(case)),
                       "optim": saved})
        if case.async_save:
            future = dcp.async_save(state, checkpoint_id=str(workdir / DCP_DIR),
                                    process_group=checkpoint_group(ctx))
            if racing is not None:
                racing()
            try:
                future.result(timeout=WRITE_TIMEOUT_S)
            except concurrent.futures.TimeoutError:
                # its writer thread may still hold the checkpoint group: never reuse it
                group = _CHECKPOINT_GROUPS.pop(id(ctx.group), None)
                if group is not None:
                    dist.destroy_process_group(group)
                raise RuntimeError(f"dcp.async_save did not finish within {WRITE_TIMEOUT_S:.0f} "
                                   f"s on rank {ctx.rank} ({workdir / DCP_DIR})") from None
        else:
            dcp.save(state, checkpoint_id=str(workdir / DCP_DIR), process_group=ctx.group)
    dist.barrier(group=ctx.group)
    return time.perf_counter() - t0


def save_side(ctx, case: Case, workdir: str) -> SaveRecord:
    """Train, save through the path, write it; record everything the properties need."""
    _check(case.api)
    workdir = Path(workdir)
    tp = case.tensor_parallel_of(load_side=False)
    runs = []  # what trained: the model, or its compiled wrapper, which then saves too

    def train_then_freeze(model, optim, sched) -> list[float]:
        runs.append(compiled_for(case, model, load_side=False))
        losses = train(ctx, case, runs[0], optim, case.steps, sched=sched, tensor_parallel=tp)
        freeze_at_save(model, case.model)  # trained, then frozen before the save (zoo ModelSpec)
        return losses

    tr = trained(ctx, case, lambda: _build(ctx, case, load_side=False), train_then_freeze)
    model, optim, sched, keys, losses = tr.model, tr.optim, tr.sched, tr.keys, tr.losses
    sched_at_save = scheduler_state(sched)  # before an async write's racing step moves it
    run = runs[0] if runs else model  # a kept training is never a compiled one (sut/trained.py)
    mesh, meta, local = mesh_shape(ctx, case, tp), param_layout(model), local_state(optim, keys)
    params = full_params(model)
    saved, t_save = guarded(save_path, case, run, optim)
    timings = {"save": t_save}
    saved_devices = sorted(devices_of(saved))
    record = _record(case, saved, optim, keys)
    # P9: the same save with the flag flipped (before the write: an async write races the
    # next step, which changes the state)
    all_ranks = offloaded = offloaded_devices = None
    if is_full_path(case.api):
        flipped, _ = guarded(save_path, case, run, optim, cpu_offload=False)
        all_ranks = _record(case, flipped, optim, keys)
    else:
        off, _ = guarded(save_path, case, run, optim, cpu_offload=True)
        offloaded_devices = sorted(devices_of(off))
        offloaded = _record(case, off, optim, keys)

    def race():  # the trainer's next step while an async write runs, timed ("race")
        t0 = time.perf_counter()
        train(ctx, case, run, optim, 1, start_step=case.steps, tensor_parallel=tp)
        timings["race"] = time.perf_counter() - t0

    racing = race if case.async_save else None  # the records are copies (local_to_cpu)
    app = AppState(run, optim, sched, step=case.steps, options=_options(case)) \
        if case.app_state else None
    if not is_error(saved):
        timings["write"] = write_saved(ctx, case, run, saved, workdir, racing=racing, app=app)
    if ctx.rank == 0:
        atomic_save(params, workdir / MODEL_FILE)
        if sched is not None:
            atomic_save(sched.state_dict(), workdir / SCHED_FILE)
    keep(tr)  # for the next path that trains alike (sut/trained.py)
    return SaveRecord(rank=ctx.rank, keys=keys, meta=meta, local=local, losses=losses,
                      reused_training=tr.reused,
                      mesh_shape=mesh, timings=timings, saved=record,
                      saved_devices=saved_devices, params=params if ctx.rank == 0 else None,
                      all_ranks=all_ranks, offloaded=offloaded,
                      offloaded_devices=offloaded_devices, device=str(ctx.device),
                      own_mixed_precision=own_mixed_precision(model),
                      sched=sched_at_save)


def load_path(ctx, case: Case, model, optim, saved: Any, workdir: Path, sched=None):
    """The path's load call on this rank (it ends in ``optim.load_state_dict``);
    ``Case.app_state``: ``dcp.load`` of an ``AppState`` (it restores ``sched`` too), which
    returns the step the app state restored (None otherwise)."""
    from torch.distributed.checkpoint.state_dict import (get_optimizer_state_dict,
                                                         set_optimizer_state_dict)

    _check(case.api)
    if is_full_path(case.api) and case.no_broadcast:  # every rank its own full dict
        set_optimizer_state_dict(model, optim, saved,
                                 options=_load_options(case, full_state_dict=True))
        return
    if is_full_path(case.api):
        set_optimizer_state_dict(
            model, optim, saved if ctx.rank == 0 else {},
            options=_load_options(case, full_state_dict=True, broadcast_from_rank0=True))
        return
    import torch.distributed.checkpoint as dcp

    if case.app_state:
        app = AppState(model, optim, sched, step=-1, options=_load_options(case))
        dcp.load({APP_KEY: app}, checkpoint_id=str(workdir / DCP_DIR), process_group=ctx.group)
        return app.step  # P11 compares it with the save's
    template = get_optimizer_state_dict(model, optim, options=_options(case))
    dcp.load({"optim": template}, checkpoint_id=str(workdir / DCP_DIR),
             process_group=ctx.group)
    set_optimizer_state_dict(model, optim, template, options=_load_options(case))


def _load_guarded(ctx, case: Case, model, optim, saved: Any, workdir: Path,
                  sched=None) -> tuple[Any, float]:
    """The guarded load call. A rank whose call raised returns its error only once every rank
    has returned from the call (each drops a marker file in the work directory); if some have
    not within ``STRAND_WAIT_S`` (they wait in a collective the failed rank never joins:
    ``broadcast_from_rank0`` after rank 0 rejected the dict), it raises, so the pool reports
    the error and the stranded ranks instead of a silent hang."""
    import torch.distributed as dist

    box = [uuid.uuid4().hex if ctx.rank == 0 else None]  # this call's marker names
    dist.broadcast_object_list(box, src=0, group=ctx.group)

    def marker(r: int) -> Path:
        return workdir / f".load_returned_{box[0]}_rank{r}"

    res, took = guarded(load_path, ctx, case, model, optim, saved, workdir, sched=sched)
    marker(ctx.rank).touch()
    if not is_error(res) or ctx.world_size == 1:
        return res, took
    deadline = time.monotonic() + STRAND_WAIT_S
    while True:
        missing = [r for r in range(ctx.world_size) if not marker(r).exists()]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if missing:
        raise StrandedRanksError(f"the {case.api} load raised on rank {ctx.rank} while rank(s) "
                           f"{missing} did not return from it within {STRAND_WAIT_S:.0f} s "
                           f"(left waiting in a collective):\n{res.traceback}")
    return res, took


class StrandedRanksError(RuntimeError):
    """The suite's own report that a load raised on this rank while others stayed inside it
    (waiting in a collective): its own type, so a known entry's exception model tells it
    apart from torch's exceptions (known/model.py ``Raises.alongside``)."""


def load_side(ctx, case: Case, workdir: str) -> LoadRecord:
    """Fresh model and optimizer at the load world size and plan; load, save again, resume."""
    _check(case.api)
    workdir = Path(workdir)
    model, optim, sched, keys = _build(ctx, case, load_side=True)
    run = compiled_for(case, model, load_side=True)
    load_params(ctx, model, torch.load(workdir / MODEL_FILE, weights_only=True))  # not under test
    tp = case.tensor_parallel_of(load_side=True)
    head = dict(rank=ctx.rank, keys=keys, mesh_shape=mesh_shape(ctx, case, tp),
                meta=param_layout(model))
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    saved, note = read_saved(ctx, case, workdir)
    timings["read"] = time.perf_counter() - t0
    reread = None
    if ctx.rank == 0 and is_full_path(case.api):
        reread = local_to_cpu(named_local(nested(case, saved, optim, keys), keys)) if saved else {}
    head.update(timings=timings, weights_only_refused=note, reread=reread)
    if case.fault:  # P15: let it raise, so the pool shows every rank's outcome
        _, timings["load"] = timed(load_path, ctx, case, run, optim, saved, workdir)
        return LoadRecord(**head, loaded=local_state(optim, keys))
    res, timings["load"] = _load_guarded(ctx, case, run, optim, saved, workdir, sched=sched)
    if is_error(res):
        return LoadRecord(**head, loaded=res)
    if case.scheduler_after_load:  # built now, on the loaded optimizer (Case)
        sched = build_scheduler(optim, case.model, case.scheduler)
    if sched is not None and not case.app_state:  # the app state restored it from DCP
        sched.load_state_dict(torch.load(workdir / SCHED_FILE, weights_only=True))
    loaded = local_state(optim, keys)
    head.update(sched_loaded=scheduler_state(sched),
                step_loaded=res if case.app_state else None)
    if case.golden:  # P12 reads the loaded state alone (golden/kind.py): no resave, no resume
        return LoadRecord(**head, loaded=loaded)
    resaved, timings["resave"] = guarded(save_path, case, run, optim)
    resaved = _record(case, resaved, optim, keys)
    losses = train(ctx, case, run, optim, case.resume_steps, start_step=case.steps,
                   sched=sched, tensor_parallel=tp)
    final_local = local_state(optim, keys)
    params = full_params(model)
    return LoadRecord(**head, loaded=loaded, resaved=resaved, losses=losses,
                      final_local=final_local, sched_final=scheduler_state(sched),
                      final_params=params)
