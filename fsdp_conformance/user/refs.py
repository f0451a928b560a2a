"""References to importable callables (``Ref``): how a user's model, data, optimizer, loss
and save/load functions reach the ranks. Everything crosses as ``"pkg.module:name"`` plus
optional picklable arguments; lambdas and nested functions are refused in the controller,
with the reason.
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import KW_ONLY, dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Ref:
    """An importable callable, optionally with bound arguments. Pickles as plain data, so it
    crosses to ranks; ``repr`` is valid Python (used by reproducers)."""

    target: str
    """``"package.module:qualname"`` of the callable."""
    _: KW_ONLY
    args: tuple = ()
    """Positional arguments bound in front of the call's own."""
    kwargs: tuple = ()
    """Keyword arguments bound to the call, as a tuple of (name, value) pairs."""

    @classmethod
    def of(cls, obj: Any, what: str = "callable") -> "Ref":
        """A Ref for a "module:name" string, a module-level callable, or a functools.partial
        of one; TypeError (naming ``what``) for anything the ranks could not import."""
        if isinstance(obj, Ref):
            return obj
        if isinstance(obj, str):
            mod, sep, qual = obj.partition(":")
            if not sep or not mod or not qual:
                raise TypeError(f"{what}: expected 'package.module:name', got {obj!r}")
            ref = cls(obj)
            ref.resolve()  # fail here, in the controller, with the import error
            return ref
        if isinstance(obj, functools.partial):
            inner = cls.of(obj.func, what)
            return cls(inner.target, args=inner.args + tuple(obj.args),
                       kwargs=inner.kwargs + tuple(sorted(obj.keywords.items())))
        from ..harness.refs import check_importable

        return cls(check_importable(obj, what))

    def resolve(self) -> Callable:
        return resolve_ref(self)

    @property
    def name(self) -> str:
        return self.target.rpartition(":")[2].rpartition(".")[2]

    @property
    def label(self) -> str:
        """``name``, with the bound arguments that tell two partials of one function apart:
        ``save_optimizer[FULL_STATE_DICT]``, ``save[kind=full]`` (str, int, float and bool
        arguments as written, an enum member by its name, anything else as its type name
        and a short hash of its repr)."""
        def show(v: Any) -> str:
            import enum
            import hashlib

            if isinstance(v, enum.Enum):
                return v.name
            if isinstance(v, (str, int, float, bool)):
                return str(v)
            return f"{type(v).__name__}:{hashlib.sha1(repr(v).encode()).hexdigest()[:6]}"
        bound = [show(a) for a in self.args] + [f"{k}={show(v)}" for k, v in self.kwargs]
        return f"{self.name}[{','.join(bound)}]" if bound else self.name

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)


def import_target(target: str) -> Any:
    """The object ``"package.module:qual.name"`` names (imports the module)."""
    mod, _, qual = target.partition(":")
    obj: Any = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


@functools.lru_cache(maxsize=None)
def resolve_ref(ref: Ref) -> Callable:
    """One object per Ref and process (the zoo registry compares factories by identity)."""
    fn = import_target(ref.target)
    if ref.args or ref.kwargs:
        return functools.partial(fn, *ref.args, **dict(ref.kwargs))
    return fn
