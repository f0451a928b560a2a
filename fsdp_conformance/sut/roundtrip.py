"""The one rank-side round trip of the conformance run: train, save through the path, write,
then at the load side's world size and plan build afresh, load through the path, save again
and resume; observed on every rank. Every API path of both FSDP APIs runs here
(``save_side`` / ``load_side``, the only definitions in the package); a user's own save/load
(user/rank_side.py) runs the same stages: ``build``, ``train_for_save`` (which freezes at
the save what the model freezes there) and the family record.

What varies is passed in, never branched on by path name:
- the family (``sut.family.RankFamily``, from ``Case.family``): wrapping, the layout P0
  reads, the mesh, full params out and in, the neutral form of a sharded dict;
- the path's steps (its module, named by its ``api_paths.ApiPath`` record; the
  ``PathSteps`` protocol): ``save``, ``write``, ``load`` and the P9 flip it declares
  (``FLIP``: one ``Flip``: the flags flipped and what the flip is called);
- what the record says of the path (``full``, ``writes``, ``rekeys``): the saved form, what
  is read back (P5, P8);
- what the case's kind asks of the load: a fault case (P15) lets the load raise so the pool
  shows every rank's outcome; a golden case (P12 alone) stops after recording the loaded
  state.

Rules
- The save side trains ``case.steps`` steps (or takes the state a path before it trained
  alike: sut/trained.py), freezes what the model freezes at the save (zoo ``ModelSpec``),
  saves through the path (timed), saves with the path's flags flipped (P9, before the write:
  an async write races the next step), writes the file(s) under the case's work directory,
  and rank 0 writes the full params and the LR scheduler's state. The load side builds a
  fresh model (frozen as at the save) and optimizer, loads the model's full params (not
  under test), reads the files back (P8), loads the optimizer state through the path
  (timed), builds the scheduler now where the case builds it after the load, restores it,
  saves again (P7) and trains ``case.resume_steps`` more steps (P6).
- ``Case.compiled``: the side trains and checkpoints through ``torch.compile(model,
  backend="eager")``; layouts and params are read from the FSDP module.
- Everything returned is on CPU, cloned, in the reference's neutral named form; what a side
  records is a ``records.SaveRecord`` / ``records.LoadRecord``. Ranks only record; the
  controller decides every verdict.
- A call that raises is recorded as a ``records.RecordedError`` (``common.guarded``: DCP's
  ``CheckpointException`` included; the rank marks the call failed so that the pool decides
  it within its error grace when other ranks are left waiting). Under a family with
  ``strand_guard`` a load that raised on some ranks while the others stay blocked in a
  collective raises ``StrandedRanksError`` (``load_guarded``), and a fault case's load
  raises as it is; then the pool reports which ranks raised and which were left waiting,
  instead of a hang.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Protocol

import torch

from ..cases import Case
from ..zoo import build_optimizer, build_scheduler, freeze_at_save, scheduler_state
from .common import guarded, is_error, timed
from .crash_points import armed
from .family import rank_family
from .files import atomic_save, devices_of, read_saved
from .fsdp1 import named_local, optimizer_keys, train
from .fsdp2 import local_to_cpu
from .records import LoadRecord, SaveRecord
from ..api_paths import MODEL_FILE, SCHED_FILE, api_path
from .rekey import to_param_ids, to_param_names
from .asks import ROUND_TRIP_ASKS, SideAsks
from .trained import keep, trained
from ..reference.keys import unflatten_osd

# How long a rank whose load call raised waits for the other ranks to return from theirs
# before it concludes they are blocked in a collective (see ``load_guarded``).
STRAND_WAIT_S = 5.0


@dataclass(frozen=True, kw_only=True)
class Flip:
    """A path's P9 flip: the same save with its flags flipped (properties/flags.py)."""

    name: str
    """What the flip is, as P9 reads it: ``"all_ranks"`` (rank0_only off, no offload: every
    rank gets the full dict), ``"unoffloaded"`` (a save that offloads, without offloading),
    ``"offloaded"`` (a save that does not offload, offloading)."""
    flags: dict
    """The keywords the path's ``save`` takes for it."""


ALL_RANKS = Flip(name="all_ranks", flags={"rank0_only": False, "offload": False})
"""An FSDP1 full path's P9 flip: the same save on every rank, without offloading."""


@dataclass(kw_only=True)
class Live:
    """What a side trains and checkpoints, handed to the path's ``write`` and ``load``."""

    model: Any
    """What trains and checkpoints: the wrapped model, or its compiled wrapper."""
    optim: Any
    """The optimizer."""
    sched: Any = None
    """The LR scheduler, or None."""
    step: int | None = None
    """The training step: the save's (an app state writes it); after a load, the step an
    app state restored (None where the path restores none)."""
    race: Callable[[], None] | None = None
    """``Case.async_save``: the trainer's next step, run while the write may still run."""


class PathSteps(Protocol):
    """What a path module holds (``sut/fsdp1_paths/``, ``sut/fsdp2_paths/``)."""

    FLIP: Flip | None
    """Its P9 flip, or None where the save has no flags to flip."""

    def save(self, case: Case, model: Any, optim: Any, **flags: Any) -> Any:
        """The path's save call on this rank (what a trainer calls before writing); the
        flags are P9's, their defaults the path's own."""

    def write(self, ctx: Any, case: Case, live: Live, saved: Any, out: Path) -> None:
        """Write what ``save`` returned under ``out``, as a trainer would."""

    def load(self, ctx: Any, case: Case, live: Live, saved: Any, workdir: Path) -> Any:
        """The path's load call on this rank: the dict to pass to
        ``optim.load_state_dict``, or None when the path loaded the optimizer itself."""


def steps(case: Case) -> ModuleType:
    """The module of ``case.api``'s own steps (``PathSteps``), by its record."""
    return api_path(case.api).sides()


def wrap_side(ctx, case: Case, load_side: bool):
    """A fresh model wrapped at this side's plan by the case's family; on the load side
    frozen as it was at the save (zoo ``ModelSpec``: a model that freezes params after
    training is loaded frozen)."""
    model = rank_family(case).wrap(ctx, case, case.dst_plan if load_side else case.plan,
                                   load_side)
    if load_side:
        freeze_at_save(model, case.model)
    return model


def equip(case: Case, model, load_side: bool):
    """The optimizer (the zoo's, grouped by the family's names) on the params ``model``
    holds now, its LR scheduler (none on a load side that builds it after the load), and
    the optimizer's keys."""
    fam = rank_family(case)
    named = [(fam.grouping(n, p), p) for n, p in model.named_parameters()]
    optim = build_optimizer(case.optimizer, named, case.groups, impl=case.impl)
    sched = (build_scheduler(optim, case.model, case.scheduler)
             if case.scheduler and not (load_side and case.scheduler_after_load) else None)
    return optim, sched, optimizer_keys(model, optim)


def mesh_of(model, planned):
    """The shape of the mesh the model's sharded params live on, where the case has one
    (``planned``: the case's mesh; None under FSDP1): the user's ``shard_fn`` (or a
    framework's prepare) may shard on a mesh of its own, of another shape with the same
    local pieces (a 1-D mesh for a one-replica HSDP side), and P0 judges the pieces on the
    mesh they are on."""
    if planned is None:
        return None
    shapes = [tuple(p.device_mesh.shape) for p in model.parameters()
              if getattr(p, "device_mesh", None) is not None]
    return max(shapes, key=len) if shapes else planned


def build(ctx, case: Case, load_side: bool):
    """``wrap_side`` then ``equip``: (model, optimizer, scheduler, keys)."""
    model = wrap_side(ctx, case, load_side)
    return (model, *equip(case, model, load_side))


def compiled_for(case: Case, model, load_side: bool):
    """What trains and checkpoints on this side: ``torch.compile(model, backend="eager")``
    where the case compiles this side (``Case.compiled``; its FQNs carry ``_orig_mod``, as
    a trainer's compiled model does), else the model itself."""
    side = "load" if load_side else "save"
    if case.compiled not in (side, "both"):
        return model
    return torch.compile(model, backend="eager")


def train_for_save(ctx, case: Case, model, optim, sched) -> tuple[Any, list[float]]:
    """Train ``case.steps`` steps on what this side trains (``compiled_for``), then freeze
    what the model freezes at the save (zoo ``ModelSpec``; the single-process baseline
    freezes there too). Returns (what trained, the losses)."""
    run = compiled_for(case, model, load_side=False)
    losses = train(ctx, case, run, optim, case.steps, sched=sched,
                   tensor_parallel=case.tensor_parallel_of(load_side=False))
    freeze_at_save(model, case.model)
    return run, losses


def local_state(optim, keys: list[str]) -> dict:
    """The rank's ``optim.state_dict()``: FQN-keyed, DTensors as their local tensors, CPU."""
    return local_to_cpu(named_local(optim.state_dict(), keys))


def _group_fqns(optim, keys: list[str]) -> list[list[str]]:
    """The optimizer's param groups as FQN lists (``keys``: the FQNs in its order)."""
    out, i = [], 0
    for g in optim.param_groups:
        out.append(keys[i:i + len(g["params"])])
        i += len(g["params"])
    return out


def nested(case: Case, saved: Any, optim, keys: list[str]) -> Any:
    """What the path saved, in the nested form the properties read: a flattened dict
    (``Case.flatten_optimizer_state_dict``) through ``reference.keys.unflatten_osd`` with
    the optimizer's groups, any other as it is."""
    if not case.flatten_optimizer_state_dict or is_error(saved) or not saved:
        return saved
    return unflatten_osd(saved, _group_fqns(optim, keys))


def neutral(case: Case, saved: Any, optim, keys: list[str]) -> Any:
    """The saved object in the neutral named form sent back to the controller: a full dict
    FQN-keyed (``{}`` where a rank got none), a sharded one in the family's form; an error
    as it is."""
    if is_error(saved):
        return saved
    saved = nested(case, saved, optim, keys)
    if not api_path(case.api).full:
        return rank_family(case).neutral_sharded(saved)
    return local_to_cpu(named_local(saved, keys)) if saved else {}


def save_call(case: Case, model, optim, **flags) -> Any:
    """The path's save call on this rank (``PathSteps.save``)."""
    return steps(case).save(case, model, optim, **flags)


def write(ctx, case: Case, live: Live, saved: Any, out: Path) -> float:
    """Write what the path saved, as a trainer would, then wait for every rank; returns the
    seconds it took."""
    import torch.distributed as dist

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    steps(case).write(ctx, case, live, saved, out)
    dist.barrier(group=ctx.group)
    return time.perf_counter() - t0


def load_call(ctx, case: Case, live: Live, saved: Any, workdir: Path) -> None:
    """The path's load call on this rank, then ``optim.load_state_dict`` of what it
    returned (a path that loads the optimizer itself returns None)."""
    flat = steps(case).load(ctx, case, live, saved, workdir)
    if flat is not None:
        live.optim.load_state_dict(flat)


class StrandedRanksError(RuntimeError):
    """The suite's own report that a load raised on this rank while others stayed inside it
    (waiting in a collective): its own type, so a known entry's exception model tells it
    apart from torch's exceptions (known/model.py ``Raises.alongside``)."""


def load_guarded(ctx, case: Case, live: Live, saved: Any, workdir: Path) -> tuple[Any, float]:
    """The guarded load call. Under a family without ``strand_guard``: ``guarded``. Else a
    rank whose call raised returns its error only once every rank has returned from the
    call (each drops a marker file in the work directory); if some have not within
    ``STRAND_WAIT_S`` (they wait in a collective the failed rank never joins:
    ``broadcast_from_rank0`` after rank 0 rejected the dict), it raises, so the pool reports
    the error and the stranded ranks instead of a silent hang."""
    if not rank_family(case).strand_guard:
        return guarded(load_call, ctx, case, live, saved, workdir)
    import torch.distributed as dist

    box = [uuid.uuid4().hex if ctx.rank == 0 else None]  # this call's marker names
    dist.broadcast_object_list(box, src=0, group=ctx.group)

    def marker(r: int) -> Path:
        return workdir / f".load_returned_{box[0]}_rank{r}"

    res, took = guarded(load_call, ctx, case, live, saved, workdir)
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


def save_side(ctx, case: Case, workdir: str, asks: SideAsks = ROUND_TRIP_ASKS) -> SaveRecord:
    """Train, save through the path, write it; record everything the properties need
    (``asks``: what the case's kind asks beyond that)."""
    workdir = Path(workdir)
    runs = []  # what trained: the model, or its compiled wrapper, which then saves too

    def train_fn(model, optim, sched) -> list[float]:
        run, losses = train_for_save(ctx, case, model, optim, sched)
        runs.append(run)
        return losses

    tr = trained(ctx, case, lambda: build(ctx, case, load_side=False), train_fn,
                 keeps=asks.keeps_training)
    run = runs[0] if runs else tr.model  # a kept training is never a compiled one (trained.py)
    record = save_trained(ctx, case, run, tr.model, tr.optim, tr.sched, tr.keys, tr.losses,
                          workdir, reused=tr.reused, kill=asks.kill)
    if asks.keeps_training:
        keep(tr)  # for the next path that trains alike (sut/trained.py)
    return record


def save_trained(ctx, case: Case, run, model, optim, sched, keys: list[str],
                 losses: list[float], workdir: Path, *, reused: bool = False,
                 flip: bool = True, kill=None) -> SaveRecord:
    """Save what has trained to ``case.steps`` through the path, write it under ``workdir``
    (rank 0: the full params and the LR scheduler's state beside it), and record it: the
    save side's second half, and a chain's next save (``Case.next_link``, on the load side
    that resumed). ``flip``: also the P9 save with the path's flags flipped. ``kill``: a crash
    case's ``crash_points.KillPlan``, armed around the write (this rank may not return)."""
    fam, path, rec = rank_family(case), steps(case), api_path(case.api)
    sched_at_save = scheduler_state(sched)  # before an async write's racing step moves it
    mesh, meta = mesh_of(model, fam.mesh_shape(ctx, case, False)), fam.meta(model)
    local = local_state(optim, keys)
    params = fam.full_params(model)
    saved, t_save = guarded(save_call, case, run, optim)
    timings = {"save": t_save}
    saved_devices = sorted(devices_of(saved))
    record = neutral(case, saved, optim, keys)
    flipped, flipped_devices = None, None
    flip_rec = path.FLIP if flip else None
    if flip_rec is not None:  # P9: the same save with the flags flipped
        other, _ = guarded(save_call, case, run, optim, **flip_rec.flags)
        flipped_devices = sorted(devices_of(other))
        flipped = neutral(case, other, optim, keys)
    saved_ids = None
    if ctx.rank == 0 and rec.rekeys and not is_error(record):
        saved_ids = local_to_cpu(guarded(to_param_ids, case, saved)[0])

    def race() -> None:  # the trainer's next step while an async write runs, timed ("race")
        t0 = time.perf_counter()
        train(ctx, case, run, optim, 1, start_step=case.steps,
              tensor_parallel=case.tensor_parallel_of(load_side=False))
        timings["race"] = time.perf_counter() - t0

    live = Live(model=run, optim=optim, sched=sched, step=case.steps,
                race=race if case.async_save else None)  # the records are copies
    if not is_error(saved):
        with armed(kill, ctx.rank):
            timings["write"] = write(ctx, case, live, saved, workdir)
    if ctx.rank == 0:
        atomic_save(params, workdir / MODEL_FILE)
        if sched is not None:
            atomic_save(sched.state_dict(), workdir / SCHED_FILE)
    return SaveRecord(rank=ctx.rank, keys=keys, meta=meta, local=local, losses=losses,
                      reused_training=reused, mesh_shape=mesh, timings=timings,
                      saved=record, saved_devices=saved_devices,
                      params=params if ctx.rank == 0 else None, saved_ids=saved_ids,
                      flip=flip_rec.name if flip_rec is not None else "", flipped=flipped,
                      flipped_devices=flipped_devices, device=str(ctx.device),
                      own_mixed_precision=fam.own_mixed_precision(model), sched=sched_at_save)


def reread(ctx, case: Case, saved: Any, optim, keys: list[str]) -> tuple[Any, Any]:
    """What the load side read back, for P5 and P8: (``LoadRecord.reread``,
    ``LoadRecord.reread_ids``). Rank 0 of a rekeying path: the PARAM_ID dict and its rekey
    back to names; rank 0 of a full path: the full dict; every rank of a per-rank path: its
    own file, in the save record's form."""
    rec = api_path(case.api)
    if ctx.rank == 0 and rec.rekeys:
        ids = local_to_cpu(saved)
        names, _ = guarded(to_param_names, case, saved)
        return local_to_cpu(names), ids
    if ctx.rank == 0 and rec.full:
        return (local_to_cpu(named_local(nested(case, saved, optim, keys), keys))
                if saved else {}), None
    if rec.writes == "per_rank" and saved is not None:
        return neutral(case, saved, optim, keys), None
    return None, None


def load_side(ctx, case: Case, workdir: str, asks: SideAsks = ROUND_TRIP_ASKS) -> LoadRecord:
    """Fresh model and optimizer at the load world size and plan; load, save again, resume
    (``asks``: what the case's kind asks beyond that: the load let raise, or no more than
    the load)."""
    workdir = Path(workdir)
    fam = rank_family(case)
    model, optim, sched, keys = build(ctx, case, load_side=True)
    run = compiled_for(case, model, load_side=True)
    fam.load_params(ctx, model, torch.load(workdir / MODEL_FILE, weights_only=True))
    head = dict(rank=ctx.rank, keys=keys, meta=fam.meta(model),
                mesh_shape=mesh_of(model, fam.mesh_shape(ctx, case, True)))
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    saved, note = read_saved(ctx, case, workdir, damage_raises=asks.load_raises)
    timings["read"] = time.perf_counter() - t0
    again, again_ids = reread(ctx, case, saved, optim, keys)
    head.update(timings=timings, weights_only_refused=note, reread=again, reread_ids=again_ids)
    live = Live(model=run, optim=optim, sched=sched)
    if asks.load_raises:  # P15: let it raise, so the pool shows every rank's outcome
        _, timings["load"] = timed(load_call, ctx, case, live, saved, workdir)
        return LoadRecord(**head, loaded=local_state(optim, keys))
    res, timings["load"] = load_guarded(ctx, case, live, saved, workdir)
    if is_error(res):
        return LoadRecord(**head, loaded=res)
    if case.scheduler_after_load:  # built now, on the loaded optimizer (Case)
        sched = build_scheduler(optim, case.model, case.scheduler)
    if sched is not None and not case.app_state:  # an app state restored it from DCP
        sched.load_state_dict(torch.load(workdir / SCHED_FILE, weights_only=True))
    loaded = local_state(optim, keys)
    head.update(sched_loaded=scheduler_state(sched),
                step_loaded=live.step if case.app_state else None)
    if asks.load_only:  # P12 reads the loaded state alone (run/golden_kind.py)
        return LoadRecord(**head, loaded=loaded)
    resaved, timings["resave"] = guarded(save_call, case, run, optim)
    resaved = neutral(case, resaved, optim, keys)
    losses = train(ctx, case, run, optim, case.resume_steps, start_step=case.steps,
                   sched=sched, tensor_parallel=case.tensor_parallel_of(load_side=True))
    final_local = local_state(optim, keys)
    params = fam.full_params(model)
    nxt = None
    if asks.save_next:  # a chain's next checkpoint, saved by what resumed (Case.links)
        nxt = save_trained(ctx, case.next_link(), run, model, optim, sched, keys, losses,
                           Path(asks.save_next), flip=False)
    return LoadRecord(**head, loaded=loaded, resaved=resaved, losses=losses,
                      final_local=final_local, sched_final=scheduler_state(sched),
                      final_params=params, next_save=nxt)
