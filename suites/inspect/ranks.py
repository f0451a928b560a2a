"""Rank functions (run on a RankPool) that write real FSDP checkpoints for the inspect tests."""
from __future__ import annotations

from pathlib import Path


def fsdp2_sharded_rank_files(ctx, out_dir: str, steps: int = 2) -> list[str]:
    """Every rank ``torch.save``s its FSDP2 sharded optimizer state dict (DTensors, keyed by
    FQN: ``get_optimizer_state_dict`` with the default options) as ``optim_rank{rank}.pt``
    after ``steps`` Adam steps of the zoo ``mlp`` under ``fully_shard`` (plan ``nested``).
    Returns the FQNs of the saved state."""
    import warnings

    import torch
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from fsdp_conformance.cases import Case
    from fsdp_conformance.sut.fsdp2 import wrap_fsdp2
    from fsdp_conformance.zoo import loss_of, make_batch

    warnings.filterwarnings("ignore")
    model = wrap_fsdp2(ctx, Case(model="mlp", plan="nested", world_size=ctx.world_size,
                                 api="fsdp2.sharded"))
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(steps):
        x = make_batch("mlp", 0, step, 12)[ctx.rank::ctx.world_size]
        optim.zero_grad(set_to_none=True)
        loss_of(model, x).backward()
        optim.step()
    osd = get_optimizer_state_dict(model, optim)
    torch.save(osd, Path(out_dir) / f"optim_rank{ctx.rank}.pt")
    return sorted(osd["state"])


def fsdp2_app_state_dcp(ctx, out_dir: str, steps: int = 3) -> None:
    """A trainer's DCP app state on every rank: ``{"app": {model, optim, scheduler, step}}``
    (DSD's ``get_state_dict`` of the zoo ``mlp`` under ``fully_shard``, an ExponentialLR(0.9)
    and the step) after ``steps`` Adam steps, saved with ``dcp.save`` into ``out_dir``."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from fsdp_conformance.cases import Case
    from fsdp_conformance.sut.fsdp2 import wrap_fsdp2
    from fsdp_conformance.zoo import loss_of, make_batch

    warnings.filterwarnings("ignore")
    model = wrap_fsdp2(ctx, Case(model="mlp", plan="nested", world_size=ctx.world_size,
                                 api="fsdp2.sharded"))
    optim = torch.optim.Adam(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.ExponentialLR(optim, 0.9)
    for step in range(steps):
        x = make_batch("mlp", 0, step, 12)[ctx.rank::ctx.world_size]
        optim.zero_grad(set_to_none=True)
        loss_of(model, x).backward()
        optim.step()
        sched.step()
    msd, osd = get_state_dict(model, optim)
    dcp.save({"app": {"model": msd, "optim": osd, "scheduler": sched.state_dict(),
                      "step": steps}}, checkpoint_id=out_dir)
