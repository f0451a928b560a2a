"""``fsdp-conformance bench harness|reference|scaling``: run a benchmark and write
``reports/bench-<name>.json``. Exit codes: 0 ok, 1 a target was missed or a case failed,
2 usage error.

Each benchmark is its own subcommand with its own options (``SCALING_OPTIONS`` only on
``scaling``), so ``bench scaling --help`` shows what scaling takes.
"""
from __future__ import annotations

import argparse
import importlib
import textwrap
import sys
from typing import Callable


# benchmark name -> module with ``main(out: str, quick: bool, **options) -> int``
BENCHMARKS: dict[str, str] = {
    "harness": "fsdp_conformance.bench.harness",
    "reference": "fsdp_conformance.bench.reference",
    "scaling": "fsdp_conformance.bench.scaling",
}

# what each benchmark measures (its subcommand's help and description)
ABOUT = {
    "harness": "what a call on a live rank pool costs against spawning ranks per call",
    "reference": "what the reference implementation's gather and reshard cost against "
                 "copying the same bytes",
    "scaling": "time and peak memory of every API path's save and load over state sizes "
               "and world sizes, with plots (reports/bench-scaling-*.png) and an HTML page",
}
# the options only the scaling benchmark takes: dest -> flag
SCALING_OPTIONS: dict[str, str] = {"paths": "--paths", "sizes": "--sizes",
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
    bench = sub.add_parser("bench", help="run a benchmark and write reports/bench-<name>.json",
                           description=__doc__.split("\n\n")[0].replace("``", ""))
    names = bench.add_subparsers(dest="name", required=True, metavar="BENCHMARK")
    for name in sorted(BENCHMARKS):
        b = names.add_parser(
            name, help=ABOUT[name], formatter_class=argparse.RawDescriptionHelpFormatter,
            description=textwrap.fill(f"{ABOUT[name]}. Exit codes: 0 ok, 1 a target was "
                                      f"missed or a case failed, 2 usage error.", 88),
            epilog=f"example: fsdp-conformance bench {name} --quick" + (
                " --paths fsdp1.full,fsdp2.sharded --sizes 1e5,1e6 --world-sizes 1,2,4"
                if name == "scaling" else ""))
        b.add_argument("--out", default=None,
                       help=f"JSON path (default reports/bench-{name}.json)")
        b.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
        if name != "scaling":
            continue
        b.add_argument("--paths", type=_csv(str, "an API path"), default=None,
                       help="comma-separated API paths (default: every path)")
        b.add_argument("--sizes", type=_csv(_whole, "a whole number of state elements"),
                       default=None, help="optimizer state elements, e.g. 1e5,1e6")
        b.add_argument("--world-sizes", type=_world_sizes, default=None,
                       help="world sizes, e.g. 1,2,4")
        b.add_argument("--repeats", type=int, default=None,
                       help="timed calls per case and phase (default: by size)")


def main(args) -> int:
    run = importlib.import_module(BENCHMARKS[args.name]).main
    options = {k: getattr(args, k) for k in SCALING_OPTIONS
               if getattr(args, k, None) is not None}
    return run(out=args.out or f"reports/bench-{args.name}.json", quick=args.quick, **options)
