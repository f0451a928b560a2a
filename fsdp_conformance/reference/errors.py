"""Errors raised by the reference on bad input.

Every error is a :class:`StateDictMismatch` (a ``ValueError``) whose message names,
where they apply, the state key (``exp_avg``), the parameter FQN or optimizer key,
the rank, and what was expected versus what was found. The same facts are kept as
attributes so tests and reports can read them without parsing the text.
"""

from __future__ import annotations

from typing import Any


class StateDictMismatch(ValueError):
    """An optimizer state dict does not fit the layout it is used with.

    Attributes: ``param`` (FQN or optimizer key), ``key`` (state name or dict key),
    ``rank``, ``expected``, ``got``, ``problem`` (one-line description).
    """

    def __init__(
        self,
        problem: str,
        *,
        param: str | None = None,
        key: str | None = None,
        rank: int | None = None,
        expected: Any = None,
        got: Any = None,
    ) -> None:
        self.problem = problem
        self.param = param
        self.key = key
        self.rank = rank
        self.expected = expected
        self.got = got
        parts = [problem]
        where = []
        if param is not None:
            where.append(f"param {param!r}")
        if key is not None:
            where.append(f"key {key!r}")
        if rank is not None:
            where.append(f"rank {rank}")
        if where:
            parts.append("at " + ", ".join(where))
        if expected is not None or got is not None:
            parts.append(f"expected {_short(expected)}, got {_short(got)}")
        super().__init__("; ".join(parts))


class UnknownKeyError(StateDictMismatch):
    """A state or param_groups entry names a parameter the layout does not have."""


class MissingKeyError(StateDictMismatch):
    """A parameter, rank entry or state name the layout requires is absent."""


class ShapeMismatch(StateDictMismatch):
    """A tensor's shape or numel differs from what the layout requires."""


class DtypeMismatch(StateDictMismatch):
    """A tensor's dtype differs from its siblings in the same flat unit."""


class ScalarStateConflict(StateDictMismatch):
    """Scalar (0-dim tensor or non-tensor) state disagrees within a unit or across ranks."""


class MixedKeyTypes(StateDictMismatch):
    """A ``state`` mapping mixes int and str keys."""


class RankCountMismatch(StateDictMismatch):
    """The number of per-rank dicts differs from the layout's world size."""


class LayoutError(ValueError):
    """A module / wrapping plan / spec cannot be laid out the way FSDP would."""


def _short(x: Any, limit: int = 120) -> str:
    try:
        import torch

        if isinstance(x, torch.Tensor):
            return f"tensor(shape={tuple(x.shape)}, dtype={x.dtype}, device={x.device})"
    except Exception:  # pragma: no cover
        pass
    s = repr(x)
    return s if len(s) <= limit else s[: limit - 3] + "..."
