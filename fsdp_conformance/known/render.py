"""The reference page of the known torch limitations, written from ``entries.KNOWN``.

Rule: ``docs/reference/known-limitations.md`` is exactly ``markdown()``; a test
(``suites/meta/test_known_page.py``) keeps it so, so a new or changed entry fails the tests
until the page is written again with the one command

    python -m fsdp_conformance.known.render docs/reference/known-limitations.md

The page has an index table (key, primary properties, model kind, torch versions) and then
one section per entry, in ``KNOWN``'s order: its key as the heading; the properties it
explains (``props``) and those that fail as a consequence in some cases (``also``); the
torch versions; the upstream issue; the model's kind and ``model.describe()``; the reason,
verbatim. Text is escaped only where Markdown would change it, and never inside a code
span: ``<`` becomes ``&lt;`` (GFM reads ``<schedule>`` as an HTML tag and hides it), a
backslash and every ``*`` are escaped, and so is a ``_`` beside a character that is not a
letter or digit (``__getstate__`` would turn bold); ``|`` in a table cell becomes ``\\|``;
the model's description is a code span (it holds regular expressions). Imports nothing that
``entries.py`` does not import already.
"""
from __future__ import annotations

import re
import sys
from collections import Counter

from .entries import KNOWN, KnownLimitation

COMMAND = "python -m fsdp_conformance.known.render docs/reference/known-limitations.md"
"""The one command that writes the page."""


def _cell(text: str) -> str:
    """A table cell: pipes escaped, no line breaks."""
    return " ".join(_prose(text).split()).replace("|", "\\|")


_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)


def _escape(text: str) -> str:
    text = text.replace("\\", "\\\\").replace("<", "&lt;").replace("*", "\\*")
    out = []
    for i, ch in enumerate(text):
        if ch == "_" and not (i > 0 and text[i - 1].isalnum()
                              and i + 1 < len(text) and text[i + 1].isalnum()):
            ch = "\\_"
        out.append(ch)
    return "".join(out)


def _prose(text: str) -> str:
    """``text`` with the characters Markdown would read escaped, code spans left as they
    are (module rule)."""
    out, last = [], 0
    for m in _CODE_SPAN.finditer(text):
        out += [_escape(text[last:m.start()]), m.group(0)]
        last = m.end()
    return "".join(out + [_escape(text[last:])])


def _code(text: str) -> str:
    """``text`` as one code span (a longer fence when it holds backticks)."""
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _props(entry: KnownLimitation) -> str:
    also = f"({'also ' if entry.props else 'only as a consequence: '}{', '.join(entry.also)})"
    return " ".join(filter(None, (", ".join(entry.props), also if entry.also else "")))


def _section(entry: KnownLimitation) -> str:
    model = entry.model
    lines = [f"## {entry.key}", "",
             f"- properties: {', '.join(entry.props) or 'none of its own'}"
             + (f"; also, as a consequence in some cases: {', '.join(entry.also)}"
                if entry.also else ""),
             f"- torch: {_prose(entry.torch_versions)}",
             f"- upstream: {_prose(entry.upstream)}",
             f"- model: {type(model).__name__}, {_code(model.describe())}",
             "", _prose(entry.reason), ""]
    return "\n".join(lines)


def markdown() -> str:
    """The page (module rule)."""
    kinds = Counter(type(k.model).__name__ for k in KNOWN)
    head = [
        "# Known torch limitations",
        "",
        f"<!-- Generated from fsdp_conformance/known/entries.py by `{COMMAND}`. "
        "Do not edit by hand. -->",
        "",
        f"Every entry of `fsdp_conformance/known/entries.py`: {len(KNOWN)} entries, "
        + ", ".join(f"{n} `{kind}`" for kind, n in sorted(kinds.items())) + ". "
        "Each is a model of its bug: a (case, property) is reported \"known\" only when the "
        "model explains all of what was observed; anything left over is a fail that names the "
        "entry. How the models are applied: "
        "[Known limitations as models of bugs](../explanation/known-limitations.md). What "
        "the suite found, with workarounds: "
        "[What the suite found in torch](../explanation/torch-findings.md).",
        "",
        "Columns: the entry's key, the properties it explains (and, in brackets, those that "
        "fail as a consequence in some cases), the kind of model, the torch versions it was "
        "seen on. A property written `P3:set_full` is one API path's verdict in the "
        "differential tests (`suites/differential`).",
        "",
        "| entry | properties | model | torch |",
        "|---|---|---|---|",
    ]
    rows = [f"| [{k.key}](#{_anchor(k.key)}) | {_cell(_props(k))} | "
            f"{type(k.model).__name__} | {_cell(k.torch_versions)} |" for k in KNOWN]
    return ("\n".join(head + rows) + "\n\n" + "\n".join(_section(k) for k in KNOWN)
            + "\n" + _scale_markdown())


def _scale_markdown() -> str:
    """The scale mode's entries (``known/scale.py``)."""
    from .scale import SCALE_KNOWN

    out = ["## At scale (`fsdp-conformance scale`)", "",
           f"Every entry of `fsdp_conformance/known/scale.py`: {len(SCALE_KNOWN)}. Each names "
           "the parameters it concerns from the model's shapes and what `fully_shard` raises "
           "for them; the scale check reports it \"known\" only when torch raises exactly so, "
           "then checks every other parameter with those left to the ranks. How: "
           "[Check a checkpoint at scale](../howto/check-at-scale.md).", ""]
    for e in SCALE_KNOWN:
        out += [f"### {e.key}", "", f"{_prose(e.title)}.", "",
                f"- evidence: {_prose(e.evidence)}",
                f"- upstream: {_prose(e.upstream)}",
                f"- model: raises {_code(e.raises)}",
                f"- the check goes on: {_prose(e.workaround)}", ""]
    return "\n".join(out)


def _anchor(key: str) -> str:
    """GitHub's anchor of a heading that is ``key``: lower case, characters other than
    letters, digits, ``-`` and ``_`` dropped."""
    return "".join(ch for ch in key.lower() if ch.isalnum() or ch in "-_")


def main(argv: list[str]) -> int:
    """``render [PATH]``: write the page to PATH (UTF-8), else to standard output."""
    text = markdown()
    if argv:
        with open(argv[0], "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.buffer.write(text.encode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
