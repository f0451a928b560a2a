"""``fsdp-conformance report`` (render a run report as Markdown and HTML) and
``fsdp-conformance compare`` (what changed between two reports; the upgrade gate).

Exit codes: 0 ok (``compare``: no regression), 1 ``compare`` found a regression or a path
whose torch API NEW removed (``--allow-removed``: removals alone exit 0), 2 usage
error (unreadable input, a file of another schema, a run report against a benchmark report,
a threshold below 1, an output path that is one of the inputs).

Outputs are written atomically; an output path equal to an input (the same file, through
any link) is refused, so a report is never written over by its own rendering.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from .diff import (RUN_SCHEMA, Thresholds, compare_files, load_any, render_markdown,
                   render_rich, render_text)
from .io import write_json_atomic, write_text_atomic
from ..usage import UsageError, add_old, add_out, beside
from .run_report import ReportFormatError



def add_parser(sub) -> None:
    r = sub.add_parser(
        "report", help="render a run report as Markdown and a self-contained HTML page",
        description="Render PATH.json (a run report, schema fsdp-conformance/run/1) as Markdown "
                    "and as one self-contained HTML page (summary matrix, failures with their "
                    "diffs, known limitations, timing and memory plots). Outputs default to "
                    "PATH with .md / .html; an output equal to the input is refused. Exit codes: "
                    "0 written, 2 usage error.")
    r.add_argument("path", help="run report JSON")
    add_out(r, help="where the pages go: OUT.md and OUT.html (a suffix on OUT is replaced; "
                    "default: the input PATH)")
    add_old(r, "--md", dest="md")
    add_old(r, "--html", dest="html")

    c = sub.add_parser(
        "compare", help="compare two run (or two benchmark) reports; exit 1 on any regression",
        description="What changed from BASE to NEW: verdicts newly failing / newly passing, "
                    "known limitations fixed or new, cases missing, timings (floor-normalised, "
                    "beyond the noise of both runs) and peak memory beyond the thresholds. "
                    "A path whose torch API NEW no longer has is reported once per path as "
                    "\"API removed\", not as regressions. Exit codes: 0 no regression, 1 "
                    "regression or API removed, 2 usage error.")
    c.add_argument("base", help="BASE report (run or benchmark JSON)")
    c.add_argument("new", help="NEW report, of the same kind as BASE")
    c.add_argument("--max-slowdown", type=float, default=1.5,
                   help="time ratio NEW/BASE (to the floor) beyond the noise that is a "
                        "regression (default 1.5)")
    c.add_argument("--max-memory-growth", type=float, default=1.2,
                   help="per-rank peak memory ratio NEW/BASE that is a regression (default 1.2)")
    c.add_argument("--allow-removed", action="store_true",
                   help="accept paths whose API NEW's torch removed (exit 0 if nothing else "
                        "regressed); they are still listed")
    add_out(c, help="also write the comparison as OUT.json and OUT.md (a suffix on OUT is "
                    "replaced)")
    m = sub.add_parser(
        "merge", help="join the reports of a run's parts (run --shard I/N) into one",
        description="One run report from the reports of the parts of one run (`run --shard "
                    "I/N` on N CI jobs): every case of every part, the summary counted again, "
                    "each path's scaling; a part missing or incomplete makes the merged report "
                    "incomplete. Writes OUT.json, OUT.md and OUT.html. Exit codes: as `run` "
                    "(0 ok, 1 correctness failed or incomplete, 3 a bound failed), 2 usage "
                    "error (parts of different runs, a case in two parts).")
    m.add_argument("parts", nargs="+", help="the parts' JSON reports")
    m.add_argument("--junit-xml", default=None, metavar="PATH",
                   help="also write the merged report as JUnit XML")
    add_out(m, help="the merged JSON report; the .md and .html go beside it (required)",
            required=True)
    add_old(c, "--md", dest="md")
    add_old(c, "--json", dest="json")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def check_outputs(inputs: list[str], outputs: dict[str, str]) -> dict[str, Path]:
    """The outputs as paths; UsageError naming the option when one is an input, a
    directory, or the same path as another output."""
    paths = {opt: Path(p) for opt, p in outputs.items()}
    for opt, p in paths.items():
        for i in inputs:
            if _same_file(p, Path(i)):
                raise UsageError(f"{opt} {p}: is the input {i}; refusing to write over it "
                                 "(choose another output path)")
        if p.is_dir():
            raise UsageError(f"{opt} {p}: is a directory; expected a file path")
    seen: dict[Path, str] = {}
    for opt, p in paths.items():
        key = p.resolve()
        if key in seen:
            raise UsageError(f"{opt} {p}: same path as {seen[key]}")
        seen[key] = opt
    return paths


def _targets(args, base: Path | None, suffixes: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Each output by kind ("md", "json", "html") as (the option that named it, path):
    ``--out``'s ``base`` with the kind's suffix, or an earlier ``--md`` / ``--json`` /
    ``--html`` where given; no entry for a kind when neither is given."""
    targets = {}
    for name, suffix in suffixes.items():
        old = getattr(args, name, None)
        if old:
            targets[name] = (f"--{name}", old)
        elif base is not None:
            targets[name] = (f"--out ({suffix})", beside(base, suffix))
    return targets


def _written(inputs: list[str], targets: dict[str, tuple[str, str]]) -> dict[str, Path]:
    """The targets' paths by kind, checked (check_outputs, errors naming the option)."""
    outs = check_outputs(inputs, dict(targets.values()))
    return {name: outs[opt] for name, (opt, _) in targets.items()}


def _report(args) -> int:
    from .html import render_html
    from .run_report import headline, render_markdown as run_markdown

    src = Path(args.path)
    kind, report = load_any(src)
    if kind != "run":
        raise UsageError(f"{src}: is a benchmark report; `report` renders a run report "
                         f"(schema {RUN_SCHEMA!r})")
    outs = _written([args.path], _targets(args, Path(args.out) if args.out else src,
                                          {"md": ".md", "html": ".html"}))
    md = write_text_atomic(outs["md"], run_markdown(report))
    page = write_text_atomic(outs["html"], render_html(report))
    print(headline(report))
    print(f"wrote {md}\nwrote {page}")
    return 0


def _compare(args) -> int:
    try:
        th = Thresholds(args.max_slowdown, args.max_memory_growth)
    except ValueError as e:
        raise UsageError(str(e)) from None
    outs = _written([args.base, args.new], _targets(args, Path(args.out) if args.out else None,
                                                    {"md": ".md", "json": ".json"}))
    cmp = compare_files(args.base, args.new, th)
    if sys.stdout.isatty():
        render_rich(cmp)
    else:
        sys.stdout.write(render_text(cmp))
    if "md" in outs:
        write_text_atomic(outs["md"], render_markdown(cmp))
    if "json" in outs:
        write_json_atomic(outs["json"], cmp.to_json())
    return 1 if cmp.blocked(args.allow_removed) else 0


def _merge(args) -> int:
    from .html import render_html
    from .merge import merge_reports
    from .run_report import exit_code, headline, render_markdown as run_markdown

    if not args.out:
        raise UsageError("merge needs --out: where the merged report goes")
    base = Path(args.out)
    outs = _written(list(args.parts), {k: (f"--out ({s})", beside(base, s))
                                       for k, s in (("json", ".json"), ("md", ".md"),
                                                    ("html", ".html"))})
    report = merge_reports(args.parts)
    write_json_atomic(outs["json"], report)
    write_text_atomic(outs["md"], run_markdown(report))
    write_text_atomic(outs["html"], render_html(report))
    if args.junit_xml:
        from .junit import to_junit

        write_text_atomic(args.junit_xml, to_junit(report))
    print(headline(report))
    if report.get("incomplete"):
        print(f"INCOMPLETE: {report['incomplete']}", file=sys.stderr)
        return 1
    print(f"wrote {outs['json']}, {outs['md']}, {outs['html']}")
    return exit_code(report)


def main(args) -> int:
    try:
        if args.command == "merge":
            return _merge(args)
        return _report(args) if args.command == "report" else _compare(args)
    except (UsageError, ReportFormatError) as e:
        print(f"fsdp-conformance {args.command}: error: {e}", file=sys.stderr)
        return 2
