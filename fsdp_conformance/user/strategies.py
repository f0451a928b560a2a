"""Hypothesis strategies that draw *valid* round-trip configurations, in the controller;
the drawn example (a ``Case``, plus a ``UserModel`` for generated module trees) is plain
picklable data that is shipped to the ranks. Failures shrink toward the smallest
configuration (world size 1, the first path, the plain plan, one group, two steps) and the
failure message prints the case id and a standalone reproducer.

    from hypothesis import given
    from fsdp_conformance import strategies as fst

    @given(fst.cases(world_sizes=(1, 2)))
    @fst.fsdp_settings()
    def test_conforms(fsdp_roundtrip, case):
        fsdp_roundtrip.check(case)

Rules
- ``cases``: zoo models, their plans (load plan too, where the path can change wrapping),
  zoo optimizers and param groups, implementations, world-size pairs, ``use_orig_params``,
  dtypes, steps. Combinations FSDP1 rejects by design are never drawn: flat units mixing
  param groups (``matrix.groups_fit_units``), flat units mixing frozen and trainable params, a
  fused implementation of an optimizer without one, HYBRID_SHARD off 2 or 4 ranks, and
  paths that cannot reshard (``api_paths.resizable``) get equal sizes and plans. The tied
  model's plans that split the tied pair over units are left out (a known FSDP1 limitation).
- ``module_trees`` / ``user_roundtrips``: generated models (``GeneratedNet``): a stack of
  blocks with awkward widths (1, 2, 3, 5, 7, 13: primes, widths below the world size),
  nested blocks, bias on/off, frozen blocks, and a wrapping plan over them.
- Profiles: ``fsdp-ci`` (5 examples, derandomized: the same examples every run),
  ``fsdp-nightly`` (60 examples, random); both without a per-example deadline (a multi-rank
  example takes a second or more) and without the function-scoped-fixture health check (the
  fixtures are stateless across examples). ``fsdp_settings()`` picks the profile from
  ``FSDPC_HYPOTHESIS_PROFILE``, else the plugin's ``--fsdp-tier`` (quick -> ci, full ->
  nightly).
"""
from __future__ import annotations

import dataclasses
import functools
import os

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from torch import nn

from ..cases import Case
from ..run.matrix import groups_fit_units
from ..properties.layouts import reference_layout
from ..reference import LayoutError
from ..api_paths import family_of, paths_of, resizable
from ..zoo import FUSED, MODELS, OPTIMIZERS, model_spec, runs_on
from .model import UserModel
from .refs import Ref
from .spec import ACTIVE

FSDP1_PATHS = paths_of("fsdp1")

CI, NIGHTLY = "fsdp-ci", "fsdp-nightly"
_SUPPRESS = [getattr(HealthCheck, n) for n in ("too_slow", "function_scoped_fixture",
                                               "differing_executors") if hasattr(HealthCheck, n)]
_COMMON = dict(deadline=None, print_blob=True, suppress_health_check=_SUPPRESS)
settings.register_profile(CI, max_examples=5, derandomize=True, database=None, **_COMMON)
settings.register_profile(NIGHTLY, max_examples=60, **_COMMON)


def profile_name() -> str:
    """``FSDPC_HYPOTHESIS_PROFILE``, else the running pytest session's tier."""
    env = os.environ.get("FSDPC_HYPOTHESIS_PROFILE")
    if env:
        return env
    return NIGHTLY if ACTIVE.get("tier") == "full" else CI


def fsdp_settings(**overrides) -> settings:
    """Settings for multi-rank examples (see the module docstring); use as a decorator."""
    return settings(settings.get_profile(profile_name()), **overrides)


# --------------------------------------------------------------------------- zoo cases
_SPLIT_TIED = ("split", "split_out")  # tied pair in two units: known FSDP1 limitation


def _plans(model: str) -> list[str]:
    plans = list(model_spec(model).plans)
    if model == "tied":
        plans = [p for p in plans if p not in _SPLIT_TIED]
    return sorted(plans, key=lambda p: (p != "root", p))


@functools.lru_cache(maxsize=None)
def _frozen_ok(model: str, plan: str, use_orig_params: bool) -> bool:
    """With flat params every unit must be all frozen or all trainable (the reference's
    layout refuses the plan otherwise, as FSDP1 does)."""
    if use_orig_params:
        return True
    try:
        reference_layout(Case(model=model, plan=plan, world_size=1))
    except LayoutError:
        return False
    return True


def world_size_pairs(sizes=(1, 2, 3, 4), *, resize: bool = True):
    """(save, load) world sizes from ``sizes``; equal ones if not ``resize``."""
    sizes = sorted(sizes)
    if not resize:
        return st.sampled_from(sizes).map(lambda n: (n, n))
    return st.tuples(st.sampled_from(sizes), st.sampled_from(sizes))


@st.composite
def cases(draw, *, paths=None, models=None, optimizers=None, world_sizes=(1, 2, 3, 4),
          use_orig_params=(False, True), dtypes=("fp64", "fp32"), groups=(1, 2),
          impls=("default",), strategies=("FULL_SHARD",), steps=(2, 1, 0), seed: int = 0):
    """A valid zoo ``Case`` (module docstring). Every argument narrows what is drawn."""
    api = draw(st.sampled_from(list(paths or FSDP1_PATHS)))
    usable = [m for m in (models or MODELS) if runs_on(m, family_of(api))]
    if not usable:
        raise ValueError(f"none of the models {list(models)} runs on {api} (a model frozen at "
                         f"the save needs an FSDP2 path)")
    model = draw(st.sampled_from(usable))
    orig = draw(st.sampled_from(list(use_orig_params)))
    plans = [p for p in _plans(model) if _frozen_ok(model, p, orig)]
    plan = draw(st.sampled_from(plans))
    load_plan = draw(st.sampled_from(plans)) if resizable(api) else plan
    opt = draw(st.sampled_from(list(optimizers or OPTIMIZERS)))
    impl = draw(st.sampled_from([i for i in impls if i != "fused" or opt in FUSED] or
                                ["default"]))
    n, m = draw(world_size_pairs(world_sizes, resize=resizable(api)))
    strategy = draw(st.sampled_from(list(strategies)))
    if strategy == "HYBRID_SHARD" and not (n == m and n in (2, 4)):
        strategy = "FULL_SHARD"
    case = Case(api=api, model=model, plan=plan, load_plan=None if load_plan == plan else load_plan,
                optimizer=opt, groups=draw(st.sampled_from(list(groups))),
                use_orig_params=orig, strategy=strategy, world_size=n,
                load_world_size=None if m == n else m, dtype=draw(st.sampled_from(list(dtypes))),
                steps=draw(st.sampled_from(list(steps))), impl=impl, seed=seed)
    if not groups_fit_units(case):
        case = dataclasses.replace(case, groups=1)
    return case


# --------------------------------------------------------------------------- module trees
WIDTHS = (1, 2, 3, 5, 7, 13)


class GeneratedNet(nn.Module):
    """A stack of blocks built from plain data: ``blocks`` is a tuple of
    ``(kind, width, frozen)`` with kind "linear", "nobias" (Linear without bias) or
    "nested" (Sequential(Linear, Tanh, Linear)); tanh between blocks."""

    def __init__(self, in_dim: int, blocks: tuple):
        super().__init__()
        layers, prev = [], in_dim
        for kind, width, frozen in blocks:
            if kind == "nested":
                layer = nn.Sequential(nn.Linear(prev, width), nn.Tanh(), nn.Linear(width, width))
            else:
                layer = nn.Linear(prev, width, bias=kind != "nobias")
            if frozen:
                layer.requires_grad_(False)
            layers.append(layer)
            prev = width
        self.blocks = nn.ModuleList(layers)

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            x = block(x) if i == 0 else block(torch.tanh(x))
        return x


def generated_batch(in_dim: int, step: int, batch: int) -> torch.Tensor:
    """The global batch of a generated model (torch is seeded per step by the harness)."""
    return torch.randn(batch, in_dim)


def _arch_name(in_dim: int, blocks: tuple) -> str:
    code = {"linear": "l", "nobias": "b", "nested": "n"}
    return f"gen{in_dim}-" + "-".join(f"{code[k]}{w}{'f' if f else ''}" for k, w, f in blocks)


@st.composite
def module_trees(draw, *, max_blocks: int = 4, frozen: bool = True):
    """``(in_dim, blocks)`` of a ``GeneratedNet``: awkward widths, nested blocks, bias on/off,
    frozen blocks (never the last one: something must train)."""
    in_dim = draw(st.sampled_from(WIDTHS))
    n = draw(st.integers(1, max_blocks))
    blocks = []
    for i in range(n):
        kind = draw(st.sampled_from(("linear", "nested", "nobias")))
        width = draw(st.sampled_from(WIDTHS))
        fz = frozen and i < n - 1 and draw(st.booleans())
        blocks.append((kind, width, fz))
    return in_dim, tuple(blocks)


def _units(blocks: tuple) -> list[str]:
    out = []
    for i, (kind, _, _) in enumerate(blocks):
        out.append(f"blocks.{i}")
        if kind == "nested":
            out.append(f"blocks.{i}.0")
    return out


@st.composite
def user_roundtrips(draw, *, paths=None, world_sizes=(1, 2, 3, 4), use_orig_params=(False, True),
                    optimizers=("adam", "sgd_momentum", "adamw", "sgd"), dtypes=("fp64",),
                    max_blocks: int = 4, frozen: bool = True):
    """``(UserModel, Case)``: a generated module tree, a wrapping plan over its blocks and a
    round trip through a built-in path (flat units never mix frozen and trainable params:
    frozen blocks become units of their own)."""
    in_dim, blocks = draw(module_trees(max_blocks=max_blocks, frozen=frozen))
    orig = draw(st.sampled_from(list(use_orig_params)))
    units = _units(blocks)
    plan = [u for u in units if draw(st.booleans())]
    if not orig:  # frozen blocks in units of their own (their inner units are frozen too)
        plan = sorted(set(plan) | {f"blocks.{i}" for i, b in enumerate(blocks) if b[2]},
                      key=units.index)
    opt = draw(st.sampled_from(list(optimizers)))
    user = UserModel(_arch_name(in_dim, blocks),
                     Ref("fsdp_conformance.user.strategies:GeneratedNet", args=(in_dim, blocks)),
                     Ref("fsdp_conformance.user.strategies:generated_batch", args=(in_dim,)),
                     plan=tuple(plan), optimizer=opt, optimizer_name=opt, optimizer_kind=opt)
    user.register()
    api = draw(st.sampled_from(list(paths or FSDP1_PATHS)))
    n, m = draw(world_size_pairs(world_sizes, resize=resizable(api)))
    case = Case(api=api, model=user.name, plan=user.plan_name, optimizer=opt,
                use_orig_params=orig, world_size=n, load_world_size=None if m == n else m,
                dtype=draw(st.sampled_from(list(dtypes))))
    return user, case
