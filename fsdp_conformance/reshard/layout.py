"""The layouts a conversion reads and writes (``LayoutSpec``): a model, its FSDP wrapping
plan, world size and flags, built into the reference's ``ModelLayout``.

Rules
-----
The model is a zoo name or ``"module:callable"`` (a factory called with no arguments, built
on the meta device when it allows it, so no parameter memory is used); the plan is a zoo
plan name or a comma-separated list of submodule FQNs that are their own FSDP unit (the
root always is). ``dtype`` is the dtype that sets FSDP's alignment with
``use_orig_params=True`` (the param dtype, or ``MixedPrecision.param_dtype``); ``None``
takes the dtype of the checkpoint's first per-element state tensor. A model or plan that
cannot be built is a :class:`~.errors.UsageError`.
"""
from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch
from torch import nn

from .. import reference as ref
from .errors import UsageError
from ..zoo import MODELS

DTYPES = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16,
          "fp16": torch.float16}
"""``--dtype`` names -> torch dtypes."""


@dataclass(frozen=True)
class LayoutSpec:
    """Where a checkpoint lives: model, wrapping plan, world size, FSDP flags. Positional
    fields (not keyword-only): ``cli.py``'s ``reshard`` builds it positionally."""

    model: str
    """A zoo model name or ``"module:callable"``."""
    plan: str | Sequence[str] = "root"
    """A zoo plan name, comma-separated FQNs of units, or a sequence of FQNs."""
    world_size: int = 1
    """Ranks the checkpoint is sharded over (per-rank input: 0 counts the files)."""
    use_orig_params: bool = False
    """FSDP1 ``use_orig_params``."""
    strategy: str = "FULL_SHARD"
    """The ``ShardingStrategy`` name."""
    shard_world_size: int | None = None
    """HYBRID_SHARD's shard group size (None: not hybrid)."""
    ignored: Sequence[str] | None = None
    """FQNs of ignored modules; None: the zoo model's ignored modules, else ()."""
    dtype: torch.dtype | None = None
    """The dtype that sets the alignment with ``use_orig_params`` (None: from the checkpoint)."""

    def describe(self) -> str:
        plan = self.plan if isinstance(self.plan, str) else ",".join(self.plan) or "root"
        s = (f"{self.model}:{plan}, {self.world_size} rank{'s' if self.world_size != 1 else ''}, "
             f"{'orig params' if self.use_orig_params else 'flat'}, {self.strategy}")
        if self.shard_world_size:
            s += f" (shard groups of {self.shard_world_size})"
        return s


def build_module(model: str, dtype: torch.dtype | None = None) -> tuple[nn.Module, dict, tuple]:
    """``(module, plans, ignored)`` for a zoo name or a ``"module:callable"`` factory.

    The module is built on the meta device when the factory allows it (shapes only). A zoo
    model without ``dtype`` gets the zoo's default dtype (float64); a factory keeps its own.
    """
    if ":" not in model:
        if model not in MODELS:
            raise UsageError(f"unknown model {model!r}: not a zoo model ({', '.join(sorted(MODELS))}) "
                             "and not 'module:callable'")
        spec = MODELS[model]
        factory, plans, ignored = spec.factory, dict(spec.plans), tuple(spec.ignored)
        dtype = dtype or torch.float64
    else:
        mod_name, _, attr = model.partition(":")
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            mod = importlib.import_module(mod_name)
        except Exception as e:  # noqa: BLE001  (any import failure is a usage error)
            raise UsageError(f"--model {model!r}: cannot import {mod_name!r}: {e}") from e
        factory = mod
        for part in attr.split("."):
            factory = getattr(factory, part, None)
        if not callable(factory):
            raise UsageError(f"--model {model!r}: {attr!r} is not a callable in {mod_name!r}")
        plans, ignored = {}, ()
    try:
        with torch.device("meta"):
            module = factory()
    except Exception:  # noqa: BLE001  (factories that cannot build on meta build for real)
        module = factory()
    if not isinstance(module, nn.Module):
        raise UsageError(f"--model {model!r} returned {type(module).__name__}, not an nn.Module")
    if dtype is not None:
        module = module.to(dtype)
    return module, plans, ignored


def parse_plan(plan: str | Sequence[str], plans: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """A zoo plan name -> its FQNs; otherwise a comma-separated FQN list ("" or "root": none)."""
    if isinstance(plan, str):
        if plan in plans:
            return tuple(plans[plan])
        if plan in ("", "root"):
            return ()
        return tuple(p.strip() for p in plan.split(",") if p.strip())
    return tuple(plan)


def build_layout_for(spec: LayoutSpec, dtype: torch.dtype | None = None) -> ref.ModelLayout:
    """The reference layout of ``spec`` (``dtype`` fills in ``spec.dtype`` when that is None)."""
    module, plans, zoo_ignored = build_module(spec.model, spec.dtype or dtype)
    wrap = parse_plan(spec.plan, plans)
    ignored = tuple(spec.ignored) if spec.ignored is not None else zoo_ignored
    try:
        return ref.build_layout(module, wrap, spec.world_size, use_orig_params=spec.use_orig_params,
                                strategy=spec.strategy, shard_world_size=spec.shard_world_size,
                                ignored=ignored)
    except ref.LayoutError as e:
        raise UsageError(f"layout {spec.describe()}: {e}") from e


__all__ = ["DTYPES", "LayoutSpec", "build_layout_for", "build_module", "parse_plan"]
