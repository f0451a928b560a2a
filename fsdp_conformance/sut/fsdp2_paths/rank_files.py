"""fsdp2.rank_files: each rank checkpoints its own shard of the optimizer state with plain
``torch.save``, as trainers without DCP do: ``get_optimizer_state_dict()`` (FQN keys, DTensor
values: the rank's local shard with its placement) -> ``torch.save`` of that dict to the
rank's own file -> at the same world size and mesh, each rank ``torch.load``s its own file
(``weights_only=True``; where it refuses DTensor, without: P8 notes it) ->
``set_optimizer_state_dict``. Same world size and mesh only: a rank's file holds its own
shard and nothing says where the others' rows are."""
from __future__ import annotations

from ...api_paths import rank_file
from ..files import atomic_save
from ..fsdp2 import load_options
from .sharded import FLIP, save  # noqa: F401  (fsdp2.sharded's save and flip: DSD's sharded dict)


def write(ctx, case, live, saved, out) -> None:
    atomic_save(saved, out / rank_file(ctx.rank))


def load(ctx, case, live, saved, workdir):
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(live.model, live.optim, saved, options=load_options(case))
    return None
