"""Built-in models with the shapes users train, built on the meta device (no memory): a
Llama-3-8B-like and a 70B-like decoder and an MoE layer, for ``fsdp-conformance scale``.

Rules
- Shapes follow the published configurations (hidden size, FFN size, layers, heads, key/value
  heads, vocabulary); the modules are plain ``nn.Linear`` / ``nn.Embedding`` / a norm weight,
  so the parameter shapes, not the arithmetic, are what matters.
- Each model lists the submodules a trainer ``fully_shard``s one by one (``UNITS``: every
  decoder layer, as torchtitan does), then the root.
- Their tensor-parallel plan (``tp_plan``) is torchtitan's for a Llama decoder's linear
  layers: the attention's q, k, v projections and the FFN's w1 and w3 column-wise, the
  attention output and the FFN's w2 row-wise, the output head column-wise. The embedding and
  the norms stay replicated over ``tp`` (torchtitan shards the embedding row-wise and runs
  the norms sequence-parallel: the same params, placed otherwise); an MoE layer's experts
  (raw 3-D params, expert-parallel in torchtitan) stay replicated over ``tp`` too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn


@dataclass(frozen=True, kw_only=True)
class DecoderShape:
    """A decoder's configuration."""

    dim: int
    """Hidden size."""
    ffn: int
    """Feed-forward (SwiGLU) hidden size."""
    layers: int
    """Decoder layers."""
    heads: int
    """Attention heads."""
    kv_heads: int
    """Key/value heads (grouped-query attention)."""
    vocab: int
    """Vocabulary size."""
    experts: int = 0
    """Experts per layer (0: a dense FFN)."""


class Norm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


class Layer(nn.Module):
    def __init__(self, s: DecoderShape):
        super().__init__()
        hd = s.dim // s.heads
        self.attention_norm = Norm(s.dim)
        self.wq = nn.Linear(s.dim, s.heads * hd, bias=False)
        self.wk = nn.Linear(s.dim, s.kv_heads * hd, bias=False)
        self.wv = nn.Linear(s.dim, s.kv_heads * hd, bias=False)
        self.wo = nn.Linear(s.heads * hd, s.dim, bias=False)
        self.ffn_norm = Norm(s.dim)
        if s.experts:
            self.router = nn.Linear(s.dim, s.experts, bias=False)
            self.w1 = nn.Parameter(torch.empty(s.experts, s.ffn, s.dim))
            self.w2 = nn.Parameter(torch.empty(s.experts, s.dim, s.ffn))
            self.w3 = nn.Parameter(torch.empty(s.experts, s.ffn, s.dim))
        else:
            self.w1 = nn.Linear(s.dim, s.ffn, bias=False)
            self.w2 = nn.Linear(s.ffn, s.dim, bias=False)
            self.w3 = nn.Linear(s.dim, s.ffn, bias=False)


class Decoder(nn.Module):
    def __init__(self, s: DecoderShape):
        super().__init__()
        self.tok_embeddings = nn.Embedding(s.vocab, s.dim)
        self.layers = nn.ModuleList(Layer(s) for _ in range(s.layers))
        self.norm = Norm(s.dim)
        self.output = nn.Linear(s.dim, s.vocab, bias=False)


SHAPES: dict[str, DecoderShape] = {
    "llama3-8b": DecoderShape(dim=4096, ffn=14336, layers=32, heads=32, kv_heads=8,
                              vocab=128256),
    "llama3-70b": DecoderShape(dim=8192, ffn=28672, layers=80, heads=64, kv_heads=8,
                               vocab=128256),
    "moe": DecoderShape(dim=4096, ffn=14336, layers=1, heads=32, kv_heads=8, vocab=32000,
                        experts=8),
}
"""The built-in models by name."""


def build(name: str) -> nn.Module:
    """The model ``name`` on the meta device."""
    if name not in SHAPES:
        raise ValueError(f"no built-in model {name!r}; the built-in ones: {sorted(SHAPES)}")
    with torch.device("meta"):
        return Decoder(SHAPES[name])


def units(model: nn.Module) -> list[str]:
    """The submodules ``fully_shard`` wraps one by one before the root: every decoder layer
    of a built-in model; none for another model."""
    layers = getattr(model, "layers", None)
    return [f"layers.{i}" for i in range(len(layers))] if isinstance(layers, nn.ModuleList) \
        else []


ModelFn = Callable[[], nn.Module]


def tp_plan(model: nn.Module) -> dict[str, str]:
    """``{nn.Linear FQN: "colwise" | "rowwise"}`` of a built-in model (module rules); empty
    for any other model (a user's factory gives its own)."""
    if not isinstance(model, Decoder):
        return {}
    plan = {"output": "colwise"}
    for i, layer in enumerate(model.layers):
        for name, style in (("wq", "colwise"), ("wk", "colwise"), ("wv", "colwise"),
                            ("wo", "rowwise"), ("w1", "colwise"), ("w3", "colwise"),
                            ("w2", "rowwise")):
            if isinstance(getattr(layer, name), nn.Linear):
                plan[f"layers.{i}.{name}"] = style
    return plan
