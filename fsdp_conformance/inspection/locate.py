"""Finding the optimizer dict in what a file held: itself, or nested in a trainer
checkpoint.

Rules
-----
An optimizer dict is a mapping with a ``state`` mapping and a ``param_groups`` list (or
tuple) of mappings, keyed by FQNs or by int ids; it may be nested up to ``MAX_DEPTH``
levels in mappings, lists and tuples (its own insides are not searched). ``key`` (dotted:
``"optim"``, ``"optimizers.0"``) picks one when several are found; none, several and no
``key``, a ``key`` naming none, or a malformed ``param_groups`` is a
:class:`~fsdp_conformance.reshard.errors.UsageError` naming the file (and rank).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ..reshard.errors import UsageError

MAX_DEPTH = 4


def is_optimizer_dict(obj: Any) -> bool:
    """A mapping with a ``state`` mapping and a ``param_groups`` list or tuple."""
    return (isinstance(obj, Mapping) and isinstance(obj.get("state"), Mapping)
            and isinstance(obj.get("param_groups"), (list, tuple)))


def find_optimizer_dicts(obj: Any, max_depth: int = MAX_DEPTH) -> list[tuple[tuple, Mapping]]:
    """Every optimizer dict in ``obj`` (itself, or nested in mappings/lists/tuples up to
    ``max_depth`` levels), as ``(path of keys, dict)``, outermost first; an optimizer dict's
    insides are not searched."""
    found: list[tuple[tuple, Mapping]] = []

    def walk(o: Any, where: tuple, depth: int) -> None:
        if is_optimizer_dict(o):
            found.append((where, o))
            return
        if depth >= max_depth:
            return
        if isinstance(o, Mapping):
            for k, v in o.items():
                walk(v, where + (k,), depth + 1)
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                walk(v, where + (i,), depth + 1)

    walk(obj, (), 0)
    return found


def location_str(where: tuple) -> str:
    """``('optim',)`` -> ``["optim"]``; ``()`` -> ``""`` (the top level)."""
    return "".join(f"[{k!r}]".replace("'", '"') for k in where)


def _check_groups(osd: Mapping, path: Path, rank: int | None) -> None:
    """Every param group is a mapping whose ``params`` (if any) is a list of int or str keys."""
    for i, g in enumerate(osd["param_groups"]):
        if not isinstance(g, Mapping):
            raise UsageError(f"param_groups[{i}] is a {type(g).__name__}, expected a dict of "
                             "hyperparameters and 'params'", path=path, rank=rank)
        ps = g.get("params", [])
        if not isinstance(ps, (list, tuple)):
            raise UsageError(f"param_groups[{i}]['params'] is a {type(ps).__name__}, expected a "
                             "list of param ids or FQNs", path=path, rank=rank)
        for j, k in enumerate(ps):
            if not isinstance(k, (int, str)):
                raise UsageError(f"param_groups[{i}]['params'][{j}] is a {type(k).__name__}, "
                                 "expected an int id or a str FQN", path=path, rank=rank)


def select_optimizer_dict(obj: Any, key: str | None, path: Path,
                          rank: int | None = None) -> tuple[tuple, Mapping]:
    """The one optimizer dict of ``obj`` (``key``: dotted path to it), its param groups
    checked; UsageError when there is none, several and no ``key``, or ``key`` names none."""
    found = find_optimizer_dicts(obj)
    names = [".".join(map(str, w)) or "<top level>" for w, _ in found]
    if key is not None:
        sel = [(w, d) for w, d in found if ".".join(map(str, w)) == key]
        if len(sel) != 1:
            raise UsageError(f"--key {key!r} names no optimizer dict; found: {names or 'none'}",
                             path=path, rank=rank)
    elif len(found) > 1:
        raise UsageError(f"{len(found)} optimizer dicts in this file ({names}); pick one with "
                         "--key", path=path, rank=rank)
    elif found:
        sel = found
    elif isinstance(obj, Mapping) and not obj:
        raise UsageError("an empty dict, no optimizer state: what full_optim_state_dict / "
                         "optim_state_dict with rank0_only=True return on ranks other than 0",
                         path=path, rank=rank)
    else:
        what = (f"a mapping with keys {sorted(map(str, obj))[:8]}" if isinstance(obj, Mapping)
                else f"a {type(obj).__name__}")
        raise UsageError(f"no optimizer state dict (a mapping with a 'state' mapping and a "
                         f"'param_groups' list) in it, up to {MAX_DEPTH} levels deep: it is {what}",
                         path=path, rank=rank)
    _check_groups(sel[0][1], path, rank)
    return sel[0]
