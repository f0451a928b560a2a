"""Whether the ranks can import a function, decided in the controller before any rank runs.

Rules
- Functions cross to the ranks by reference (pickle sends ``module`` and ``qualname``; the
  rank imports them). So a rank function must be a module-level attribute of a module the
  ranks can import, and resolving that name must give the function itself.
- Refused, with a ``TypeError`` that names the function, the reason and the fix: a lambda;
  a function defined inside another function; anything not callable; a function of a
  ``__main__`` that has no file the ranks can re-run (the interactive interpreter, ``python
  -c``, a script read from stdin); a name that resolves to another object (shadowed or
  re-bound).
- ``main_rerun_problem()`` says why the rank processes could not re-run this controller's
  ``__main__`` at all (multiprocessing re-runs the main script in every spawned rank, and a
  script read from stdin has the file name ``<stdin>``, which does not exist); ``None``
  when they can.
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Any

FIX = ("define it at module level in an importable module (a .py file on the ranks' "
       "sys.path); lambdas and nested functions are not importable by name")


def _main_file() -> str | None:
    """The file the spawned ranks would re-run as ``__main__``, or None when they import
    ``__main__`` by module name (``python -m``) or do not re-run it (no ``__file__``)."""
    main = sys.modules.get("__main__")
    if main is None or getattr(getattr(main, "__spec__", None), "name", None):
        return None
    return getattr(main, "__file__", None)


def main_rerun_problem() -> str | None:
    """Why the rank processes cannot re-run this controller's ``__main__`` (module rules),
    or None when they can."""
    from multiprocessing import process

    path = _main_file()
    if path is None:
        return None
    if not os.path.isabs(path) and process.ORIGINAL_DIR is not None:  # as spawn resolves it
        path = os.path.join(process.ORIGINAL_DIR, path)
    if os.path.isfile(path):
        return None
    return (f"this program's __main__ is {path!r}, which is not a file: multiprocessing "
            f"re-runs the main script in every rank it spawns and cannot (a script read "
            f"from stdin?); run the script from a file or as 'python -m package.module'")


def _main_problem() -> str | None:
    """Why the ranks could not import a function defined in ``__main__``, or None."""
    main = sys.modules.get("__main__")
    if main is not None and getattr(getattr(main, "__spec__", None), "name", None):
        return None  # python -m: the ranks import it by module name
    path = getattr(main, "__file__", None)
    if path is None:
        return "it is defined in an interactive __main__ (no file)"
    if not os.path.isfile(path):
        return f"it is defined in __main__ read from {path!r}, which is not a file"
    return None


def _resolve(mod: str, qual: str) -> Any:
    obj: Any = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def check_importable(fn: Any, what: str = "rank function") -> str:
    """``"module:qualname"`` of ``fn`` if the ranks can import it; else ``TypeError`` naming
    ``what``, the function, the reason and the fix (module rules)."""
    qual = getattr(fn, "__qualname__", None)
    mod = getattr(fn, "__module__", None)
    name = f"{mod}:{qual}" if mod and qual else repr(fn)
    if not callable(fn):
        reason = "it is not callable"
    elif not qual or not mod:
        reason = "it has no module and qualified name to be imported by"
    elif "<lambda>" in qual:
        reason = "it is a lambda"
    elif "<locals>" in qual:
        reason = f"it is defined inside the function {qual.split('.<locals>')[0]!r}"
    elif mod == "__main__" and _main_problem():
        reason = _main_problem()
    else:
        try:
            found = _resolve(mod, qual)
        except (ImportError, AttributeError) as exc:
            reason = f"importing it by name fails ({type(exc).__name__}: {exc})"
        else:
            if found is fn:
                return f"{mod}:{qual}"
            reason = f"{name} names another object ({found!r}): shadowed or re-bound"
    raise TypeError(f"{what} {name} cannot be sent to the ranks: {reason}; {FIX}")
