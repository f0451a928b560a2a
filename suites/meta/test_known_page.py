"""docs/reference/known-limitations.md is generated from known/entries.py
(known/render.py): a new or changed entry without the page written again fails here."""
from __future__ import annotations

from fsdp_conformance.known.render import COMMAND, markdown

from suites.conftest import ROOT

PAGE = ROOT / "docs" / "reference" / "known-limitations.md"


def test_known_limitations_page_is_the_rendered_entries():
    want = markdown()
    have = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
    if have != want:
        old, new = have.splitlines(), want.splitlines()
        n = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
        page_line = old[n] if n < len(old) else "<end>"
        want_line = new[n] if n < len(new) else "<end>"
        first = (f"first difference at line {n + 1}:\n  page:    {page_line}"
                 f"\n  entries: {want_line}")
        raise AssertionError(f"{PAGE.relative_to(ROOT)} is not what known/entries.py gives; "
                             f"write it again with:\n  {COMMAND}\n{first}")


def test_every_entry_has_a_section():
    from fsdp_conformance.known.entries import KNOWN

    text = markdown()
    for k in KNOWN:
        assert f"\n## {k.key}\n" in text
