"""What every command line of the package shares: the one ``UsageError`` and the one
``--world-sizes`` parser. Imports nothing heavy (no torch).

Rules
- An error the user can act on names the problem: the file, and where they apply the rank,
  the param (FQN or optimizer key) and the state key, unless the message already says them
  (``NamedError``). ``exit_code`` is what a command returns for it.
- ``UsageError`` (exit code 2): bad arguments, an unreadable or missing input, an output that
  would overwrite something. Every command raises this one class.
- World sizes are comma-separated positive integers, deduplicated and sorted.
- What a command writes is named by ``--out`` and nothing else (``add_out``); the inputs it
  reads have names of their own (``--fixtures``, ``--calibration``).
"""
from __future__ import annotations

import argparse
import os
import sys


class NamedError(Exception):
    """An error that names where the problem is; ``exit_code`` is what the CLI returns."""

    exit_code = 1

    def __init__(self, message: str, *, path: str | os.PathLike | None = None,
                 rank: int | None = None, param: str | None = None, key: str | None = None):
        self.path = None if path is None else str(path)
        self.rank, self.param, self.key = rank, param, key
        where = [w for w, v in (("param", param), ("key", key)) if v is not None
                 and repr(v) not in message]
        where = [f"{w} {(param if w == 'param' else key)!r}" for w in where]
        if rank is not None and f"rank {rank}" not in message:
            where.append(f"rank {rank}")
        if where:
            message += f" (at {', '.join(where)})"
        super().__init__(f"{self.path}: {message}" if self.path else message)


class UsageError(NamedError, ValueError):
    """Bad arguments, an unreadable or missing input, or an output that would overwrite."""

    exit_code = 2


def parse_world_sizes(text: str, option: str = "--world-sizes") -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]`` (module rule); a UsageError naming ``option`` otherwise."""
    try:
        ws = sorted({int(x) for x in str(text).split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"{option} must be comma-separated integers, got {text!r}") from None
    if not ws or ws[0] < 1:
        raise UsageError(f"{option} must be positive, got {text!r}")
    return ws


class _OldName(argparse.Action):
    """An output option's earlier spelling: still accepted, with a note on stderr naming the
    one spelling (``--out``) that replaces it."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: note: {option_string} is an earlier spelling; outputs are "
              f"named by --out (see --help)", file=sys.stderr)
        setattr(namespace, self.dest, values)


REPORT_SUFFIXES = (".json", ".md", ".html")


def beside(path: str | os.PathLike, suffix: str) -> str:
    """``path`` with ``suffix`` in place of a report suffix (``.json``, ``.md``, ``.html``),
    or added after it: ``reports/cmp-2.13.0-to-2.15.0`` -> ``reports/cmp-2.13.0-to-2.15.0.md``
    (a dotted name keeps its dots)."""
    root, ext = os.path.splitext(str(path))
    return (root if ext in REPORT_SUFFIXES else str(path)) + suffix


def add_out(parser, *, help: str, default: str | None = None, required: bool = False,
            old: tuple[str, ...] = ()) -> None:
    """The one spelling of what a command writes: ``--out PATH`` (a file or a directory, as
    ``help`` says). ``old`` are earlier spellings that still work, hidden from ``--help``,
    with a note on stderr; they set the same ``args.out``."""
    parser.add_argument("--out", default=default, required=required, metavar="PATH", help=help)
    for name in old:
        add_old(parser, name, dest="out")


def add_old(parser, name: str, *, dest: str) -> None:
    """An earlier output option ``name`` that still sets ``args.<dest>``, hidden from
    ``--help``, with a note on stderr (module rules)."""
    parser.add_argument(name, dest=dest, action=_OldName, default=argparse.SUPPRESS,
                        metavar="PATH", help=argparse.SUPPRESS)
