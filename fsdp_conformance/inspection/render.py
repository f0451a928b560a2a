"""The human view of an inspect :class:`~.summary.Summary` (rich, or plain text).

Rules
-----
Human view (``render``): a header (the path, then kind, world size, optimizer, params with
  state, bytes of state); a table of params (key, state names, shapes, dtypes, step,
  groups), the first ``limit`` (default 50) and a count of the rest unless ``all``; the
  param groups with their hyperparameters; the implied layout; the findings, warnings
  first. Text comes from the checkpoint: it is never read as rich markup.
"""
from __future__ import annotations

import json
from typing import Iterable

from .summary import ParamInfo, StateInfo, Summary

DEFAULT_LIMIT = 50


def size_str(n: int) -> str:
    """``1536`` -> ``1.5 KiB`` (bytes under 1 KiB as such)."""
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def header_line(s: Summary) -> str:
    """Kind, world size, optimizer, params with state, bytes of state."""
    c = s.counts()
    total = len(s.params)
    return "; ".join([
        s.description,
        f"world size {s.world_size}" if s.world_size is not None else "world size not recorded",
        f"optimizer {s.optimizer}" if s.optimizer else "optimizer not recognised",
        f"{c['with_state']} of {total} params with state",
        f"{size_str(s.state_bytes)} of state" + ("" if s.values_read or s.format != "dcp"
                                                 else " (from metadata)"),
    ])


def _shape(st: StateInfo) -> str:
    if st.shape is not None:
        return "[" + ", ".join(map(str, st.shape)) + "]"
    pieces = st.rank_numel or ()
    return "per rank " + "+".join("-" if n is None else str(n) for n in pieces)


def _distinct(items: Iterable[str]) -> str:
    return ", ".join(dict.fromkeys(items))


def _step(p: ParamInfo) -> str:
    if p.step_kind is None:
        return "-"
    return f"{p.step} ({p.step_kind})"


def param_row(p: ParamInfo) -> tuple[str, str, str, str, str, str]:
    """(key, state names, shapes, dtypes, step, groups) of one param as text."""
    per_el = [st for st in p.state if st.per_element]
    shapes = _distinct(_shape(st) for st in per_el)
    if any(st.kind in ("sharded tensor", "dtensor") for st in per_el):
        kinds = _distinct("ShardedTensor" if st.kind == "sharded tensor" else "DTensor"
                          for st in per_el)
        shapes += f" ({kinds})"
    dtypes = _distinct(st.dtype for st in (per_el or p.state) if st.dtype)
    names = ", ".join(st.name for st in p.state) if p.state else "no state"
    groups = ",".join(map(str, p.groups)) if p.groups else "none"
    return str(p.key), names, shapes or "-", dtypes or "-", _step(p), groups


def group_row(g) -> tuple[str, str, str]:
    """(index, number of params, hyperparameters) of one param group as text."""
    return (str(g.index), str(len(g.params)),
            ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in g.hyper.items()) or "-")


def render(s: Summary, console=None, *, limit: int | None = DEFAULT_LIMIT) -> None:
    """The human view of ``s`` on ``console`` (default: stdout); ``limit`` None: every param."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    console.print(Text(f"fsdp-conformance inspect {s.path}", style="bold"))
    console.print(Text(header_line(s)))
    if s.location and s.format == "file":
        console.print(Text(f"optimizer dict at {s.location}", style="dim"))

    shown = s.params if limit is None else s.params[:limit]
    table = Table(title=f"params ({len(s.params)}, {s.key_type} keys)", title_justify="left",
                  title_style="bold")
    for col in ("param", "state", "shape", "dtype", "step", "group"):
        table.add_column(col, overflow="fold")
    stateless_note = any(f.code in ("no-state", "empty-state") and f.level == "note"
                         for f in s.findings)
    for p in shown:
        row = param_row(p)
        style = "" if p.state or stateless_note else "red"
        table.add_row(*(Text(c, style=style) for c in row))
    console.print(table)
    if len(shown) < len(s.params):
        console.print(Text(f"... {len(s.params) - len(shown)} more params (--all lists every "
                           "one; --out writes them all)", style="dim"))

    groups = Table(title=f"param groups ({len(s.groups)})", title_justify="left",
                   title_style="bold")
    for col in ("group", "params", "hyperparameters"):
        groups.add_column(col, overflow="fold")
    for g in s.groups:
        groups.add_row(*(Text(c, style="" if g.params else "red") for c in group_row(g)))
    console.print(groups)

    console.print(Text("layout", style="bold"))
    for line in s.layout:
        console.print(Text(f"  - {line}"))
    ordered = list(s.warnings) + [f for f in s.findings if f.level != "warning"]
    console.print(Text(f"findings ({len(s.warnings)} warnings, "
                       f"{len(ordered) - len(s.warnings)} notes)", style="bold"))
    if not ordered:
        console.print(Text("  none", style="green"))
    for f in ordered:
        console.print(Text(f"  {f.level} [{f.code}]: {f.message}",
                           style="yellow" if f.level == "warning" else "dim"))


def render_text(s: Summary, *, limit: int | None = DEFAULT_LIMIT, width: int = 120) -> str:
    """The human view as plain text (no colour), ``width`` columns."""
    import io

    from rich.console import Console

    buf = io.StringIO()
    render(s, Console(file=buf, width=width, color_system=None, force_terminal=False,
                      soft_wrap=False), limit=limit)
    return buf.getvalue()
