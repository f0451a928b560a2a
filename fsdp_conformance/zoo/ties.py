"""Tied params whose users FSDP1 puts in different units, found from a model and its plan.

Rules
- A tie is one parameter tensor under several FQNs
  (``named_parameters(remove_duplicate=False)``); its users are the modules that hold it
  directly. The first FQN is the one optimizers and state dicts key it by, and its module
  is taken as the first user (registration order; the zoo's forward order too).
- A module's unit is the deepest FQN of the plan that is the module or encloses it (the
  root, ``""``, when none does). A tie lies across units when its users' units differ.
- FSDP1 wraps units in post-order (``_recursive_wrap`` recurses into each child, in
  registration order, before it wraps the child), and a unit flattens every param of its
  subtree no unit took before: the first unit in that order whose subtree holds a user owns
  the tensor (its *owner*, the user inside it); the root owns what no unit took.
- The untied variant of a model (``untied_variant``): the model as built, then each unit's
  users of a tie share a param of their own, a copy of the tensor (the first FQN's unit
  keeps the original): what FSDP1 trains when it flattens the tensor once per unit.

Works alike for the zoo's models and a user's (``register_model``): a known limitation of
ties across units is matched by what the model and its plan have, not by a zoo name.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
from torch import nn

from .models import VARIANTS, build_model, model_spec

UNTIED_SUFFIX = "_untied"


@dataclass(frozen=True, kw_only=True)
class TieAcrossUnits:
    """A param tensor held by modules in different FSDP1 units."""

    names: tuple[str, ...]
    """Its FQNs in ``named_parameters(remove_duplicate=False)`` order (the first is the one
    optimizers key it by)."""
    users: tuple[str, ...]
    """The module FQN holding each name (``names[i]``'s module), in the same order."""
    units: tuple[str, ...]
    """Each user's unit (the plan's FQN enclosing it; ``""``: the root)."""
    owner: str
    """The user inside the unit FSDP1 wraps first (module rules): the unit that owns it."""

    @property
    def owned_by_later_user(self) -> bool:
        """Whether the owner is not the first user (the zoo's 'split_out': unit ``out``
        owns ``embed.weight``, which ``embed`` uses first)."""
        return self.owner != self.users[0]


def _unit_of(module: str, plan: tuple[str, ...]) -> str:
    inside = [u for u in plan if module == u or module.startswith(u + ".")]
    return max(inside, key=len) if inside else ""


def _post_order(model: nn.Module) -> list[str]:
    out: list[str] = []

    def visit(mod: nn.Module, prefix: str) -> None:
        for name, child in mod.named_children():
            fqn = f"{prefix}{name}"
            visit(child, fqn + ".")
            out.append(fqn)
    visit(model, "")
    return out


def _built(model: str) -> nn.Module:
    return build_model(model, 0, torch.float64)


@functools.lru_cache(maxsize=256)
def ties_across_units(model: str, plan: str) -> tuple[TieAcrossUnits, ...]:
    """The ties of zoo (or registered) model ``model`` that lie across the units of its
    plan ``plan`` (module rules); a plan the model does not have: none."""
    spec = model_spec(model)
    if plan not in spec.plans:
        return ()
    units = tuple(spec.plans[plan])
    built = _built(model)
    by_tensor: dict[int, list[tuple[str, str]]] = {}
    for fqn, p in built.named_parameters(remove_duplicate=False):
        mod, _, _ = fqn.rpartition(".")
        by_tensor.setdefault(id(p), []).append((fqn, mod))
    order = {m: i for i, m in enumerate(_post_order(built))}
    out = []
    for held in by_tensor.values():
        if len(held) < 2:
            continue
        names, users = zip(*held)
        their_units = tuple(_unit_of(u, units) for u in users)
        if len(set(their_units)) < 2:
            continue
        wrapped = sorted((u for u in set(their_units) if u), key=order.__getitem__)
        first = wrapped[0] if wrapped else ""
        owner = next(u for u, w in zip(users, their_units) if w == first)
        out.append(TieAcrossUnits(names=tuple(names), users=tuple(users),
                                  units=their_units, owner=owner))
    return tuple(out)


def _untie(factory, copies: tuple[tuple[str, ...], ...]) -> nn.Module:
    """``factory()`` with the names of each group in ``copies`` sharing a param of their
    own, a copy of the tensor they held."""
    built = factory()
    for names in copies:
        held = built.get_parameter(names[0])
        own = nn.Parameter(held.detach().clone(), requires_grad=held.requires_grad)
        for fqn in names:
            mod, _, attr = fqn.rpartition(".")
            setattr(built.get_submodule(mod), attr, own)
    return built


def untied_variant(model: str, plan: str) -> str | None:
    """The name of ``model`` with its ties across ``plan``'s units broken (module rules),
    registered as a variant on first use (``<model>_untied``; ``<model>_untied@<plan>``
    where another plan of the model split its ties otherwise); None when it has none."""
    ties = ties_across_units(model, plan)
    if not ties:
        return None
    copies: list[tuple[str, ...]] = []
    for t in ties:  # per tie, the names of each unit but the first name's
        per_unit: dict[str, list[str]] = {}
        for fqn, unit in zip(t.names, t.units):
            per_unit.setdefault(unit, []).append(fqn)
        copies.extend(tuple(v) for u, v in per_unit.items() if u != t.units[0])
    name = f"{model}{UNTIED_SUFFIX}"
    if name in VARIANTS and VARIANTS[name].factory.args[1] != tuple(copies):
        name = f"{name}@{plan}"
    if name not in VARIANTS:
        spec = model_spec(model)
        VARIANTS[name] = dataclasses.replace(
            spec, name=name, factory=functools.partial(_untie, spec.factory, tuple(copies)))
    return name
