"""A user's own FSDP2 training code, as a torchtitan-style trainer writes it: a model that
``fully_shard``s per block, AdamW with a warm-up/decay LR schedule, and a DCP app state
(model, optimizer, scheduler, step) saved with ``dcp.save`` and restored with ``dcp.load``.
``test_fsdp2_trainer.py`` puts it under the suite."""
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class TinyTransformerish(nn.Module):
    def __init__(self, dim: int = 8, depth: int = 2):
        super().__init__()
        self.inp = nn.Linear(5, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.out = nn.Linear(dim, 3)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


def batch(step: int, n: int) -> torch.Tensor:
    return torch.randn(n, 5, dtype=torch.float64)


def shard(model: TinyTransformerish, mesh) -> None:
    """The trainer's own sharding: each block, then the root."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def make_optimizer(named_params):
    return torch.optim.AdamW([p for _, p in named_params], lr=3e-3, weight_decay=0.1)


def make_scheduler(optimizer):
    """Linear warm-up for 2 steps, then 1/step decay (not chainable: it needs its state)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / 2 if s < 2 else 2.0 / (s + 1))


class AppState(Stateful):
    """What the trainer checkpoints: DCP calls ``state_dict`` on save and
    ``load_state_dict`` on load (the pattern of torch's DCP recipe)."""

    def __init__(self, state):
        self.state = state

    def state_dict(self):
        model_sd, optim_sd = get_state_dict(self.state.model, self.state.optimizer)
        return {"model": model_sd, "optim": optim_sd,
                "scheduler": self.state.scheduler.state_dict(), "step": self.state.step}

    def load_state_dict(self, sd):
        set_state_dict(self.state.model, self.state.optimizer,
                       model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        self.state.scheduler.load_state_dict(sd["scheduler"])
        self.state.step = sd["step"]


def save_checkpoint(state, directory: str) -> None:
    dcp.save({"app": AppState(state)}, checkpoint_id=directory)


def load_checkpoint(state, directory: str) -> None:
    dcp.load({"app": AppState(state)}, checkpoint_id=directory)
