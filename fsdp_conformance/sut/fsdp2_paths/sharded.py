"""fsdp2.sharded: ``get_optimizer_state_dict()`` (DTensor values) -> ``dcp.save({"model",
"optim"})`` at N -> at M, the documented resume recipe: the template is
``get_optimizer_state_dict()`` of the fresh model and optimizer, filled in place by
``dcp.load({"optim": template})``, then ``set_optimizer_state_dict``.

``Case.async_save``: the write is ``dcp.async_save`` on a checkpoint group of its own, the
trainer's next step (``Live.race``) runs while it may still write, then the wait on its
Future (``WRITE_TIMEOUT_S``). ``Case.app_state``: DCP saves and loads an ``AppState``
(model, optimizer, LR scheduler, step) under one key, as trainers do; its load restores the
scheduler and the step (``Live.step``)."""
from __future__ import annotations

import concurrent.futures
from typing import Any

from ..app_state import AppState
from ..fsdp2 import load_options, state_dict_options
from ...api_paths import APP_KEY, DCP_DIR
from ..roundtrip import Flip

# saved without offloading (the default options); the flip saves with cpu_offload=True,
# which must change nothing but the devices
FLIP = Flip(name="offloaded", flags={"cpu_offload": True})

WRITE_TIMEOUT_S = 60.0
"""How long the save side waits on ``dcp.async_save``'s Future (a write that never finishes
is an error naming it, not a hang until the pool's timeout)."""

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


def save(case, model, optim, *, cpu_offload: bool = False):
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, get_state_dict

    if case.app_state:  # what the app state's state_dict() holds (sut/app_state.py)
        return get_state_dict(model, optim,
                              options=state_dict_options(case, cpu_offload=cpu_offload))[1]
    return get_optimizer_state_dict(model, optim,
                                    options=state_dict_options(case, cpu_offload=cpu_offload))


def write(ctx, case, live, saved, out) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    if case.app_state:
        state = {APP_KEY: AppState(live.model, live.optim, live.sched, step=live.step,
                                   options=state_dict_options(case))}
    else:
        state = {"model": get_model_state_dict(live.model, options=state_dict_options(case)),
                 "optim": saved}
    if not case.async_save:
        dcp.save(state, checkpoint_id=str(out / DCP_DIR), process_group=ctx.group)
        return
    future = dcp.async_save(state, checkpoint_id=str(out / DCP_DIR),
                            process_group=checkpoint_group(ctx))
    if live.race is not None:
        live.race()
    try:
        future.result(timeout=WRITE_TIMEOUT_S)
    except concurrent.futures.TimeoutError:
        # its writer thread may still hold the checkpoint group: never reuse it
        group = _CHECKPOINT_GROUPS.pop(id(ctx.group), None)
        if group is not None:
            dist.destroy_process_group(group)
        raise RuntimeError(f"dcp.async_save did not finish within {WRITE_TIMEOUT_S:.0f} "
                           f"s on rank {ctx.rank} ({out / DCP_DIR})") from None


def load(ctx, case, live, saved, workdir):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_optimizer_state_dict,
                                                         set_optimizer_state_dict)

    if case.app_state:
        app = AppState(live.model, live.optim, live.sched, step=-1, options=load_options(case))
        dcp.load({APP_KEY: app}, checkpoint_id=str(workdir / DCP_DIR), process_group=ctx.group)
        live.step = app.step  # P11 compares it with the save's
        return None
    template = get_optimizer_state_dict(live.model, live.optim,
                                        options=state_dict_options(case))
    dcp.load({"optim": template}, checkpoint_id=str(workdir / DCP_DIR),
             process_group=ctx.group)
    set_optimizer_state_dict(live.model, live.optim, template, options=load_options(case))
    return None
