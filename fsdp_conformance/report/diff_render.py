"""Rendering a :class:`~.diff_model.Comparison`: plain text (:func:`render_text`), a rich
terminal view (:func:`render_rich`) and Markdown (:func:`render_markdown`). Each shows
the title, both sides' facts and the notes (:func:`header_lines`), one section per
non-empty category in CATEGORIES order (:func:`sections`: regressions first), and the
verdict line; the changes keep the Comparison's order.
"""
from __future__ import annotations

from .diff_model import CATEGORIES, Change, Comparison


def header_lines(cmp: Comparison) -> list[str]:
    """Both sides in one line each, then the notes."""
    def side(name: str, path: str, f: dict) -> str:
        if cmp.kind == "run":
            what = (f"torch {f['torch']}, {f['backend']}, tier {f['tier']}, {f['cases']} cases, "
                    f"{'ok' if f['ok'] else 'FAILED'}")
        else:
            what = f"torch {f['torch']}, {f['benchmarks']} benchmarks"
        return f"{name} {path}: {what}; {f['machine']}"
    return ([side("BASE", cmp.base_path, cmp.base_facts), side("NEW ", cmp.new_path, cmp.new_facts),
             f"thresholds: slowdown x{cmp.thresholds.max_slowdown:g}, memory growth "
             f"x{cmp.thresholds.max_memory_growth:g}"] + [f"note: {n}" for n in cmp.notes])


def sections(cmp: Comparison) -> list[tuple[str, list[Change]]]:
    """(title, changes) per non-empty category, in CATEGORIES order."""
    titles = {"regression": "Regressions", "removed": "API removed (verdicts)",
              "improvement": "Improvements",
              "known fixed": "Known limitations fixed", "info": "Other changes (information)"}
    return [(f"{titles[cat]} ({len(cs)})", cs) for cat in CATEGORIES
            if (cs := [c for c in cmp.changes if c.category == cat])]


def _change_line(c: Change) -> str:
    item = f"  {c.item}" if c.item else ""
    return f"{c.label}: {c.subject}{item}: {c.base} -> {c.new}"


def render_text(cmp: Comparison) -> str:
    """Plain text for a log or a pipe: header, one section per category, the verdict."""
    out = [f"fsdp-conformance compare ({cmp.kind} reports)", *header_lines(cmp), ""]
    for title, cs in sections(cmp):
        out.append(title + ":")
        for c in cs:
            out.append("  " + _change_line(c))
            if c.detail:
                out.append("      " + c.detail)
        out.append("")
    out.append(cmp.verdict_line())
    return "\n".join(out) + "\n"


def render_rich(cmp: Comparison, console=None) -> None:
    """The same for a terminal: one table per category (regressions red)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    console.print(Text(f"fsdp-conformance compare ({cmp.kind} reports)", style="bold"))
    for line in header_lines(cmp):
        console.print(Text(line, style="dim" if line.startswith(("note", "thresholds")) else ""))
    styles = {"regression": "red", "removed": "magenta", "improvement": "green",
              "known fixed": "yellow", "info": ""}
    for title, cs in sections(cmp):
        table = Table(title=title, title_justify="left", title_style=f"bold {styles[cs[0].category]}")
        for col in ("change", "subject", "item", "BASE", "NEW", "detail"):
            table.add_column(col, overflow="fold")
        for c in cs:
            table.add_row(Text(c.label, style=styles[c.category]), c.subject, c.item, c.base,
                          c.new, c.detail)
        console.print(table)
    console.print(Text(cmp.verdict_line(),
                       style="bold red" if cmp.regressed or cmp.removed_paths else "bold green"))


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(cmp: Comparison) -> str:
    """Markdown: title, verdict, header facts, one table per category."""
    out = [f"# fsdp-conformance compare: {cmp.kind} reports", "", f"**{cmp.verdict_line()}**", ""]
    out += [f"- {_md(line)}" for line in header_lines(cmp)] + [""]
    for title, cs in sections(cmp):
        out += [f"## {title}", "", "| change | subject | item | BASE | NEW | detail |",
                "|---|---|---|---|---|---|"]
        out += [f"| {c.label} | `{_md(c.subject)}` | {_md(c.item)} | {_md(c.base)} | "
                f"{_md(c.new)} | {_md(c.detail)} |" for c in cs] + [""]
    return "\n".join(out)
