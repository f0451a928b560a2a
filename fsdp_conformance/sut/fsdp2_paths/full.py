"""fsdp2.full: ``get_optimizer_state_dict(full_state_dict=True, cpu_offload=True)`` (rank 0
gets the full dict, the others ``{}``) -> torch.save on rank 0 -> every rank
torch.load(weights_only=True) -> ``set_optimizer_state_dict(full_state_dict=True,
broadcast_from_rank0=True)``: rank 0 passes the dict, the others ``{}``
(``Case.no_broadcast``: every rank loads the full dict it read itself)."""
from __future__ import annotations

from ..files import write_full
from ..fsdp2 import load_options, state_dict_options
from ..roundtrip import Flip

# saved with cpu_offload=True (the rank-0-only form); the flip saves with cpu_offload=False,
# every rank getting the full dict on its device
FLIP = Flip(name="all_ranks", flags={"cpu_offload": False})


def save(case, model, optim, *, cpu_offload: bool = True):
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optim, options=state_dict_options(
        case, full_state_dict=True, cpu_offload=cpu_offload))


def write(ctx, case, live, saved, out) -> None:
    write_full(ctx, saved, out)


def load(ctx, case, live, saved, workdir):
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    if case.no_broadcast:  # every rank its own full dict
        set_optimizer_state_dict(live.model, live.optim, saved,
                                 options=load_options(case, full_state_dict=True))
        return None
    set_optimizer_state_dict(
        live.model, live.optim, saved if ctx.rank == 0 else {},
        options=load_options(case, full_state_dict=True, broadcast_from_rank0=True))
    return None
