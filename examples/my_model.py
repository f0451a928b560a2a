"""A model that is not in the zoo: a custom module (a gated residual block with a parameter
of its own) and an optimizer with two param groups (the head: lower lr, no weight decay).
Everything the ranks rebuild is a module-level name, so it can be sent by reference."""
import torch
from torch import nn


class GatedBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.gate = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x):
        return x + torch.sigmoid(self.gate) * torch.tanh(self.proj(x))


class GatedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(5, 6)
        self.body = nn.Sequential(GatedBlock(6), GatedBlock(6))
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(self.body(torch.relu(self.embed(x))))


def make_optimizer(named_params):
    """Two groups. Under FSDP1 with flat params a name is a unit's FQNs joined by "|"."""
    head = [p for n, p in named_params if n.startswith("head")]
    rest = [p for n, p in named_params if not n.startswith("head")]
    return torch.optim.AdamW([{"params": rest},
                              {"params": head, "lr": 1e-3, "weight_decay": 0.0}],
                             lr=1e-2, weight_decay=0.05)


def batch(step: int, size: int) -> torch.Tensor:
    """The global batch of a step (torch is seeded per step by the harness)."""
    return torch.randn(size, 5)


def loss(model, x):
    """A mean over the batch's rows (FSDP averages gradients over ranks)."""
    return (model(x) - 1.0).pow(2).mean()
