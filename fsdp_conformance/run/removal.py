"""API removal is a verdict, not an error: a path whose torch API the torch under test no
longer has gets the status "removed", with torch's own message.

Rules
- A path names the torch functions it calls (``ApiPath.calls``, api_paths.py). A failing
  verdict ("fail" or "error", never one of the suite's own) shows a removal when its detail
  holds a traceback whose exception says one of those functions is gone:
    ``AttributeError: ... has no attribute '<call>'`` or ``ImportError: cannot import name
    '<call>'`` (the function was deleted);
    ``NotImplementedError`` raised in ``<call>`` itself or naming it (a stub left in its
    place, as pytorch#191712 does for the five legacy FSDP1 optimizer-state functions);
    any exception raised in ``<call>`` or naming it whose message says it was removed
    ("removed", "no longer supported/available").
  Anything else stays what it was: a function that raises some other error is a torch
  failure, judged as before.
- Only the verdicts that show the removal become "removed" (detail: the path, the function,
  the torch version and torch's message). A property that passed before the removed call
  (the saved dict, when only the load is gone) keeps its verdict.
- This runs before the known limitations (``known.apply``), which leave "removed" alone.
- The run report lists removed paths on their own (``summary.removed``), with the golden
  fixtures that no remaining load path reads (``summary.removed_fixtures``); ``compare``
  and the gate say "API removed", never "regression" (report/diff_runs.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata
from typing import Mapping

from ..cases import Case
from ..known.model import raised_in
from ..properties.verdict import Verdict

_MISSING = re.compile(r"has no attribute '(?P<name>\w+)'|cannot import name '(?P<imp>\w+)'")
_SAYS_REMOVED = re.compile(r"\bremoved\b|\bno longer (?:supported|available|exists?)\b", re.I)


@dataclass(frozen=True, kw_only=True)
class Removal:
    """What a traceback shows about one removed torch function."""

    call: str
    """The path's torch function that is gone (``ApiPath.calls``)."""
    exc: str
    """The exception's type as the traceback names it."""
    message: str
    """Torch's message (the exception line's text)."""


def removal_in(detail: str, calls: tuple[str, ...]) -> Removal | None:
    """The removal of one of ``calls`` that ``detail``'s traceback shows (module rules), or
    None."""
    if not calls:
        return None
    for kind, msg, func in raised_in(detail):
        missing = _MISSING.search(msg)
        name = missing and (missing.group("name") or missing.group("imp"))
        if kind in ("AttributeError", "ImportError") and name in calls:
            return Removal(call=name, exc=kind, message=msg)
        named = func if func in calls else next(
            (c for c in calls if re.search(rf"\b{c}\b", msg)), "")
        if named and (kind == "NotImplementedError" or _SAYS_REMOVED.search(msg)):
            return Removal(call=named, exc=kind, message=msg)
    return None


def torch_version() -> str:
    """The installed torch's version (without importing it)."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "?"


def removed_verdict(case: Case, r: Removal) -> Verdict:
    """The "removed" verdict naming the path, the function, the torch and its message."""
    return Verdict("removed", f"API removed: {case.api} calls torch's `{r.call}`, which torch "
                              f"{torch_version()} no longer provides ({r.exc}: {r.message})")


def mark_removed(case: Case, verdicts: Mapping[str, Verdict]) -> dict[str, Verdict]:
    """``verdicts`` with every failing verdict that shows a removal of the case's path's
    calls turned "removed" (module rules). Paths outside the registry (a user's own code)
    are left as they are."""
    from ..api_paths import PATH_NAMES, api_path

    if case.api not in PATH_NAMES:
        return dict(verdicts)
    calls = api_path(case.api).calls
    out: dict[str, Verdict] = {}
    for prop, v in verdicts.items():
        r = (removal_in(v.detail, calls)
             if v.status in ("fail", "error") and v.origin != "suite" else None)
        out[prop] = removed_verdict(case, r) if r is not None else v
    return out
