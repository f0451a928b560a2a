"""``fsdp-conformance`` command line. Exit codes: 0 ok, 1 a check or target failed,
2 usage error."""
from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fsdp-conformance",
                                description="Conformance suite for optimizer-state "
                                            "checkpointing under PyTorch FSDP.")
    sub = p.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="run a benchmark and write reports/bench-<name>.json")
    bench.add_argument("name", choices=["harness"], help="which benchmark")
    bench.add_argument("--out", default=None, help="JSON path (default reports/bench-<name>.json)")
    bench.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "bench":
        if args.name == "harness":
            from .bench.harness import main as bench_harness

            return bench_harness(out=args.out or "reports/bench-harness.json", quick=args.quick)
    return 2


if __name__ == "__main__":
    sys.exit(main())
