"""fsdp1.dsd_full_broadcast: DSD's full save on an FSDP1 model, loaded the way a trainer
that hands the dict to rank 0 alone does: ``get_optimizer_state_dict(full_state_dict=True,
cpu_offload=True)`` (rank 0 gets the full dict) -> torch.save on rank 0 -> every rank loads
the file, rank 0 passes the dict and the others ``{}`` ->
``set_optimizer_state_dict(full_state_dict=True, broadcast_from_rank0=True)``. On an FSDP1
model DSD turns ``broadcast_from_rank0`` into FSDP1's own ``rank0_only`` load
(``FullOptimStateDictConfig(rank0_only=True)``, state_dict.py:350): rank 0 sends the others
their state with ``_optim_utils._broadcast_processed_state``, not DSD's
``_broadcast_state_dict``, which fsdp2.full goes through."""
from __future__ import annotations

from .dsd_full import FLIP, save, write  # noqa: F401  (dsd_full's save and file)


def load(ctx, case, live, saved, workdir):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(live.model, live.optim, saved if ctx.rank == 0 else {},
                             options=StateDictOptions(full_state_dict=True,
                                                      broadcast_from_rank0=True))
    return None
