"""``fsdp-conformance inspect PATH``: what is in an optimizer checkpoint
(``entry.inspect_path``), shown for a person (``render``) or written as JSON.

Rules
-----
JSON (``--out PATH``, ``-`` for stdout): ``Summary.to_json()`` (schema
  ``fsdp-conformance/inspect/1``), every param whatever the limit, written atomically; an
  output path that is the input, or a directory, is refused. With ``--out -`` nothing
  else goes to stdout.
Exit codes: 0 the checkpoint was read (notes and warnings printed), 1 ``--strict`` and at
  least one warning, 2 usage error (unreadable input: the message names the file, the rank
  where there is one, and why; a refused output).
"""
from __future__ import annotations

import json
import os
import sys

from ..report.cli import UsageError as OutputError
from ..report.cli import check_outputs
from ..report.io import write_json_atomic
from ..reshard.errors import UsageError
from ..reshard.inputs import DEFAULT_PATTERN
from .entry import inspect_path
from .render import DEFAULT_LIMIT, render
from ..usage import add_out



def add_parser(sub) -> None:
    """Register ``inspect`` (module docstring)."""
    p = sub.add_parser(
        "inspect", help="summarise an optimizer checkpoint: params with and without state, "
                        "shapes, steps, param groups, layout, anything suspicious",
        description="Summarise the optimizer checkpoint at PATH: a torch.save'd optimizer dict "
                    "(or a trainer dict holding one), a directory of per-rank files, or a DCP "
                    "directory. Shows every param's state (names, shapes, dtypes, step), the "
                    "param groups and their hyperparameters, the world size and layout the "
                    "files imply, and findings (warnings first). Reads on CPU, no process "
                    "group. Exit codes: 0 read, 1 --strict and a warning, 2 usage error or "
                    "unreadable input.")
    p.add_argument("path", help="checkpoint file, per-rank directory or DCP directory")
    p.add_argument("--key", default=None,
                   help="dotted path to the optimizer dict when the input holds several "
                        "(e.g. optim, optimizers.0)")
    p.add_argument("--pattern", default=DEFAULT_PATTERN,
                   help=f"per-rank file names in a directory (default {DEFAULT_PATTERN})")
    p.add_argument("--unsafe-load", action="store_true",
                   help="read files torch.load(weights_only=True) refuses (FSDP1 "
                        "sharded_optim_state_dict files hold ShardedTensor) with a full "
                        "unpickler: runs code the file names, only for files you trust")
    p.add_argument("--values", action="store_true",
                   help="DCP: also read every tensor's values (checks for NaN/Inf); files are "
                        "always read whole")
    add_out(p, old=("--json",), help="also write the summary as JSON to PATH (atomically), "
                                     "or '-' for the JSON on stdout only")
    p.add_argument("--strict", action="store_true", help="exit 1 when there is any warning")
    p.add_argument("--all", action="store_true",
                   help=f"list every param (default: the first {DEFAULT_LIMIT} and a count)")


def _console():
    from rich.console import Console

    if sys.stdout.isatty():
        return Console()
    return Console(width=int(os.environ.get("COLUMNS") or 140), color_system=None)


def run(args) -> int:
    """``inspect`` without the error handling of :func:`main` (exit code 0 or 1)."""
    to_file = args.out not in (None, "-")
    outs = check_outputs([args.path], {"--out": args.out}) if to_file else {}
    summary = inspect_path(args.path, key=args.key, pattern=args.pattern,
                           unsafe_load=args.unsafe_load, values=args.values)
    if args.out == "-":
        sys.stdout.write(json.dumps(summary.to_json(), indent=2, default=str) + "\n")
    else:
        render(summary, _console(), limit=None if args.all else DEFAULT_LIMIT)
    if to_file:
        out = write_json_atomic(outs["--out"], summary.to_json())
        print(f"wrote {out}")
    if args.strict and summary.warnings:
        print(f"fsdp-conformance inspect: --strict: {len(summary.warnings)} warning(s): "
              + ", ".join(dict.fromkeys(f.code for f in summary.warnings)), file=sys.stderr)
        return 1
    return 0


def main(args) -> int:
    """Run ``inspect`` (module docstring); errors go to stderr with exit code 2."""
    try:
        return run(args)
    except (UsageError, OutputError) as e:
        print(f"fsdp-conformance inspect: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"fsdp-conformance inspect: error: {e.filename or args.path}: "
              f"{e.strerror or e}", file=sys.stderr)
        return 2
