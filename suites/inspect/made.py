"""Checkpoints the inspect tests make themselves: a real ``torch.optim`` optimizer over a
small ``nn.Module``, stepped on a fixed batch, then ``torch.save``d (optionally altered to
plant one problem)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

MODEL_FQNS = ("0.weight", "0.bias", "2.weight", "2.bias")
MODEL_SHAPES = {"0.weight": (3, 4), "0.bias": (3,), "2.weight": (2, 3), "2.bias": (2,)}


def trained(optimizer: str = "adam", steps: int = 2, *, freeze: str | None = None,
            n_layers: int = 1) -> tuple[nn.Module, torch.optim.Optimizer]:
    """``Linear(4,3) ReLU Linear(3,2)`` (``n_layers`` > 1: that many ``Linear(4,4)`` first),
    float64, seed 0, ``steps`` steps of ``optimizer`` ("adam", "sgd" = momentum 0,
    "sgd_momentum", "adamw"); ``freeze``: an FQN whose param gets no gradient."""
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(4, 4) for _ in range(n_layers - 1)]
    model = nn.Sequential(*layers, nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).double()
    if freeze is not None:
        model.get_parameter(freeze).requires_grad_(False)
    make = {"adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
            "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01),
            "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
            "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)}[optimizer]
    optim = make(model.parameters())
    x = torch.linspace(-1, 1, 24, dtype=torch.float64).reshape(6, 4)
    for _ in range(steps):
        optim.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        optim.step()
    return model, optim


def named(model: nn.Module, osd: dict) -> dict:
    """``optim.state_dict()`` keyed by FQN instead of int id (single group over
    ``model.parameters()``: id i is the i-th named parameter)."""
    names = [n for n, _ in model.named_parameters()]
    return {"state": {names[k]: v for k, v in osd["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]}
                             for g in osd["param_groups"]]}


def fqn_osd(optimizer: str = "adam", **kw: Any) -> dict:
    """A trained optimizer's state dict keyed by FQN."""
    model, optim = trained(optimizer, **kw)
    return named(model, optim.state_dict())


def save(obj: Any, path: Path) -> Path:
    torch.save(obj, path)
    return path


def flip_tensor_byte(path: Path, member_suffix: str = "/data/0") -> None:
    """Invert the first data byte of the zip member ending in ``member_suffix`` (a tensor's
    storage), in place: the archive stays readable, the member's CRC-32 no longer matches."""
    import struct
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(member_suffix))
    data = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    data[info.header_offset + 30 + name_len + extra_len] ^= 0xFF
    path.write_bytes(bytes(data))
