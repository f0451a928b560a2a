"""``fsdp-conformance run``: the conformance run with a live progress bar, a summary
table and the report (JSON + Markdown, written atomically).

Rule: an interrupted run (Ctrl-C, SIGTERM: a CI job's time limit) still writes the report
of the cases decided so far, marked incomplete (``"incomplete"``: why, ``"planned_cases"``),
before it exits.

Two verdicts, apart: correctness (every property but P13/P14: what torch computes) and
bounds (P13 time and P14 memory, judged against a calibration scaled by this machine's
speed measured in the same run; bounds/rules.py). ``--bounds`` says what the bounds verdict
does: ``gate`` (default) fails the run with exit 3 when only the bounds fail;
``advisory`` reports them and exits 0 on correctness alone; ``off`` runs no bounds case.

Exit codes: 0 correctness holds and the bounds hold (or are advisory/off); 1 correctness
failed (a (case, property) verdict fails or errors); 3 correctness holds and a bound failed
(``--bounds gate``); 2 usage errors (bad world sizes, a backend the machine cannot run, a
selection that matches no case); 130 interrupted by Ctrl-C, 143 by SIGTERM (the partial
report is written either way).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from ..usage import add_old, add_out, beside
from ..options import DEFAULT_TIMEOUT_S, RunOptions


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run the conformance suite and write reports/latest.{json,md}",
                       description=__doc__.split("\n\n", 1)[1] + "\nExample:\n  "
                       "fsdp-conformance run -k fsdp2.sharded --world-sizes 1,2 --bounds advisory",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tier", choices=["quick", "full"], default="quick",
                   help="quick: minutes on 2 cores (default); full: the whole matrix")
    p.add_argument("--backend", choices=["gloo", "nccl"], default=None,
                   help="default: gloo on CPU (nccl needs one GPU per rank)")
    p.add_argument("--world-sizes", default=None,
                   help="comma-separated, e.g. 1,2,3,4 (default: what the machine can hold)")
    p.add_argument("-k", dest="keyword", default=None, metavar="EXPR",
                   help="only the cases this expression selects, as pytest's -k: words of "
                        "case ids (a word matches an id that contains it, ignoring case) "
                        "with and / or / not and parentheses; words side by side are "
                        "joined by and, e.g. -k 'fsdp1.full or fsdp2.full', "
                        "-k 'sched and not fsdp1'; a path's name selects that path's cases "
                        "only")
    p.add_argument("--case", dest="case_ids", action="append", default=None, metavar="ID",
                   help="exactly the case of this id, whichever tier has it (repeatable; "
                        "ids as --list and the reports print them): what a report's rerun "
                        "line uses")
    add_out(p, default="reports/latest.json", old=("--json",),
            help="the JSON report; the Markdown (.md) and the HTML page (.html) go beside it "
                 "(default reports/latest.json)")
    add_old(p, "--md", dest="md")  # earlier: the Markdown at a path of its own
    p.add_argument("--seed", type=int, default=0, help="seed of every case (default 0)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help="seconds a save or load may take on the ranks before it is a hang "
                        "(a bad-input case's load: a quarter of it, at least 30, at most all "
                        "of it)")
    p.add_argument("--lanes", type=int, default=None, metavar="N",
                   help="cases run side by side on N lanes, each with pools of its own "
                        "(default with gloo: one per two cores, 2 to 4 as the memory holds, "
                        "1 on one core; bounds cases always run alone; a bigger machine or a "
                        "job matrix: --shard)")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="run part I of N of the selection (a CI job matrix: cases that share "
                        "a save, and each path's bounds cases, stay together; the parts are a "
                        "function of the case ids alone); `fsdp-conformance merge` joins the "
                        "parts' reports")
    p.add_argument("--list", action="store_true", help="list the selected case ids and exit")
    p.add_argument("-x", "--exitfirst", dest="maxfail", action="store_const", const=1,
                   help="stop at the first failing case (as --maxfail 1)")
    p.add_argument("--maxfail", dest="maxfail", type=int, default=None, metavar="N",
                   help="stop after N failing cases; the report holds what was decided and "
                        "says it stopped early (exit 1)")
    p.add_argument("--lf", "--last-failed", dest="last_failed", action="store_true",
                   help="run only the cases that failed or errored in the last report at "
                        "--out (all of the selection when it has none, as pytest does)")
    p.add_argument("-v", "--verbose", dest="verbosity", action="count", default=0,
                   help="a line per case as it is decided (PASS / KNOWN / FAIL and its id)")
    p.add_argument("-q", "--quiet", dest="quiet", action="store_true",
                   help="no matrix: the verdict line, the failures' ids and the report's "
                        "paths")
    p.add_argument("--junit-xml", default=None, metavar="PATH",
                   help="also write the report as JUnit XML (a testcase per case) for CI")
    p.add_argument("--bounds", choices=["gate", "advisory", "off"], default="gate",
                   help="what the timing/memory bounds (P13/P14) do: gate (default: a bound "
                        "over fails the run with exit 3 when correctness holds), advisory "
                        "(reported, exit status from correctness alone), off (no bounds case)")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="bounds calibration file (default: this machine's own, written by "
                        "`fsdp-conformance bounds calibrate`, else the packaged one)")
    p.add_argument("--fixtures", default=None, metavar="DIR",
                   help="golden fixtures root for P12: every <DIR>/<torch version>/ is loaded "
                        "(default: the fixtures the package ships)")


def _world_sizes(arg: str | None, backend: str) -> list[int]:
    if arg is None:
        if backend == "nccl":
            import torch

            return [w for w in (1, 2, 3, 4) if w <= torch.cuda.device_count()]
        return [1, 2, 3, 4]
    from ..usage import UsageError, parse_world_sizes

    try:
        return parse_world_sizes(arg)
    except UsageError as exc:
        raise SystemExit(_usage(str(exc))) from None


def command_line() -> list[str]:
    """The command as the user typed it: ``fsdp-conformance`` (or ``python -m
    fsdp_conformance``, which ``python -m fsdp_conformance.cli`` is too: the gate's steps)
    and every argument, the subcommand included."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else "fsdp-conformance"
    prog = os.path.basename(argv0)
    own = os.path.basename(os.path.dirname(argv0)) == "fsdp_conformance"
    if prog in ("__main__.py", "-m") or prog.startswith("python") or (own and prog == "cli.py"):
        prog = "python -m fsdp_conformance"
    return [prog, *sys.argv[1:]]


def _last_failed(path: str) -> tuple[str, ...]:
    """The ids of the cases that failed or errored in the report at ``path`` (``--lf``); none
    when there is no report there yet. A file there that is no run report: ValueError."""
    from ..report.run_report import ReportFormatError, failing_ids, load_report

    if not os.path.exists(path):
        return ()
    try:
        return failing_ids(load_report(path))
    except ReportFormatError as exc:
        raise ValueError(f"--lf reads the last report at --out: {exc}") from None


def _usage(msg: str) -> int:
    print(f"fsdp-conformance run: error: {msg}", file=sys.stderr)
    return 2


def main(args: argparse.Namespace) -> int:
    import dataclasses

    import torch
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    from . import matrix
    from ..harness import close_pools
    from ..properties.precision import TOLERANCES
    from ..report.run_report import build_report, exit_code, render_table, write_run_report
    from .execute import RunInterrupted, run_all

    backend = args.backend or "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        return _usage("--backend nccl needs CUDA GPUs; this machine has none")
    try:
        world_sizes = _world_sizes(args.world_sizes, backend)
    except SystemExit as exc:
        return int(exc.code)
    if not world_sizes:
        return _usage("no world size fits this machine")
    if args.lanes is not None and args.lanes < 1:
        return _usage(f"--lanes must be at least 1, got {args.lanes}")
    if args.maxfail is not None and args.maxfail < 1:
        return _usage(f"--maxfail must be at least 1, got {args.maxfail}")
    last: tuple[str, ...] = ()
    if args.last_failed:
        try:
            last = _last_failed(args.out)
        except ValueError as exc:
            return _usage(str(exc))
    options = RunOptions(backend=backend, timeout=args.timeout,
                         calibration=args.calibration, lanes=args.lanes)
    from ..golden.manifest import FixtureError

    try:
        tier_cases = matrix.TIERS[args.tier](matrix.default_paths(), fixtures=args.fixtures)
    except FixtureError as exc:
        return _usage(f"--fixtures: {exc}")
    ids = tuple(args.case_ids or ())
    if ids and args.keyword:
        return _usage("--case selects exact ids and -k by words: give one of them")
    seen = {c.id for c in tier_cases}
    if ids and not seen >= set(ids):  # an id is one case, whichever tier has it
        other = "full" if args.tier == "quick" else "quick"
        tier_cases = list(tier_cases) + [
            c for c in matrix.TIERS[other](matrix.default_paths(), fixtures=args.fixtures)
            if c.id not in seen]
    try:
        cases = matrix.select(tier_cases, world_sizes=world_sizes, keyword=args.keyword,
                              ids=ids)
    except ValueError as exc:
        return _usage(str(exc))
    if args.bounds == "off":
        cases = [c for c in cases if not c.bounds]
    if args.seed:
        cases = [dataclasses.replace(c, seed=args.seed) for c in cases]
    part = None
    if args.last_failed:  # the selection's cases that failed last time (pytest: all if none)
        again = [c for c in cases if c.id in set(last)]
        print(f"--lf: {len(again)} case(s) that failed in {args.out}" if again else
              f"--lf: no case of this selection failed in {args.out} (or no report there): "
              f"running all of it", file=sys.stderr)
        cases = again or cases
    if args.shard is not None and cases:
        from .shards import parse_shard, shard

        try:
            part = parse_shard(args.shard)
            cases = shard(cases, *part)
        except ValueError as exc:
            return _usage(str(exc))
    if not cases:
        return _usage(matrix.no_match(tier_cases, args.tier, world_sizes=world_sizes,
                                      keyword=args.keyword, ids=ids)
                      + ("; --bounds off leaves out the bounds cases"
                         if args.bounds == "off" and ids else ""))
    if args.list:
        for c in cases:
            print(c.id)
        return 0
    console = Console(stderr=True)
    every = max(1, int(os.environ.get("FSDPC_PROGRESS_EVERY", "25")))  # log lines (CI)
    failed = 0
    t0 = time.perf_counter()
    progress = Progress(TextColumn("[bold]conformance[/]"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[fails]}"), TimeElapsedColumn(),
                        TextColumn("ETA"), TimeRemainingColumn(), console=console,
                        transient=False, disable=not console.is_terminal and
                        os.environ.get("FSDPC_PROGRESS") != "1")
    with progress:
        task = progress.add_task("run", total=len(cases), fails="failures: 0")

        def on_result(r) -> None:
            nonlocal failed
            bad = any(v.status in ("fail", "error") for v in r.properties.values())
            if bad:
                failed += 1
                if not progress.disable:
                    progress.console.print(f"[red]FAIL[/] {r.case.id}")
            if args.verbosity and (progress.disable or not bad):
                word = "FAIL" if bad else "KNOWN" if any(
                    v.status == "known" for v in r.properties.values()) else "PASS"
                print(f"{word} {r.case.id}", file=sys.stderr, flush=True)
            progress.update(task, advance=1, fails=f"failures: {failed}")
            done = progress.tasks[0].completed
            if progress.disable and (done % every == 0 or done == len(cases)):
                print(f"[{done:.0f}/{len(cases)}] failing cases: {failed}, "
                      f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
            if args.maxfail is not None and failed >= args.maxfail and done < len(cases):
                raise RunInterrupted(f"stopped after {failed} failing case(s) (--maxfail "
                                     f"{args.maxfail})")

        def on_sigterm(signum, frame) -> None:
            raise RunInterrupted("interrupted (SIGTERM)")

        previous = signal.signal(signal.SIGTERM, on_sigterm)
        try:
            run = run_all(cases, options, on_result=on_result)
        finally:
            signal.signal(signal.SIGTERM, previous)
            close_pools()
    wall = time.perf_counter() - t0
    report = build_report(run.results, tier=args.tier, backend=options.backend, seed=args.seed,
                          world_sizes=world_sizes, wall_time_s=wall,
                          argv=command_line(), selection=args.keyword,
                          selected_ids=[c.id for c in cases] if part else ids,
                          tolerances={k: {"rtol": r, "atol": a} for k, (r, a) in TOLERANCES.items()},
                          scaling=run.scaling, incomplete=run.interrupted, planned=run.planned,
                          calibration=options.calibration,
                          bounds_mode=args.bounds)
    if part:  # report/merge.py joins the parts
        report["shard"] = {"index": part[0], "count": part[1], "case_ids": list(ids)}
    md = getattr(args, "md", None) or beside(args.out, ".md")
    write_run_report(report, args.out, md)
    from ..report.html import render_html
    from ..report.io import write_text_atomic

    html = beside(args.out, ".html")  # the page a person looks at
    write_text_atomic(html, render_html(report))
    if args.junit_xml:
        from ..report.junit import to_junit

        write_text_atomic(args.junit_xml, to_junit(report))
    if args.quiet:
        from ..report.run_report import failing_ids, headline

        print(headline(report))
        for cid in failing_ids(report):
            print(f"FAIL {cid}")
    else:  # a log (CI) is not a terminal: rich would wrap the matrix at 80 columns
        render_table(report, Console() if sys.stdout.isatty() else Console(width=200))
    reuse = [f"{run.shared_saves} loaded a shared save"] if run.shared_saves else []
    reuse += [f"{run.reused_trainings} saved a shared training"] if run.reused_trainings else []
    shared = f" ({', '.join(reuse)})" if reuse else ""
    print(f"{len(run.results)} cases in {wall:.0f} s{shared}; report: {args.out}, {md}, "
          f"{html}" + (f", {args.junit_xml}" if args.junit_xml else ""))
    if run.interrupted and "--maxfail" in run.interrupted:
        print(f"STOPPED: {run.interrupted}; the report holds the cases decided so far",
              file=sys.stderr)
        return 1
    if run.interrupted:
        print(f"INCOMPLETE: {run.interrupted}; the report holds the cases decided so far",
              file=sys.stderr)
        return 143 if "SIGTERM" in run.interrupted else 130
    return exit_code(report)
