"""A user's model with a tied weight (its own names, not the zoo's), for the plugin's tests
of known limitations matched by what a model has. Module level: the ranks import it."""
from __future__ import annotations

import torch
from torch import nn


class TinyLM(nn.Module):
    """Token embedding ``tok`` tied to the output projection ``proj``, a mixing layer
    between them."""

    def __init__(self, vocab: int = 9, dim: int = 5):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, vocab, bias=False)
        self.proj.weight = self.tok.weight

    def forward(self, x):
        return self.proj(torch.tanh(self.mix(self.tok(x))))


def tokens(step: int, batch: int) -> torch.Tensor:
    """The global batch of a step: token ids (torch is seeded per step)."""
    return torch.randint(0, 9, (batch, 3))
