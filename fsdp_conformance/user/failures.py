"""What a failing round trip tells the user: which cases failed which property, with the
detail (key/param/rank, expected vs got), how to rerun each case alone, and a standalone
reproducer script (``reproducer``), raised as ``RoundtripFailure``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..properties.verdict import Verdict
from ..report.detail import readable
from .spec import PROPERTY_NAMES

if TYPE_CHECKING:
    from ..cases import Case
    from .model import CustomPath, UserModel


class RoundtripFailure(AssertionError):
    """A round trip failed a property; the message names the case, the property, the
    key/param/rank with expected vs got, and how to rerun just that case."""

    def __init__(self, message: str, results=(), brief: str = ""):
        super().__init__(message)
        self.results = list(results)
        self.brief = brief
        """The same message without the reproducer scripts ("" = the message is brief)."""


def failing(result) -> dict[str, Verdict]:
    return {p: v for p, v in result.properties.items() if v.status in ("fail", "error")}


def reproducer(case: Case, user: UserModel | None = None,
               custom: CustomPath | None = None) -> str:
    """A standalone Python script that reruns ``case`` and prints its verdicts (run it
    where the user's modules import, e.g. the project root)."""
    args = [repr(case)]
    if user is not None:
        args.append(f"user={user!r}")
    if custom is not None:
        args.append(f"custom={custom!r}")
    body = ",\n              ".join(args)
    return ("from fsdp_conformance import Case\n"
            "from fsdp_conformance.roundtrip import CustomPath, Ref, UserModel, reproduce\n\n"
            "if __name__ == \"__main__\":  # the ranks re-import this file\n"
            f"    raise SystemExit(reproduce({body}))\n")


def _indent(text: str, n: int) -> str:
    return "\n".join(" " * n + ln for ln in text.splitlines())


def failure_message(results, *, user: UserModel | None = None,
                    custom: CustomPath | None = None,
                    rerun: Callable[[Case], str] | None = None,
                    detail_lines: int = 30, scripts: bool = True) -> str:
    """Which cases failed which property, with the detail (key/param/rank, expected vs got)
    and how to rerun each case alone (``scripts``: and a standalone reproducer script)."""
    bad = [r for r in results if failing(r)]
    out = [f"fsdp round trip: {len(bad)} of {len(results)} case(s) failed"]
    for r in bad:
        out.append("")
        out.append(f"case {r.case.id}")
        # properties failing for one reason (the user's save raised: P3, P6, P7, ...) are
        # reported together, the reason once
        groups: dict[str, list] = {}
        for p, v in failing(r).items():
            groups.setdefault(v.detail.strip(), []).append((p, v))
        for detail, members in groups.items():
            lines = readable(detail).splitlines() or ["(no detail)"]
            names = ", ".join(f"{p} ({PROPERTY_NAMES.get(p, '?')})" for p, _ in members)
            status = "/".join(sorted({v.status.upper() for _, v in members}))
            out.append(f"  {names} {status}: {lines[0]}")
            more = lines[1:detail_lines]
            if more:
                out.append(_indent("\n".join(more), 6))
            if len(lines) > detail_lines:
                out.append(f"      ... {len(lines) - detail_lines} more line(s)")
        if rerun is not None:
            out.append(f"  rerun just this case: {rerun(r.case)}")
        if scripts:
            out.append("  standalone reproducer (save as repro.py, run from your project root):")
            out.append(_indent(reproducer(r.case, user, custom), 4))
    return "\n".join(out)

