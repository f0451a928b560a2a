"""``fsdp-conformance gate``: is it safe to upgrade torch? One command that answers with an
exit code.

Steps (each one a subprocess with its own log file and time limit):
1. environments: the baseline is this interpreter's torch unless ``--baseline`` names
   another; the candidate (and a named baseline) get their own virtual environment, built
   by the set-up script the package ships (``gate/setup_env.sh``, which a clone's
   ``scripts/setup-env`` runs too: torch first, then this package, from the clone or, for
   an installed package, its own files), kept under ``--venvs`` (relative to the current
   directory) and reused while its torch spec and the package are unchanged;
2. the baseline writes fresh golden fixtures (``fixtures generate``) into the gate's
   directory, and so does the candidate when its torch release differs (``<dir>/<torch
   version>/`` each);
3. baseline and candidate each run the conformance run (same tier, selection and seed) with
   those fixtures as their P12 fixtures, so both reports hold the same cases: the candidate
   loads what the baseline wrote (the upgrade) and the baseline what the candidate wrote (a
   rollback after a failed upgrade), each beside its own; the gate's report counts both
   directions (``fixture_directions``). The upgrade comparison (step 5) leaves out the
   candidate's fixtures (``upgrade_view``: no before/after pair there); a candidate's
   checkpoint the baseline fails to load, unexplained by a known limitation, is a rollback
   failure (``rollback_failures``): listed, and the gate exits 1; one a known limitation
   explains (``rollback_known``: torch 2.13 cannot read the metadata 2.15 writes) is no
   excuse for the person deciding the upgrade: the verdict starts "NO ROLLBACK: ..." naming
   the entries and counts, and the gate exits 1 unless ``--allow-no-rollback``;
4. both run the scaling benchmark (``--bench quick`` by default, ``full`` or ``none``);
5. ``compare`` of the two run reports and of the two benchmark reports, with the gate's
   thresholds; timings and peaks flagged slower or bigger (benchmarks, and the bounds
   cases' measurements in the run reports) are measured again on both sides and stay
   regressions only if they reproduce (``recheck``); verdict regressions stand as they
   are; the gate's exit code is 1 when either comparison keeps a regression;
6. paths whose torch API the candidate removed (run/removal.py) are reported on their own:
   "API REMOVED: 4 paths (...)", with the fixtures only those paths read. They fail the
   gate (exit 1) unless ``--allow-removed``; never as a regression per verdict.

Rules
- The gate never writes outside its own new directory (``--out``, which must not exist),
  except the environments under ``--venvs``.
- A step that fails to produce its report stops the gate with exit code 2 and names the
  step and its log; a step that produces its report but exits 1 (failures found) or, for
  a run, 3 (correctness held, a timing or memory bound did not) goes on: failures are what
  ``compare`` classifies.
- Every step has a time limit; a step past it is killed and the gate stops (exit 2).
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..report.io import write_json_atomic, write_text_atomic

SETUP_ENV = Path(__file__).resolve().parent / "setup_env.sh"
"""Builds an environment per torch (shipped with the package, so the gate needs no clone;
scripts/setup-env runs the same file)."""
_SPEC = re.compile(r"^torch(==|>=|<=|~=)?[0-9][0-9A-Za-z.+\-]*$")


class GateError(RuntimeError):
    """The gate could not reach a verdict (a step failed to run); exit code 2."""


@dataclass(frozen=True)
class Side:
    """One torch under test: its pip spec (None: this interpreter) and its python."""

    name: str  # "baseline" | "candidate"
    spec: str | None
    python: str


@dataclass(frozen=True)
class GateConfig:
    """What to gate. A side given as a ``*_python`` interpreter is used as it is (no
    environment is built for it); the baseline defaults to this interpreter."""

    candidate: str | None = None
    baseline: str | None = None
    candidate_python: str | None = None
    baseline_python: str | None = None
    out: Path = Path("reports/gate")
    venvs: Path = Path(".gate-venvs")
    tier: str = "quick"
    keyword: str | None = None
    world_sizes: str | None = None
    bench: str = "quick"  # quick | full | none
    max_slowdown: float = 1.5
    max_memory_growth: float = 1.2
    step_timeout: float = 3 * 3600.0
    allow_removed: bool = False
    """Accept paths whose API the candidate's torch removed (still listed)."""
    allow_no_rollback: bool = False
    """Pass although the baseline cannot load checkpoints the candidate writes, by known
    torch limitations (still the headline)."""
    run_args: tuple[str, ...] = field(default_factory=tuple)


def check_spec(spec: str) -> str:
    """A torch requirement the gate can build: ``torch==X.Y.Z`` (or another comparison)."""
    s = spec.replace(" ", "")
    if not _SPEC.match(s):
        raise ValueError(f"a torch spec looks like 'torch==2.15.0', got {spec!r}")
    return s


def venv_dir(venvs: Path, spec: str) -> Path:
    """Where the environment for ``spec`` lives: one directory per spec."""
    return venvs / re.sub(r"[^0-9A-Za-z.]+", "-", spec).strip("-")


def _log(msg: str) -> None:
    print(f"[gate {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_step(name: str, argv: Sequence[str], log: Path, *, timeout: float,
             env: dict | None = None, ok_codes: Sequence[int] = (0,)) -> int:
    """Run one step, its output into ``log``; return its exit code. Exit codes outside
    ``ok_codes`` (and a timeout) raise :class:`GateError` naming the step and the log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    _log(f"{name}: {shlex.join(argv)}  (log: {log})")
    t0 = time.monotonic()
    with open(log, "w") as f:  # the command as the record keeps it (_portable)
        f.write(f"$ {shlex.join([_portable(a) if os.path.isabs(a) else a for a in argv])}\n")
        f.flush()
        proc = subprocess.Popen(list(argv), stdout=f, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {}), "FSDPC_PROGRESS": "0"},
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            raise GateError(f"step {name!r} ran past its limit of {timeout:.0f} s and was "
                            f"killed; its output is in {log}") from None
    _log(f"{name}: exit {rc} after {time.monotonic() - t0:.0f} s")
    if rc not in ok_codes:
        tail = "".join(log.read_text(errors="replace").splitlines(True)[-15:])
        raise GateError(f"step {name!r} exited {rc} (expected {list(ok_codes)}); "
                        f"last lines of {log}:\n{tail}")
    return rc


def ensure_env(spec: str, venvs: Path, logs: Path, timeout: float) -> str:
    """Build (or reuse) the environment for ``spec`` with ``SETUP_ENV``; its python."""
    d = venv_dir(venvs, spec)
    log = logs / f"setup-{d.name}.log"
    try:
        run_step(f"environment {spec}", ["bash", str(SETUP_ENV), str(d)], log, timeout=timeout,
                 env={"TORCH_SPEC": spec})
    except GateError as e:
        text = log.read_text(errors="replace") if log.exists() else ""
        if "(constraint)" in text:
            raise GateError(f"pip refused {spec} because of a pip constraint on this machine "
                            f"(see the 'constraint' lines in {log}); lift the constraint (on "
                            f"this machine kind: rm -r /etc/xdg/pip) and run the gate again") from e
        raise
    return str(d / "bin" / "python")


def torch_version(python: str) -> str:
    out = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise GateError(f"{python} cannot import torch:\n{out.stderr[-2000:]}")
    return out.stdout.strip()


def _cli(python: str, *args: str) -> list[str]:
    return [python, "-m", "fsdp_conformance.cli", *args]


def gate(cfg: GateConfig) -> int:
    """Run every step (module docstring); return the exit code (0 safe, 1 regression)."""
    out = Path(cfg.out)
    if out.exists():
        raise GateError(f"{out} exists: the gate writes a new directory and never over an "
                        f"earlier gate's results; pass another --out")
    out.mkdir(parents=True)
    logs = out / "logs"
    t0 = time.monotonic()
    def python(spec: str | None, given: str | None) -> str:
        if given:
            return given
        return ensure_env(spec, cfg.venvs, logs, cfg.step_timeout) if spec else sys.executable

    if not (cfg.candidate or cfg.candidate_python):
        raise GateError("name the candidate: a torch spec (--candidate) or an interpreter "
                        "that has it (--candidate-python)")
    sides = [Side("baseline", cfg.baseline, python(cfg.baseline, cfg.baseline_python)),
             Side("candidate", cfg.candidate, python(cfg.candidate, cfg.candidate_python))]
    versions = {s.name: torch_version(s.python) for s in sides}
    _log(f"baseline torch {versions['baseline']}, candidate torch {versions['candidate']}")
    fixtures = out / "fixtures"
    writers = sides if release(versions["candidate"]) != release(versions["baseline"]) \
        else sides[:1]  # one torch release writes one <version>/ directory
    for s in writers:
        run_step(f"{s.name}: fixtures generate", _cli(s.python, "fixtures", "generate",
                                                      "--out", str(fixtures)),
                 logs / f"{s.name}-fixtures.log", timeout=cfg.step_timeout)
    select = ["--tier", cfg.tier, "--fixtures", str(fixtures), *cfg.run_args]
    if cfg.keyword:
        select += ["-k", cfg.keyword]
    if cfg.world_sizes:
        select += ["--world-sizes", cfg.world_sizes]
    codes = {}
    for s in sides:
        codes[f"{s.name} run"] = run_step(
            f"{s.name}: conformance run", _cli(s.python, "run", *select, "--out",
                                               str(out / s.name / "run.json")),
            logs / f"{s.name}-run.log", timeout=cfg.step_timeout, ok_codes=(0, 1, 3))
        if cfg.bench != "none":
            bench = ["--quick"] if cfg.bench == "quick" else []
            codes[f"{s.name} bench"] = run_step(
                f"{s.name}: scaling benchmark", _cli(s.python, "bench", "scaling", *bench,
                                                     "--out", str(out / s.name / "bench.json")),
                logs / f"{s.name}-bench.log", timeout=cfg.step_timeout, ok_codes=(0, 1))
    thresholds = ["--max-slowdown", str(cfg.max_slowdown),
                  "--max-memory-growth", str(cfg.max_memory_growth)]
    kinds = ["run"] + (["bench"] if cfg.bench != "none" else [])
    # the upgrade comparison leaves out the fixtures the candidate wrote: the baseline reads
    # them as a rollback, the candidate as its own files, which is no before/after pair
    # (both directions are tabled in gate.md; a rollback that fails is reported below)
    cand_release = release(versions["candidate"]) if len(writers) == 2 else None
    compared = {s.name: upgrade_view(out / s.name / "run.json", cand_release) for s in sides}
    rollback = rollback_failures(out / "baseline" / "run.json", cand_release)
    no_rollback = rollback_known(out / "baseline" / "run.json", cand_release)
    verdicts = {}
    for kind in kinds:
        base_rep, cand_rep = ((compared["baseline"], compared["candidate"]) if kind == "run"
                              else (out / "baseline" / f"{kind}.json",
                                    out / "candidate" / f"{kind}.json"))
        verdicts[kind] = run_step(
            f"compare {kind} reports",
            _cli(sys.executable, "compare", str(base_rep), str(cand_rep), *thresholds,
                 "--out", str(out / f"compare-{kind}.json"),
                 "--allow-removed"),
            logs / f"compare-{kind}.log", timeout=600, ok_codes=(0, 1))
    removed = _removed(out / "compare-run.json")
    rechecks = {}
    for kind in kinds:
        if verdicts[kind]:
            rechecks[kind] = recheck(kind, cfg, out, sides, thresholds, logs)
            verdicts[kind] = 1 if rechecks[kind]["confirmed"] or rechecks[kind]["other"] else 0
    regressed = any(verdicts.values())
    rc = 1 if (regressed or rollback or (removed["paths"] and not cfg.allow_removed)
               or (no_rollback and not cfg.allow_no_rollback)) else 0
    verdict = "regression" if regressed else "no regression"
    if rollback:
        verdict += (f"; rollback: {len(rollback)} checkpoint(s) the candidate wrote do not load "
                    f"in the baseline")
    if no_rollback:  # the headline: the person deciding the upgrade must see it first
        n = sum(len(v) for v in no_rollback.values())
        verdict = (f"NO ROLLBACK: torch {versions['baseline']} cannot load {n} checkpoint(s) "
                   f"torch {versions['candidate']} writes (known torch limitation"
                   f"{'s' if len(no_rollback) > 1 else ''} {', '.join(sorted(no_rollback))}): "
                   f"after this upgrade, going back loses them"
                   + (" (accepted: --allow-no-rollback)" if cfg.allow_no_rollback else "")
                   + f"; {verdict}")
    if removed["paths"]:
        verdict = (f"API removed: {len(removed['paths'])} paths "
                   f"({', '.join(removed['paths'])}); {verdict}")
    summary = {
        "schema": "fsdp-conformance/gate/1",
        **{s.name: {"spec": s.spec, "python": _portable(s.python), "torch": versions[s.name]}
           for s in sides},
        "tier": cfg.tier, "bench": cfg.bench,
        "thresholds": {"max_slowdown": cfg.max_slowdown, "max_memory_growth": cfg.max_memory_growth},
        "step_exit_codes": codes,
        "compare_exit_codes": verdicts,
        "rechecks": rechecks,
        "api_removed": removed["paths"],
        "rollback_failures": rollback,
        "rollback_known": no_rollback,
        "allow_no_rollback": cfg.allow_no_rollback,
        "removed_fixtures": removed["fixtures"],
        "allow_removed": cfg.allow_removed,
        "verdict": verdict,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    write_json_atomic(out / "gate.json", summary)
    md = [f"# Gate: torch {versions['baseline']} -> {versions['candidate']}", "",
          f"**{_headline(summary['verdict'])}** (tier {cfg.tier}, bench {cfg.bench}, "
          f"{summary['wall_s']:.0f} s)", "", "## The two runs", ""]
    md += [run_line(s.name, out / s.name / "run.json") for s in sides] + [""]
    md += ["## Golden fixtures, both directions", "",
           fixture_directions({s.name: out / s.name / "run.json" for s in sides}), "",
           "The comparison below leaves out the fixtures the candidate wrote (the baseline "
           "reads them as a rollback, the candidate as its own files: no before/after pair)."
           if cand_release else "", ""]
    if no_rollback:
        md += ["Rollback broken by known torch limitations (the candidate's checkpoints the "
               "baseline cannot load, exactly as the entry models; a rollback after the "
               "upgrade loses them):", ""]
        for key, cases in sorted(no_rollback.items()):
            md += [f"- {key}: {len(cases)} checkpoint(s), e.g. `{cases[0]}`"]
        md += [""]
    if rollback:
        md += ["Rollback failures (the candidate's checkpoints the baseline cannot load, "
               "and no known limitation explains):", ""]
        md += [f"- `{r['case']}`: {r['status']}: {r['detail'].splitlines()[0] if r['detail'] else ''}"
               for r in rollback] + [""]
    for kind in kinds:
        cmp_md = out / f"compare-{kind}.md"
        md += [f"## Comparison of the {kind} reports", "",
               demote(cmp_md.read_text()) if cmp_md.exists() else "(no comparison written)", ""]
    for kind, res in rechecks.items():
        md += [f"## Recheck of the {kind} comparison", "", recheck_text(res), ""]
    write_text_atomic(out / "gate.md", "\n".join(md))
    _log(f"{summary['verdict']}: {out / 'gate.md'}")
    return rc


NOISY = ("slower", "more memory")


def _removed(compare_json: Path) -> dict:
    """{"paths": {path: detail}, "fixtures": [...]}: what the run comparison says the
    candidate's torch removed (report/diff_model.py ``Comparison.removed_paths``)."""
    import json

    if not compare_json.exists():
        return {"paths": {}, "fixtures": []}
    data = json.loads(compare_json.read_text())
    return {"paths": data.get("api_removed") or {}, "fixtures": data.get("removed_fixtures") or []}


def _flagged(compare_json: Path) -> tuple[set[str], list[str]]:
    """(subjects flagged slower / more memory: benchmark names or bounds case ids, every
    other regression as text)."""
    import json

    data = json.loads(compare_json.read_text())
    flagged, other = set(), []
    for c in data["changes"]:
        if c["category"] != "regression":
            continue
        if c["label"] in NOISY:
            flagged.add(c["subject"])
        else:
            other.append(f"{c['label']}: {c['subject']} {c['item']}".strip())
    return flagged, other


def _bench_grid(flagged: set[str]) -> list[str]:
    """The scaling-benchmark grid covering the flagged benchmarks (path/phase/ws<N>/<size>)."""
    parts = [name.split("/") for name in flagged]
    return ["bench", "scaling",
            "--paths", ",".join(sorted({p[0] for p in parts})),
            "--world-sizes", ",".join(sorted({p[2][2:] for p in parts}, key=int)),
            "--sizes", ",".join(sorted({p[3] for p in parts}, key=float)), "--repeats", "5"]


def _bounds_selection(cfg: GateConfig, flagged: set[str]) -> list[str]:
    """The run selection covering the flagged bounds cases: every world size of their path
    (the scaling fit needs them all), or every bounds case when several paths are flagged."""
    paths = {cid.split("/", 1)[0] for cid in flagged}
    keyword = f"{paths.pop()}/ bounds" if len(paths) == 1 else "bounds"
    argv = ["run", "--tier", cfg.tier, "-k", keyword, *cfg.run_args]
    if cfg.world_sizes:
        argv += ["--world-sizes", cfg.world_sizes]
    return argv


RECHECKS = {  # kind -> what is measured again
    "bench": "benchmark",
    "run": "bounds case",
}


def recheck(kind: str, cfg: GateConfig, out: Path, sides: Sequence[Side],
            thresholds: Sequence[str], logs: Path) -> dict:
    """Measure what the ``kind`` comparison flagged slower or bigger once more on both
    sides, and keep only the regressions that reproduce.

    Rule: a timing or a peak is one sample of a noisy machine (another job, a scheduler
    slice, which pages were already resident), and the two sides ran minutes apart; a
    regression of the candidate's torch is there every time it is measured. So the flagged
    subjects run again, baseline then candidate (benchmarks: their grid of paths x world
    sizes x sizes; run reports: the bounds cases of their path at every world size), and a
    subject stays a regression only when the second comparison flags it again. Any other
    regression (a property newly failing, a P13/P14 bound newly exceeded, a benchmark that
    failed or is missing) stands as it is: verdicts are not noise."""

    flagged, other = _flagged(out / f"compare-{kind}.json")
    result = {"kind": kind, "flagged": sorted(flagged), "other": other, "confirmed": []}
    if not flagged:
        return result
    argv = _bench_grid(flagged) if kind == "bench" else _bounds_selection(cfg, flagged)
    for s in sides:
        run_step(f"{s.name}: {kind} recheck",
                 _cli(s.python, *argv, "--out", str(out / s.name / f"{kind}-recheck.json")),
                 logs / f"{s.name}-{kind}-recheck.log", timeout=cfg.step_timeout,
                 ok_codes=(0, 1, 3))  # a run of bounds cases exits 3 when only bounds fail
    run_step(f"compare {kind} rechecks",
             _cli(sys.executable, "compare", str(out / "baseline" / f"{kind}-recheck.json"),
                  str(out / "candidate" / f"{kind}-recheck.json"), *thresholds,
                  "--out", str(out / f"compare-{kind}-recheck.json")),
             logs / f"compare-{kind}-recheck.log", timeout=600, ok_codes=(0, 1))
    again, _ = _flagged(out / f"compare-{kind}-recheck.json")
    result["confirmed"] = sorted(flagged & again)
    return result


def recheck_text(res: dict) -> str:
    """The recheck's outcome as Markdown bullets."""
    what = RECHECKS[res["kind"]]
    lines = [f"- {what}s flagged slower or bigger by the first comparison: "
             f"{', '.join(res['flagged']) or 'none'}",
             f"- reproduced when measured again (regressions): "
             f"{', '.join(res['confirmed']) or 'none'}"]
    if res["other"]:
        lines.append(f"- other regressions (not rechecked, they stand): {'; '.join(res['other'])}")
    if res["flagged"]:
        lines.append(f"- the second comparison: compare-{res['kind']}-recheck.md")
    return "\n".join(lines)


def run_line(name: str, path: Path) -> str:
    """One Markdown bullet: a side's run headline, its golden (P12) verdicts and how many
    known limitations it still shows."""
    from collections import Counter

    from ..report.run_report import headline, load_report

    try:
        rep = load_report(path)
    except Exception as exc:  # noqa: BLE001  (the gate already stopped if a run wrote none)
        return f"- {name}: report unreadable: {exc}"
    golden = Counter(c["properties"]["P12"]["status"] for c in rep["cases"]
                     if c.get("golden"))
    p12 = ", ".join(f"{n} {k}" for k, n in sorted(golden.items())) or "none"
    return (f"- {name} (torch {rep['torch_version']}): {headline(rep)}; golden fixtures "
            f"(P12): {p12}; {len(rep['summary']['known'])} known torch limitations seen "
            f"(listed in {path.with_suffix('.md')})")


def upgrade_view(run_json: Path, cand_release: str | None) -> Path:
    """The run report as the upgrade comparison reads it: without the golden cases of
    fixtures written by the candidate's release (``cand_release``; None: the report as it
    is). Written beside the report as ``run-upgrade.json``."""
    import json

    if cand_release is None:
        return run_json
    data = json.loads(run_json.read_text(encoding="utf-8"))
    data["cases"] = [c for c in data["cases"] if fixture_writer(c) != cand_release]
    dest = run_json.with_name("run-upgrade.json")
    write_json_atomic(dest, data)
    return dest


def rollback_failures(run_json: Path, cand_release: str | None) -> list[dict]:
    """The baseline's P12 verdicts on the candidate's fixtures that neither pass nor are a
    known limitation: ``[{"case", "status", "detail"}]`` (a rollback after the upgrade
    would meet them)."""
    import json

    if cand_release is None:
        return []
    data = json.loads(run_json.read_text(encoding="utf-8"))
    out = []
    for c in data["cases"]:
        v = c["properties"].get("P12", {})
        if fixture_writer(c) == cand_release and v.get("status") in ("fail", "error"):
            out.append({"case": c["id"], "status": v["status"],
                        "detail": (v.get("detail") or "")[:300]})
    return out


def _headline(verdict: str) -> str:
    """The verdict as gate.md's first line: its leading words in capitals ("NO REGRESSION",
    "NO ROLLBACK: ...") and every name as it is spelled (entry keys stay greppable)."""
    head, sep, rest = verdict.partition(":")
    if not sep:
        head, sep, rest = verdict.partition(";")
    return head.upper() + sep + rest


def _portable(path: str) -> str:
    """An interpreter's path as the record keeps it: relative to the directory the gate ran
    in where it lies below it (``.gate-venvs/torch-2.15.0/bin/python``), so a committed
    record names no directory of the machine that wrote it; else as given."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def rollback_known(run_json: Path, cand_release: str | None) -> dict[str, list[str]]:
    """The baseline's P12 verdicts on the candidate's fixtures that a known limitation
    explains, where that limitation is the candidate's files' doing: ``{entry key: [case
    id, ...]}``. Known is no excuse here: the baseline torch cannot load those checkpoints
    as it loads its own, so the upgrade cannot be rolled back without losing them. A
    limitation the baseline shows on any of its own release's checkpoints too (a tuple that
    comes back a list on every load), or whose entry applies whoever wrote the file (the
    same case with the fixture its own release wrote: a stateless SGD dict that no full load
    takes), is no rollback's doing and is left out."""
    import json

    if cand_release is None:
        return {}
    data = json.loads(run_json.read_text(encoding="utf-8"))
    own = release(data.get("torch_version", ""))
    on_own = {c["properties"].get("P12", {}).get("known") for c in data["cases"]
              if fixture_writer(c) == own}
    out: dict[str, list[str]] = {}
    for c in data["cases"]:
        v = c["properties"].get("P12", {})
        if fixture_writer(c) != cand_release or v.get("status") != "known":
            continue
        if v.get("known") in on_own or _not_the_writers(c, v.get("known"), cand_release, own):
            continue  # the baseline reads its own checkpoints the same way
        out.setdefault(v.get("known") or "?", []).append(c["id"])
    return out


def _not_the_writers(case: dict, key: str | None, cand_release: str, own: str) -> bool:
    """Whether entry ``key`` applies to the report's ``case`` with its fixture written by
    ``own`` instead of ``cand_release`` (known/entries.py: then the writer is not its cause)."""
    import dataclasses

    from ..cases import Case
    from ..known.entries import known_all

    fields = {f.name for f in dataclasses.fields(Case)}
    try:
        c = Case(**{k: v for k, v in case.items() if k in fields})
        other = dataclasses.replace(c, golden=c.golden.replace(f"{cand_release}/", f"{own}/", 1))
    except (TypeError, ValueError):
        return False
    return any(e.key == key for e in known_all(other, "P12"))


def fixture_writer(case: dict) -> str | None:
    """The torch release that wrote a report case's golden fixture (``"<version>/<name>"``),
    None for a case that is not a golden one."""
    return case["golden"].split("/", 1)[0] if case.get("golden") else None


def release(version: str) -> str:
    """``"2.15.0+cu128"`` -> ``"2.15.0"``, ``"2.16.0.dev20250601+cpu"`` ->
    ``"2.16.0.dev20250601"``: the name of the fixtures version directory that torch writes
    (``golden.manifest.torch_version``: the version without its local part)."""
    return version.split("+")[0]


def fixture_directions(runs: dict) -> str:
    """A Markdown table: for each side's run (``{side: run.json}``) and each torch release
    whose fixtures it loaded, the golden (P12) verdicts: who read whose checkpoints, the
    upgrade direction and the rollback direction side by side."""
    from collections import Counter

    from ..report.run_report import load_report

    rows = ["| reader | its torch | fixtures written by torch | P12 verdicts |",
            "|---|---|---|---|"]
    for name, path in runs.items():
        try:
            rep = load_report(path)
        except Exception as exc:  # noqa: BLE001  (the gate already stopped if a run wrote none)
            rows.append(f"| {name} | ? | ? | report unreadable: {exc} |")
            continue
        by_writer: dict[str, Counter] = {}
        for c in rep["cases"]:
            writer = fixture_writer(c)
            if writer is not None:
                by_writer.setdefault(writer, Counter())[c["properties"]["P12"]["status"]] += 1
        for writer, n in sorted(by_writer.items()):
            own = " (its own)" if writer == release(rep["torch_version"]) else ""
            counts = ", ".join(f"{k} {v}" for k, v in sorted(n.items()))
            rows.append(f"| {name} | {rep['torch_version']} | {writer}{own} | {counts} |")
    return "\n".join(rows)


def demote(markdown: str, levels: int = 2) -> str:
    """Every heading ``levels`` down: an embedded report's title (``#``) goes under the
    gate's own ``##`` section as ``###``, its sections as ``####``."""
    return "\n".join("#" * levels + line if line.startswith("#") else line
                      for line in markdown.splitlines())


def add_parser(sub) -> None:
    g = sub.add_parser(
        "gate", help="compare a candidate torch against a baseline: conformance, golden "
                     "fixtures, benchmarks; exit 1 on any regression",
        description=__doc__.split("\n\n")[0] + " Builds an environment per torch with "
                    "scripts/setup-env, runs both, loads the baseline's fresh fixtures in the "
                    "candidate and compares. Exit codes: 0 no regression, 1 regression, 2 the "
                    "gate could not run (usage, environment, a step without its report).")
    who = g.add_mutually_exclusive_group(required=True)
    who.add_argument("--candidate", help="pip spec of the torch to adopt, e.g. torch==2.15.0")
    who.add_argument("--candidate-python", default=None,
                     help="or: an interpreter that already has the candidate torch and this "
                          "package (no environment is built)")
    base = g.add_mutually_exclusive_group()
    base.add_argument("--baseline", default=None,
                      help="pip spec of the torch in use (default: this interpreter's torch)")
    base.add_argument("--baseline-python", default=None,
                      help="or: an interpreter that has the baseline torch and this package")
    g.add_argument("--out", default=None,
                   help="new directory for the gate's reports (default reports/gate-<candidate>-<time>)")
    g.add_argument("--venvs", default=".gate-venvs",
                   help="where environments are built and reused (default .gate-venvs/ in "
                        "the current directory)")
    g.add_argument("--tier", choices=["quick", "full"], default="quick",
                   help="the run's tier on both sides (default quick)")
    g.add_argument("-k", dest="keyword", default=None, help="case selection, as in `run -k`")
    g.add_argument("--world-sizes", default=None, help="as in `run --world-sizes`")
    g.add_argument("--bench", choices=["quick", "full", "none"], default="quick",
                   help="scaling benchmark in both environments (default quick)")
    g.add_argument("--max-slowdown", type=float, default=1.5,
                   help="a timing more than this many times the baseline's is a regression "
                        "if it reproduces when measured again (default 1.5)")
    g.add_argument("--max-memory-growth", type=float, default=1.2,
                   help="a peak more than this many times the baseline's is a regression if "
                        "it reproduces (default 1.2)")
    g.add_argument("--allow-removed", action="store_true",
                   help="pass although the candidate removed some paths' API (they are still "
                        "listed as \"API removed\")")
    g.add_argument("--allow-no-rollback", action="store_true",
                   help="pass although the baseline torch cannot load checkpoints the "
                        "candidate writes by a known limitation (still the headline: NO "
                        "ROLLBACK)")
    g.add_argument("--step-timeout", type=float, default=3 * 3600.0,
                   help="seconds any one step may take (default 3 h)")


def check_selection(tier: str, keyword: str | None, world_sizes: str | None) -> None:
    """Refuse, before any environment is built or fixture written, a selection that picks
    no case of the tier in this package's matrix (``run``'s words: the world sizes the tier
    uses, "did you mean" for a ``-k`` word no id holds). A ``-k`` naming golden fixtures
    (``golden:``) is left to the runs: the candidate's fixtures do not exist yet."""
    if not keyword and not world_sizes:
        return
    from ..run import matrix
    from ..usage import UsageError, parse_world_sizes

    try:
        sizes = parse_world_sizes(world_sizes) if world_sizes else [1, 2, 3, 4]
    except UsageError as exc:
        raise ValueError(str(exc)) from None
    if keyword and "golden:" in keyword.lower():
        from ..selection import compile_keyword

        compile_keyword(keyword)  # still refuses a malformed expression
        return
    cases = matrix.TIERS[tier](matrix.default_paths())
    if not matrix.select(cases, world_sizes=sizes, keyword=keyword):
        raise ValueError(matrix.no_match(cases, tier, world_sizes=sizes, keyword=keyword))


def main(args: argparse.Namespace) -> int:
    try:
        cand = check_spec(args.candidate) if args.candidate else None
        base = check_spec(args.baseline) if args.baseline else None
        check_selection(args.tier, args.keyword, args.world_sizes)
        for flag, py in (("--candidate-python", args.candidate_python),
                         ("--baseline-python", args.baseline_python)):
            if py is not None and not os.access(py, os.X_OK):
                raise ValueError(f"{flag} {py!r} is not an executable interpreter")
    except ValueError as e:
        print(f"fsdp-conformance gate: error: {e}", file=sys.stderr)
        return 2
    slug = re.sub(r"[^0-9A-Za-z.]+", "-", cand or "python").strip("-")
    out = Path(args.out) if args.out else Path("reports") / f"gate-{slug}-{time.strftime('%Y%m%d-%H%M%S')}"
    cfg = GateConfig(candidate=cand, baseline=base, candidate_python=args.candidate_python,
                     baseline_python=args.baseline_python, out=out, venvs=Path(args.venvs),
                     tier=args.tier, keyword=args.keyword, world_sizes=args.world_sizes,
                     bench=args.bench, max_slowdown=args.max_slowdown,
                     max_memory_growth=args.max_memory_growth, step_timeout=args.step_timeout,
                     allow_removed=args.allow_removed,
                     allow_no_rollback=args.allow_no_rollback)
    try:
        return gate(cfg)
    except GateError as e:
        print(f"fsdp-conformance gate: error: {e}", file=sys.stderr)
        return 2
