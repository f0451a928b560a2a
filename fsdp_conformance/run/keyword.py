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
- A malformed expression is a ``ValueError`` naming it and what was expected, never a
  silent other selection.
"""
from __future__ import annotations

import re
from typing import Callable

_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_OPERATORS = ("and", "or", "not")

Match = Callable[[str], bool]


def compile_keyword(expr: str) -> Match:
    """A predicate on case ids for ``expr`` (module rules)."""
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
        return lambda i: word in i.lower()

    if not tokens:
        fail("a word")
    match = either()
    if pos != len(tokens):
        fail("and / or, or the end")
    return match
