"""A trained model and optimizer kept on each rank between round-trip cases that train
alike, so that a save path after the first saves the state the first one trained instead
of training it again (the run groups such cases on one lane: run/saves.py). Importing it
imports no torch (the controller reads ``training_key``).

Rules
- ``training_key(case)``: what the save side's build and training read: the path's family
  (``api_paths``: every path runs the one round trip, sut/roundtrip.py, which builds and
  trains by the family alone) and every case
  field except the path and the fields only the load side reads (``cases.LOAD_ONLY``).
  None (the case trains alone) outside the run's own paths and where the save side does
  more to the trained state than save it: an async save (the trainer's racing step trains
  on), an app state, a compiled side. Whether a kind of case shares trainings at all is
  its own to say (``run/kinds.py`` ``KindRecord.shares``; on the ranks, the round trip's
  ``SideAsks.keeps_training`` passed to ``trained``).
- A fresh training with a key is snapshotted right after it (the train callable includes
  the freeze at the save, which changes no value): CPU clones of the rank's local params,
  their ``requires_grad``, the optimizer's state and hyperparameters, the scheduler's
  state. One without a key is never kept, so it is not snapshotted.
- ``keep`` keeps the trained objects at the end of a save side none of whose calls raised
  (none marked a failure: ``harness.outcome``), and only if their live state still equals
  that snapshot bitwise: a save call that changed the state would otherwise leak into the
  next path's case. A rank keeps one entry.
- ``trained`` takes the entry out (nothing is kept while a save side runs) and reuses it
  only when every rank of the group has one with the case's key (one ``all_reduce``: the
  ranks agree, so none trains while another waits for it in a collective); else every rank
  builds and trains afresh.
- Same case, same seed -> same bits: training is deterministic (harness/seeding.py), so
  the reused state is the state the case's own training gives, and the snapshot check
  proves it is still that state.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from ..cases import LOAD_ONLY, PATHS, Case


def training_key(case: Case) -> tuple | None:
    """The case as its save side's build and training see it (module rules); None: it
    trains alone."""
    from ..api_paths import api_path

    if case.api not in PATHS or case.async_save or case.app_state or case.compiled:
        return None
    skip = {"api", *LOAD_ONLY}
    # the one round trip builds and trains by the family (sut/roundtrip.py build,
    # train_for_save): the family, not the path's own module, is what trains alike
    return (api_path(case.api).family,) + tuple(
        (f.name, getattr(case, f.name)) for f in dataclasses.fields(Case) if f.name not in skip)


@dataclass(frozen=True, kw_only=True)
class Trained:
    """A save side's model and optimizer after training."""

    model: Any
    """The wrapped model (FSDP1 or FSDP2)."""
    optim: Any
    """Its ``torch.optim.Optimizer``, trained."""
    sched: Any
    """Its LR scheduler, or None."""
    keys: list[str]
    """The optimizer's param keys (FQNs), as the build gave them."""
    losses: list[float]
    """The training's losses."""
    key: tuple | None
    """The case's ``training_key`` (None: never kept)."""
    snapshot: dict | None
    """The rank's state right after the training (``snapshot``); None without a key."""
    reused: bool = False
    """Taken from an earlier case's save side (kept), not trained for this case."""


_KEPT: list[tuple[tuple, Trained]] = []


def snapshot(model, optim, sched) -> dict:
    """CPU clones of the rank's local params and their ``requires_grad``, the optimizer's
    state and hyperparameters, and the scheduler's state."""
    from .fsdp2 import local_to_cpu as _local

    return {"params": [_local(p) for p in model.parameters()],
            "requires_grad": [p.requires_grad for p in model.parameters()],
            "state": [_local(optim.state.get(p, {})) for g in optim.param_groups
                      for p in g["params"]],
            "groups": [_local({k: v for k, v in g.items() if k != "params"})
                       for g in optim.param_groups],
            "sched": sched.state_dict() if sched is not None else None}


def _same(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape
                and bool(torch.equal(a.reshape(-1).contiguous().view(torch.uint8),
                                     b.reshape(-1).contiguous().view(torch.uint8))))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def _all_agree(ok: bool, group) -> bool:
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def trained(ctx, case: Case, build: Callable[[], tuple], train: Callable[..., list[float]],
            *, keeps: bool = True) -> Trained:
    """The case's trained model and optimizer: the kept one where the module rules allow,
    else ``build()`` -> (model, optim, sched, keys), then ``train(model, optim, sched)`` ->
    losses, then the snapshot (``keeps`` False: the case's kind shares no training)."""
    key = training_key(case) if keeps else None
    kept = _KEPT.pop() if _KEPT else None
    if key is not None and _all_agree(kept is not None and kept[0] == key, ctx.group):
        return dataclasses.replace(kept[1], reused=True)
    del kept
    model, optim, sched, keys = build()
    losses = train(model, optim, sched)
    return Trained(model=model, optim=optim, sched=sched, keys=keys, losses=losses, key=key,
                   snapshot=snapshot(model, optim, sched) if key is not None else None)


def keep(tr: Trained) -> bool:
    """Keep ``tr`` for the next case with the same training key if no call of this save side
    raised and its live state still equals its snapshot (module rules). Returns whether it
    was kept."""
    from ..harness import outcome

    _KEPT.clear()
    if (tr.key is None or outcome.failed()
            or not _same(snapshot(tr.model, tr.optim, tr.sched), tr.snapshot)):
        return False
    _KEPT.append((tr.key, tr))
    return True


def drop(ctx=None) -> None:
    """Keep nothing (also a rank function: ``pool.run(drop)``)."""
    _KEPT.clear()
