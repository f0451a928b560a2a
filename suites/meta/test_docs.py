"""The documentation is checked like code: a doc that lies fails ``make test``.

Over README.md, CHANGELOG.md and docs/**/*.md:
- every Markdown table renders: a blank line before it, and its header, delimiter row and
  every body row have the same number of cells (GFM splits cells on every unescaped ``|``,
  inside backticks too, so a pipe inside a cell is written ``\\|``);
- every relative link (and image) names a file that exists, and a ``#fragment`` into a
  Markdown file names one of its headings;
- every ```python block compiles;
- every ``fsdp-conformance`` command shown in a ```console / ```bash block parses with the
  command line's own parser, and the cheap ones (``--help``, ``--version``, ``run ...
  --list``) run in a subprocess and exit 0;
- docs/reference/cli.md names every option of every command and subcommand, and
  docs/reference/environment.md every ``FSDPC_*`` variable the package reads.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from suites.conftest import ROOT, env_for_subprocess

DOCS = sorted(p for p in [ROOT / "README.md", ROOT / "CHANGELOG.md",
                          *(ROOT / "docs").rglob("*.md")] if p.exists())
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
DELIMITER = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s+\".*\")?\s*$")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def blocks(path: Path):
    """``(kind, first line number, lines)`` for every part of the file: ``("text", ...)``
    outside fences, ``("code", ..., info string)`` for a fenced block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out, text, start, i = [], [], 1, 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            text.append(lines[i])
            i += 1
            continue
        out.append(("text", start, text, ""))
        fence, info, body, j = m.group(2), m.group(3), [], i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j])
            j += 1
        out.append(("code", i + 2, body, info))
        text, start, i = [], j + 2, j + 1
    out.append(("text", start, text, ""))
    return out


def cells(row: str) -> int:
    """Number of cells of a GFM table row: split on unescaped pipes, the outer ones dropped."""
    row = row.strip()
    parts = re.split(r"(?<!\\)\|", row)
    if row.startswith("|"):
        parts = parts[1:]
    if row.endswith("|") and not row.endswith("\\|"):
        parts = parts[:-1]
    return len(parts)


def tables(path: Path):
    """``(line number, header, delimiter, rows, line before)`` for every table."""
    for kind, start, lines, _ in blocks(path):
        if kind != "text":
            continue
        i = 0
        while i < len(lines) - 1:
            if "|" in lines[i] and DELIMITER.match(lines[i + 1]) and "-" in lines[i + 1]:
                j = i + 2
                while j < len(lines) and lines[j].strip() and "|" in lines[j]:
                    j += 1
                yield (start + i, lines[i], lines[i + 1], lines[i + 2:j],
                       lines[i - 1] if i else "")
                i = j
            else:
                i += 1


def test_the_documents_exist():
    names = {rel(p) for p in DOCS}
    for want in ("README.md", "CHANGELOG.md", "docs/design.md",
                 "docs/reference/properties.md", "docs/reference/known-limitations.md",
                 "docs/reference/cli.md", "docs/reference/environment.md"):
        assert want in names


@pytest.mark.parametrize("path", DOCS, ids=rel)
def test_tables_render(path):
    bad = []
    for line, header, delim, rows, before in tables(path):
        n = cells(header)
        if before.strip() and not before.lstrip().startswith("#"):
            bad.append(f"{rel(path)}:{line}: no blank line before the table")
        if cells(delim) != n:
            bad.append(f"{rel(path)}:{line}: header has {n} cells, delimiter {cells(delim)}")
        for k, row in enumerate(rows):
            if cells(row) != n:
                bad.append(f"{rel(path)}:{line + 2 + k}: {cells(row)} cells, header {n} "
                           f"(a | inside a cell is written \\|)")
    assert not bad, "\n".join(bad)


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file."""
    seen: dict[str, int] = {}
    out = set()
    for kind, _, lines, _ in blocks(path):
        if kind != "text":
            continue
        for line in lines:
            m = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            slug = re.sub(r"[^\w\- ]", "", m.group(1).replace("`", "").lower()).replace(" ", "-")
            k = seen.get(slug, 0)
            seen[slug] = k + 1
            out.add(slug if k == 0 else f"{slug}-{k}")
    return out


def links(path: Path):
    for kind, start, lines, _ in blocks(path):
        if kind != "text":
            continue
        for k, line in enumerate(lines):
            m = REF_DEF.match(line)
            targets = [m.group(1)] if m else []
            targets += LINK.findall(CODE_SPAN.sub("", line))
            for t in targets:
                yield start + k, t


@pytest.mark.parametrize("path", DOCS, ids=rel)
def test_relative_links_point_to_files(path):
    bad = []
    for line, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        file, _, fragment = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{rel(path)}:{line}: {target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment.lower() not in anchors(dest):
            bad.append(f"{rel(path)}:{line}: {target}: no heading with that anchor")
    assert not bad, "\n".join(bad)


def code_blocks(*languages: str):
    for path in DOCS:
        for kind, line, body, info in blocks(path):
            if kind == "code" and info in languages:
                yield path, line, body


@pytest.mark.parametrize("path", DOCS, ids=rel)
def test_python_blocks_compile(path):
    for p, line, body in code_blocks("python", "py"):
        if p == path:
            compile("\n".join(body) + "\n", f"{rel(path)}:{line}", "exec")


def commands():
    """``(where, words after the program name)`` of every fsdp-conformance command shown in
    a console or bash block (a ``$`` prompt, ``VAR=value`` words, a trailing comment and
    ``\\`` continuations understood)."""
    for path, line, body in code_blocks("console", "bash", "sh", "shell"):
        joined, first = [], None
        for k, raw in enumerate(body):
            text = raw[2:] if raw.startswith("$ ") else raw
            if first is None:
                first = k
            if text.rstrip().endswith("\\"):
                joined.append(text.rstrip()[:-1])
                continue
            joined.append(text)
            command, first_line, joined, first = " ".join(joined), line + first, [], None
            try:
                words = shlex.split(command, comments=True)
            except ValueError:
                continue
            while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
                words = words[1:]
            if words and words[0].endswith("fsdp-conformance"):
                yield f"{rel(path)}:{first_line}", words[1:]


COMMANDS = list(commands())


def cheap(words: list[str]) -> bool:
    return ("--help" in words or "-h" in words or words == ["--version"]
            or (words[:1] == ["run"] and "--list" in words))


def test_some_commands_are_shown():
    assert any(cheap(w) for _, w in COMMANDS)
    assert len(COMMANDS) > 10


def test_shown_commands_parse():
    """Every command shown parses with the real parser (no command is run here)."""
    from fsdp_conformance.cli import _parser

    bad = []
    for where, words in COMMANDS:
        if cheap(words):
            continue
        try:
            _parser().parse_args(words)
        except SystemExit as exc:
            if exc.code:
                bad.append(f"{where}: fsdp-conformance {shlex.join(words)}")
    assert not bad, "commands in the docs that the CLI refuses:\n" + "\n".join(bad)


def test_cheap_commands_run():
    """``--help``, ``--version`` and ``run ... --list`` as shown exit 0 (each distinct
    command once, three at a time: each is mostly the interpreter's start and imports)."""
    from concurrent.futures import ThreadPoolExecutor

    todo = {}
    for where, words in COMMANDS:
        if cheap(words):
            todo.setdefault(tuple(words), where)

    def run(words):
        return subprocess.run([sys.executable, "-m", "fsdp_conformance", *words], cwd=ROOT,
                              capture_output=True, text=True, timeout=120,
                              env=env_for_subprocess())

    with ThreadPoolExecutor(max_workers=3) as pool:
        results = dict(zip(todo, pool.map(run, todo)))
    bad = [f"{todo[w]}: fsdp-conformance {shlex.join(w)} -> exit {out.returncode}: "
           f"{out.stderr.strip()[-300:]}" for w, out in results.items() if out.returncode]
    assert todo, "no --help, --version or run --list command is shown in the docs"
    assert not bad, "\n".join(bad)


def parsers():
    """``(command words, parser)`` of every command and subcommand of the CLI."""
    import argparse

    from fsdp_conformance.cli import _parser

    todo = [((), _parser())]
    while todo:
        words, p = todo.pop()
        yield words, p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [(words + (name,), sub) for name, sub in action.choices.items()]


def test_cli_reference_names_every_command_and_option():
    text = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    missing = []
    for words, p in parsers():
        if words and f"fsdp-conformance {' '.join(words)}" not in text:
            missing.append(f"the command `fsdp-conformance {' '.join(words)}`")
        for action in p._actions:
            for opt in action.option_strings:
                if opt.startswith("--") and opt != "--help" and f"`{opt}" not in text:
                    missing.append(f"`{opt}` of `fsdp-conformance {' '.join(words)}`".rstrip())
    assert not missing, ("docs/reference/cli.md does not describe:\n" + "\n".join(missing)
                         + "\n(see `fsdp-conformance <command> --help`)")


def test_environment_reference_names_every_variable():
    names = set()
    for f in (ROOT / "fsdp_conformance").rglob("*"):
        if f.is_file() and f.suffix in (".py", ".sh"):
            names |= set(re.findall(r"FSDPC_[A-Z_]+", f.read_text(encoding="utf-8")))
    text = (ROOT / "docs" / "reference" / "environment.md").read_text(encoding="utf-8")
    missing = sorted(n for n in names if f"`{n}`" not in text)
    assert names and not missing, f"docs/reference/environment.md does not describe {missing}"


def section(path: Path, heading: str) -> str:
    """The text of ``path`` from the heading ``heading`` to the next heading of its level."""
    text = path.read_text(encoding="utf-8")
    start = text.index(heading)
    level = heading.split(" ", 1)[0]
    nxt = re.search(rf"^{level} ", text[start + len(heading):], re.M)
    return text[start:start + len(heading) + nxt.start()] if nxt else text[start:]


def test_architecture_sections_name_every_package():
    """README's architecture section and docs/design.md's package list name every package,
    module and the data folder of fsdp_conformance/ (keep both true)."""
    pkg = ROOT / "fsdp_conformance"
    names = [f"{d.name}/" for d in sorted(pkg.iterdir())
             if d.is_dir() and ((d / "__init__.py").exists() or d.name == "data")]
    names += [f.name for f in sorted(pkg.glob("*.py")) if f.name not in ("__main__.py",)]
    where = {"README.md, ## Architecture": section(ROOT / "README.md", "## Architecture"),
             "docs/design.md, ## The packages": section(ROOT / "docs" / "design.md",
                                                        "## The packages")}
    missing = [f"{doc}: {n}" for doc, text in where.items() for n in names if n not in text]
    assert not missing, "not named (add a line for each):\n" + "\n".join(missing)
