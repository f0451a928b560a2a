"""``fsdp-conformance bench NAME``: run a benchmark and write ``reports/bench-<name>.json``.
Exit codes: 0 ok, 1 a target was missed, 2 usage error."""
from __future__ import annotations

import importlib

COMMANDS = ("bench",)

# benchmark name -> module with ``main(out: str, quick: bool) -> int``
BENCHMARKS: dict[str, str] = {
    "harness": "fsdp_conformance.bench.harness",
    "reference": "fsdp_conformance.bench.reference",
}


def add_parser(sub) -> None:
    bench = sub.add_parser("bench", help="run a benchmark and write reports/bench-<name>.json")
    bench.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark")
    bench.add_argument("--out", default=None, help="JSON path (default reports/bench-<name>.json)")
    bench.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")


def main(args) -> int:
    run = importlib.import_module(BENCHMARKS[args.name]).main
    return run(out=args.out or f"reports/bench-{args.name}.json", quick=args.quick)
