"""``fsdp-conformance`` command line: one table of commands. Exit codes: 0 ok, 1 a check
or target failed, 2 usage error (``usage.UsageError``).

Rule: each command is one module with ``add_parser(sub)`` (registers the command's parser)
and ``main(args) -> int`` (runs it); ``COMMANDS`` maps the command name to its module, and
a module that registers several commands (``report``, ``compare``) appears once per name.
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS: dict[str, str] = {
    "run": "run.cli",
    "gate": "gate.upgrade",
    "fixtures": "run.fixtures_cli",
    "report": "report.cli",
    "compare": "report.cli",
    "merge": "report.cli",
    "bench": "bench.cli",
    "inspect": "inspection.cli",
    "bounds": "run.bounds_cli",
    "reshard": "reshard.cli",
    "scale": "scale.cli",
}


def _seen() -> str:
    """The torch and Python this command runs with (read from the installed packages'
    metadata: without importing torch)."""
    import platform
    from importlib import metadata

    try:
        torch = f"torch {metadata.version('torch')}"
    except metadata.PackageNotFoundError:
        torch = "no torch installed"
    return f"{torch}, Python {platform.python_version()}, {sys.executable}"


def _module(name: str):
    return importlib.import_module(f"fsdp_conformance.{name}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fsdp-conformance",
                                description="Conformance suite for optimizer-state "
                                            "checkpointing under PyTorch FSDP.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    from . import __version__

    p.add_argument("--version", action="version", version=f"%(prog)s {__version__} "
                   f"({_seen()})")
    sub = p.add_subparsers(dest="command", required=True)
    for name in dict.fromkeys(COMMANDS.values()):  # each module once, in table order
        _module(name).add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return _module(COMMANDS[args.command]).main(args)


if __name__ == "__main__":
    sys.exit(main())
