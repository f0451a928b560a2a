"""``-k``: which case ids an expression selects, with pytest's meaning.

Rules
- The grammar is pytest's ``-k``: ``or`` binds loosest, then ``and``, then ``not``;
  parentheses group. A word matches a case id that contains it, ignoring case, as pytest
  matches test names.
- A word may hold any character but whitespace and parentheses: case ids have ``/``, ``:``,
  ``->`` and ``+``. (pytest's own parser, a private module, refuses ``>`` in a word, so this
  one is written here: a few lines of recursive descent.)
- Words side by side without an operator are joined by ``and`` (``-k "fsdp2 sched"``, as
  this command always read them).
- A word that is an API path's name (``paths``: ``fsdp2.sharded``, ``fsdp1.full``, ...)
  selects that path's cases: it matches the id's first part exactly, not the name of a
  golden fixture a case of another path loads (``fsdp1.sharded/.../golden:2.13.0/
  fsdp2.sharded-...``; select those by a word with the fixture's ``golden:`` prefix).
- ``unknown_words``: the words of an expression that no id contains (and close words of the
  ids for each: a typo gets "did you mean").
- A malformed expression is a ``ValueError`` naming it and what was expected, never a
  silent other selection.
"""
from __future__ import annotations

import difflib
import re
from typing import Callable, Iterable

_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_OPERATORS = ("and", "or", "not")

Match = Callable[[str], bool]


def compile_keyword(expr: str, paths: Iterable[str] = ()) -> Match:
    """A predicate on case ids for ``expr`` (module rules); ``paths``: the API paths' names,
    each a word that selects its own cases."""
    path_words = {p.lower() for p in paths}
    tokens: list[str] = []
    for tok in _TOKEN.findall(expr):  # side by side: insert "and"
        if tokens and (tokens[-1] not in _OPERATORS + ("(",)) and tok not in ("and", "or", ")"):
            tokens.append("and")
        tokens.append(tok)
    pos = 0

    def fail(what: str):
        got = repr(tokens[pos]) if pos < len(tokens) else "the end"
        raise ValueError(f"-k {expr!r} is not a valid expression (expected {what}, got {got}); "
                         f"write words of case ids joined by and / or / not, with "
                         f"parentheses, e.g. -k 'fsdp1.full or fsdp2.full'")

    def take(tok: str) -> bool:
        nonlocal pos
        if pos < len(tokens) and tokens[pos] == tok:
            pos += 1
            return True
        return False

    def either() -> Match:
        parts = [both()]
        while take("or"):
            parts.append(both())
        return parts[0] if len(parts) == 1 else (lambda i: any(p(i) for p in parts))

    def both() -> Match:
        parts = [negated()]
        while take("and"):
            parts.append(negated())
        return parts[0] if len(parts) == 1 else (lambda i: all(p(i) for p in parts))

    def negated() -> Match:
        if take("not"):
            inner = negated()
            return lambda i: not inner(i)
        return atom()

    def atom() -> Match:
        nonlocal pos
        if take("("):
            inner = either()
            if not take(")"):
                fail("')'")
            return inner
        if pos >= len(tokens) or tokens[pos] in _OPERATORS + (")",):
            fail("a word or '('")
        word = tokens[pos].lower()
        pos += 1
        if word in path_words:
            return lambda i: i.lower().split("/", 1)[0] == word
        return lambda i: word in i.lower()

    if not tokens:
        fail("a word")
    match = either()
    if pos != len(tokens):
        fail("and / or, or the end")
    return match


def words_of(expr: str) -> list[str]:
    """The words of ``expr`` (its operators and parentheses left out)."""
    return [t for t in _TOKEN.findall(expr) if t not in _OPERATORS + ("(", ")")]


def vocabulary(ids: Iterable[str]) -> set[str]:
    """What ids are made of: each part between ``/``, and each piece of a part between
    ``+``, ``@``, ``:`` and ``-`` (the words a person types to select)."""
    out: set[str] = set()
    for i in ids:
        for part in i.split("/"):
            out.add(part)
            out.update(w for w in re.split(r"[+@:\-]", part) if w)
    return out


def unknown_words(expr: str, ids: Iterable[str]) -> dict[str, list[str]]:
    """``{word: close words}`` for each word of ``expr`` that no id contains (module
    rules): up to three words of the ids' vocabulary closest to it."""
    ids = list(ids)
    low = [i.lower() for i in ids]
    missing = [w for w in words_of(expr) if not any(w.lower() in i for i in low)]
    if not missing:
        return {}
    vocab = sorted(vocabulary(ids))
    return {w: difflib.get_close_matches(w, vocab, n=3, cutoff=0.6) for w in missing}
