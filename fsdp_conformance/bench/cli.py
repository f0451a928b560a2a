"""``fsdp-conformance bench NAME``: run a benchmark and write ``reports/bench-<name>.json``.
Exit codes: 0 ok, 1 a target was missed or a case failed, 2 usage error.

Options beyond ``--out``/``--quick`` (``--paths``, ``--sizes``, ``--world-sizes``,
``--repeats``) are passed to a benchmark only when given, and only to one whose ``main``
takes them; giving one to a benchmark that does not is a usage error naming both.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from typing import Callable


# benchmark name -> module with ``main(out: str, quick: bool, **options) -> int``
BENCHMARKS: dict[str, str] = {
    "harness": "fsdp_conformance.bench.harness",
    "reference": "fsdp_conformance.bench.reference",
    "scaling": "fsdp_conformance.bench.scaling",
}

# option dest -> its flag, for the messages
OPTIONS: dict[str, str] = {"paths": "--paths", "sizes": "--sizes",
                           "world_sizes": "--world-sizes", "repeats": "--repeats"}


def _csv(convert: Callable[[str], object], what: str) -> Callable[[str], list]:
    """An argparse type: a comma-separated list, each item through ``convert``; a bad item
    is an argparse error (exit 2) naming it and what was expected."""
    def parse(text: str) -> list:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}")
        out = []
        for t in items:
            try:
                out.append(convert(t))
            except ValueError:
                raise argparse.ArgumentTypeError(f"{t!r} is not {what}") from None
        return out
    return parse


def _whole(text: str) -> int:
    """"1e6" / "1000000" -> 1000000; ValueError for a fraction or a non-number."""
    x = float(text)
    if not x.is_integer():
        raise ValueError(text)
    return int(x)


def _world_sizes(text: str) -> list[int]:
    """The one --world-sizes rule (usage.parse_world_sizes), as an argparse type."""
    from ..usage import UsageError, parse_world_sizes

    try:
        return parse_world_sizes(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(sub) -> None:
    bench = sub.add_parser("bench", help="run a benchmark and write reports/bench-<name>.json")
    bench.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark")
    bench.add_argument("--out", default=None, help="JSON path (default reports/bench-<name>.json)")
    bench.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    bench.add_argument("--paths", type=_csv(str, "an API path"), default=None,
                       help="scaling: comma-separated API paths (default: all eight)")
    bench.add_argument("--sizes", type=_csv(_whole, "a whole number of state elements"),
                       default=None, help="scaling: optimizer state elements, e.g. 1e5,1e6")
    bench.add_argument("--world-sizes", type=_world_sizes, default=None,
                       help="scaling: world sizes, e.g. 1,2,4")
    bench.add_argument("--repeats", type=int, default=None,
                       help="scaling: timed calls per case and phase (default by size)")


def main(args) -> int:
    run = importlib.import_module(BENCHMARKS[args.name]).main
    accepted = inspect.signature(run).parameters
    options = {k: getattr(args, k, None) for k in OPTIONS}
    options = {k: v for k, v in options.items() if v is not None}
    refused = [OPTIONS[k] for k in options if k not in accepted]
    if refused:
        verb = "does" if len(refused) == 1 else "do"
        print(f"fsdp-conformance bench: error: {', '.join(refused)} {verb} not apply to "
              f"'bench {args.name}' (only to benchmarks that take them: scaling)",
              file=sys.stderr)
        return 2
    return run(out=args.out or f"reports/bench-{args.name}.json", quick=args.quick, **options)
