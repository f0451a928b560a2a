"""fsdp1.legacy_scatter: ``full_optim_state_dict(rank0_only)`` -> torch.save on rank 0 ->
rank 0 alone loads the file -> ``scatter_full_optim_state_dict`` sends every rank its
share."""
from __future__ import annotations

# its save and its file are legacy_full's (one function, one file format); only the load
# differs: rank 0 reads the file and scatters it
from .legacy_full import FLIP, save, write  # noqa: F401


def load(ctx, case, live, saved, workdir):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return FSDP.scatter_full_optim_state_dict(saved if ctx.rank == 0 else None, live.model)
