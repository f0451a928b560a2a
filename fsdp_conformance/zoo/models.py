"""Small, CPU-fast models, built by name so the controller and every rank build the same
module from the same seed. Sizes are chosen to make FSDP's corner cases happen: primes,
a layer smaller than the world size, tied weights, frozen params, a param that never gets
a gradient, buffers, an ignored module.

Rule: ``build_model(name, seed, dtype)`` seeds torch with ``seed`` and returns the module;
``make_batch(name, seed, step, batch)`` returns the *global* batch of a step (every rank
and the single-process reference see the same data; ranks take their slice)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn


class NestedMLP(nn.Module):
    """Uneven sizes (primes), a 2-element layer (smaller than world sizes 3 and 4)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(7, 13)
        self.block = nn.Sequential(nn.Linear(13, 11), nn.Tanh(), nn.Linear(11, 5))
        self.head = nn.Linear(5, 2)

    def forward(self, x):
        return self.head(self.block(torch.tanh(self.inp(x))))


class TiedLM(nn.Module):
    """A tiny transformer-ish LM whose output projection is tied to the embedding."""

    def __init__(self, vocab: int = 11, dim: int = 6):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layer = nn.Sequential(nn.Linear(dim, dim), nn.LayerNorm(dim))
        self.out = nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, x):
        return self.out(self.layer(self.embed(x)))


class FrozenMLP(NestedMLP):
    """NestedMLP with the input layer frozen (requires_grad=False)."""

    def __init__(self):
        super().__init__()
        for p in self.inp.parameters():
            p.requires_grad_(False)


class UnusedParamMLP(NestedMLP):
    """NestedMLP with a layer that is never used in forward: its params never get a grad."""

    def __init__(self):
        super().__init__()
        self.unused = nn.Linear(3, 3)


class BufferedNet(nn.Module):
    """Buffers (BatchNorm running stats) and a side module meant to be ignored by FSDP."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(5, 8)
        self.norm = nn.BatchNorm1d(8)
        self.side = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.norm(self.inp(x))
        return self.head(h + self.side(h))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(2, 3, 3)
        self.conv2 = nn.Conv2d(3, 5, 2)
        self.head = nn.Linear(5 * 3 * 3, 3)

    def forward(self, x):
        h = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.head(h.flatten(1))


@dataclass(frozen=True)
class ModelSpec:
    name: str
    factory: Callable[[], nn.Module]
    input_fn: Callable[[torch.Generator, int, torch.dtype], torch.Tensor]
    plans: dict  # plan name -> tuple of submodule FQNs that are their own units
    ignored: tuple = ()


def _floats(shape):
    return lambda g, b, dt: torch.randn((b, *shape), generator=g, dtype=torch.float64).to(dt)


def _tokens(vocab):
    return lambda g, b, dt: torch.randint(0, vocab, (b, 4), generator=g)


MODELS: dict[str, ModelSpec] = {
    "mlp": ModelSpec("mlp", NestedMLP, _floats((7,)),
                     {"root": (), "nested": ("inp", "block", "block.2"), "block": ("block",)}),
    "tied": ModelSpec("tied", TiedLM, _tokens(11),
                      {"root": (), "nested": ("layer",), "split": ("embed", "layer")}),
    "frozen": ModelSpec("frozen", FrozenMLP, _floats((7,)),
                        {"root": (), "nested": ("block", "head")}),
    "unused": ModelSpec("unused", UnusedParamMLP, _floats((7,)),
                        {"root": (), "nested": ("block", "unused")}),
    "buffers": ModelSpec("buffers", BufferedNet, _floats((5,)),
                         {"root": (), "nested": ("inp", "head")}, ignored=("side",)),
    "conv": ModelSpec("conv", ConvNet, _floats((2, 6, 6)),
                      {"root": (), "nested": ("conv1", "conv2")}),
}


def model_spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown zoo model {name!r}; known: {sorted(MODELS)}") from None


def build_model(name: str, seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Module:
    """The model ``name`` with parameters drawn from ``seed``, in ``dtype``."""
    spec = model_spec(name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = spec.factory()
    return model.to(dtype)


def make_batch(name: str, seed: int, step: int, batch: int,
               dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The global input batch of ``step`` (same on every rank and in the local reference)."""
    g = torch.Generator().manual_seed(seed * 1009 + step)
    return model_spec(name).input_fn(g, batch, dtype)


def loss_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A deterministic scalar loss (sum of squares of the output, mean over the batch)."""
    out = model(x)
    return (out.float() if out.dtype == torch.bfloat16 else out).pow(2).mean()
