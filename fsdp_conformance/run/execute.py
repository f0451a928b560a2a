"""The conformance run: for each case, save at N on one pool, load at M on another, then
decide every property on the controller.

Rules
- One work directory per case under a run directory the runner owns (a fresh temporary
  directory, removed at the end); nothing is written anywhere else.
- A pool call that raises, dies or times out makes the case's properties "error" with
  every rank's traceback or stack (the pool rebuilds itself); the run goes on.
- Fault cases (``case.fault``) only check P15: the controller damages the saved files
  between save and load, then the load must fail on every rank with an error that names
  the problem, within ``fault_timeout`` seconds.
- Bounds cases (``case.bounds``) only check P13 and P14 (bounds.py): the path's save and
  load are measured (``measure.measure_case``, BOUNDS_REPEATS repeats) and judged against the
  calibration file. Noise only ever adds time, a real slowdown or extra copy persists: a
  case whose first measurement fails P13 or P14 is measured once more and judged on that
  second measurement alone (the first failure is kept in the detail); one still failing is
  measured again after every other case of the run (load on a shared machine comes in
  bursts of seconds to minutes) and that later result stands. After every case has run, the
  scaling fit of each path and phase over the run's bounds cases folds into P13 of the
  path's largest-world-size case. Every other case has P13/P14 n/a, pointing at the bounds
  cases.
- Known torch limitations (``known.py``) turn a failing verdict into "known" and mark a
  passing one as "fixed upstream?".
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..cases import Case
from ..harness import get_pool
from ..harness.errors import RankError, RankTimeout
from ..known.entries import known_all
from .local import local_run
from ..zoo import model_spec
from .. import reference as ref
from ..properties import run_props as rp
from ..properties.layouts import reference_layout
from ..properties.reference_props import p0_layout
from ..properties.verdict import Verdict, error, na, passed
from ..report.run_report import CaseResult
from ..sut import paths as fsdp1_paths

PROPS = tuple(f"P{i}" for i in range(16))
NOT_BUILT = {
    "P12": "not a golden-fixture case (P12 has its own cases: .../golden:<torch version>/<fixture>)",
    "P13": "not a bounds case (P13 is checked by the bounds cases: .../bounds)",
    "P14": "not a bounds case (P14 is checked by the bounds cases: .../bounds)",
}
BOUNDS_ONLY = "bounds case: only P13/P14"
REMEASURED = "measured twice: the first measurement failed"


def _sut(api: str):
    if api.startswith("fsdp2"):
        from ..sut import fsdp2_paths

        return fsdp2_paths
    return fsdp1_paths


def _apply_known(case: Case, verdicts: dict[str, Verdict]) -> dict[str, Verdict]:
    """Known limitations applied per property (module docstring). A "fail" is known when
    an entry applies and its symptom (if any) is in the detail; an "error" (an exception,
    a dead or stuck rank) only when an entry's symptom names it, so a new crash is never
    hidden behind an entry about wrong values; a failure of the suite itself never is.
    Then every other property that failed with the very same detail (one root cause: the
    save or the load raised) is "known" under the entry of the primary property."""
    out = {}
    for prop, v in verdicts.items():
        suite_bug = v.detail.startswith(SUITE_FAILED)
        k = next((e for e in known_all(case, prop)
                  if v.status == "pass" or (v.status == "fail" and e.matches(v.detail))
                  or (v.status == "error" and e.symptom and e.matches(v.detail))), None)
        if k is not None and v.status in ("fail", "error") and not suite_bug:
            v = Verdict("known", f"{k.reason}\nupstream: {k.upstream}\n\n{v.detail}", k.key)
        elif k is not None and v.status == "pass" and k.primary(prop):
            v = Verdict("pass", f"fixed upstream? known limitation {k.key!r} did not "
                                f"reproduce. {v.detail}", k.key)
        out[prop] = v
    primary = {p: v.status == "known" and any(e.key == v.known and e.primary(p)
                                             for e in known_all(case, p))
               for p, v in out.items()}
    root: dict[str, Verdict] = {}
    for p, v in out.items():  # P0..P15 in order; an entry's primary property names the cause
        if primary[p]:
            root.setdefault(verdicts[p].detail, v)
    for p, v in verdicts.items():
        k = root.get(v.detail)
        if k is not None and v.status in ("fail", "error") and not primary[p]:
            out[p] = Verdict("known", k.detail, k.known)
    return out


SUITE_FAILED = "the suite failed"


def _all(v: Verdict, props: Sequence[str] = PROPS) -> dict[str, Verdict]:
    return {p: v for p in props}


def _read_dcp(path: Path) -> dict | None:
    """A DCP directory's optimizer state as one full dict, read without a process group."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = path.parent / "dcp_full.pt"
    try:
        dcp_to_torch_save(str(path), str(out))
        return torch.load(out, weights_only=False)["optim"]
    except Exception:  # noqa: BLE001  (P8 reports it as an error)
        return None


def evaluate(case: Case, save_obs: list[dict], load_obs: list[dict], workdir: Path) -> dict[str, Verdict]:
    """Every property of a normal (non-fault) case from what the ranks recorded."""
    api = case.api
    v: dict[str, Verdict] = {}
    ordered = case.groups == 1  # several groups: the optimizer's order is the groups' order
    if api.startswith("fsdp2"):  # FSDP2: per-parameter layout and its own reference
        from ..properties import fsdp2_run_props as f2

        layout, dst = f2.layouts(case)
        v["P0"] = f2.p0(layout, dst, save_obs, load_obs, ordered)
        p1_saved, p3_loaded, gather = f2.p1_saved, f2.p3_loaded, f2.gather
    else:
        layout = reference_layout(case)
        dst = reference_layout(case, load_side=True)
        p0s = p0_layout(layout, save_obs, ordered=ordered)
        p0l = p0_layout(dst, load_obs, ordered=ordered)
        v["P0"] = p0s if p0s.status != "pass" else (
            Verdict(p0l.status, "load side: " + p0l.detail) if p0l.status != "pass" else
            passed(f"save side {p0s.detail}; load side {p0l.detail}"))
        p1_saved, p3_loaded, gather = rp.p1_saved, rp.p3_loaded, ref.gather_full
    full, bad = rp.to_full(api, save_obs)
    local = local_run(case)
    if full is None:
        for p in ("P1", "P2", "P3", "P4", "P6", "P7", "P8", "P9", "P10", "P11"):
            v[p] = bad
    else:
        v["P1"] = p1_saved(layout, save_obs, full, api)
        ignored = model_spec(case.model).ignored
        why = (f"the model has ignored modules {list(ignored)}: FSDP trains them per rank on "
               f"the rank's own rows, and they feed every other param's gradient, so no "
               f"single-process run can match") if ignored else ""
        v["P2"] = na(why) if why else rp.p2_vs_local(layout, full, local, case.dtype)
        same = case.dst_world_size == case.world_size and case.dst_plan == case.plan
        v["P3"] = p3_loaded(dst, full, load_obs, own=save_obs if same else None)
        v["P4"] = rp.p4_flatten(dst, load_obs, api)
        v["P6"] = na(why) if why else rp.p6_resume(dst, load_obs, local, case.dtype, gather=gather)
        v["P7"] = rp.p7_idempotent(api, full, load_obs, case.plan == case.dst_plan) if not any(
            rp._err(o.get("loaded")) for o in load_obs) else error(
            "load failed: " + next(rp._err(o["loaded"]) for o in load_obs if rp._err(o.get("loaded"))))
        dcp_full = _read_dcp(workdir / fsdp1_paths.DCP_DIR) if api.endswith(".sharded") else None
        v["P8"] = rp.p8_serialise(api, save_obs, load_obs, full, dcp_full)
        v["P9"] = (f2.p9_sharded(full, save_obs) if api == "fsdp2.sharded"
                   else rp.p9_flags(layout, api, save_obs))
        v["P10"] = rp.p10_partial(case, layout, dst, full, load_obs, local, gather=gather)
        v["P11"] = rp.p11_groups(full, load_obs, local)
    if api != "fsdp1.rekey":
        v["P5"] = na("this path does not rekey")
    elif full is None:
        v["P5"] = bad
    else:
        v["P5"] = rp.p5_rekey_path(case, full, load_obs)
    v["P15"] = na("not a bad-input case (P15 has its own cases: .../fault:<kind>)")
    for p, why in NOT_BUILT.items():
        v[p] = na(why)
    return {p: v[p] for p in PROPS}


def _failed(case: Case, v: Verdict) -> dict[str, Verdict]:
    """Verdicts of a normal case whose save or load could not run: ``v`` for every property
    the case would have checked, the usual n/a for the others."""
    out = _all(v)
    if case.api != "fsdp1.rekey":
        out["P5"] = na("this path does not rekey")
    out["P15"] = na("not a bad-input case (P15 has its own cases: .../fault:<kind>)")
    out.update({p: na(why) for p, why in NOT_BUILT.items()})
    return out


def _rank_error_verdict(exc: RankError, what: str) -> Verdict:
    return error(f"{what}: {exc}")


def run_bounds_case(case: Case, rundir: Path, *, backend: str | None, timeout: float,
                    calibration: str | os.PathLike | None = None) -> CaseResult:
    """Measure a bounds case and judge P13/P14 (module rules); every other property n/a."""
    from ..bounds import rules as bounds
    from ..bounds.measure import measure_case

    workdir = rundir / hashlib.sha1(case.id.encode()).hexdigest()[:16]
    t0 = time.perf_counter()
    verdicts = _all(na(BOUNDS_ONLY))
    meas: dict = {}
    try:
        cal = bounds.load_calibration(calibration)
        first = ""
        for attempt in (1, 2):
            meas = measure_case(case, workdir, repeats=bounds.BOUNDS_REPEATS, backend=backend,
                                timeout=timeout)
            meas, p13, p14 = bounds.verdicts(case, meas, cal)
            failed = [(p, v) for p, v in (("P13", p13), ("P14", p14)) if v.status == "fail"]
            if not failed or attempt == 2:
                break
            first = "\n".join(f"first measurement, {p}: {v.detail}" for p, v in failed)
        if first:  # the verdicts are the second measurement's; say what the first saw
            p13, p14 = (Verdict(v.status, f"{v.detail}\n({REMEASURED})\n{first}")
                        for v in (p13, p14))
        verdicts["P13"], verdicts["P14"] = p13, p14
    except bounds.CalibrationError as exc:
        verdicts["P13"] = verdicts["P14"] = error(str(exc))
    except RankError as exc:
        verdicts["P13"] = verdicts["P14"] = _rank_error_verdict(exc, "measuring the path failed")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    timings = {p: meas[p]["time_s"] for p in ("save", "load") if p in meas}
    timings["total"] = time.perf_counter() - t0
    return CaseResult(case, _apply_known(case, verdicts), timings, meas)


def apply_scaling(results: Sequence[CaseResult],
                  calibration: str | os.PathLike | None = None) -> list[CaseResult]:
    """``results`` with each path's scaling fit (bounds.scaling_block over the bounds cases)
    folded into P13 of its largest-world-size bounds case of the fitted model."""
    from ..bounds import rules as bounds
    from ..report.run_report import measured_entries

    try:
        cal = bounds.load_calibration(calibration)
    except bounds.CalibrationError:
        cal = None
    block = bounds.scaling_block(measured_entries(results), cal)
    out = list(results)
    for key, s in block.items():
        api = key.rsplit("/", 1)[0]
        idx = [i for i, r in enumerate(out) if r.case.bounds and r.case.api == api
               and r.case.model == bounds.BOUNDS_MODEL and r.measurements]
        if not idx:
            continue
        i = max(idx, key=lambda j: out[j].case.world_size)
        p13 = bounds.scaling_verdict(out[i].properties["P13"], s)
        out[i] = dataclasses.replace(out[i], properties={**out[i].properties, "P13": p13})
    return out


def run_case(case: Case, rundir: Path, *, backend: str | None, timeout: float,
             fault_timeout: float, calibration: str | os.PathLike | None = None) -> CaseResult:
    """Save, (damage,) load, evaluate one case; never raises for a torch or rank failure.
    A bounds case is measured instead (``run_bounds_case``; ``calibration``: its file)."""
    if case.bounds:
        return run_bounds_case(case, rundir, backend=backend, timeout=timeout,
                               calibration=calibration)
    if case.golden:  # P12: load a stored fixture instead of saving (fixtures/golden.py)
        from ..golden.case import run_golden_case

        return run_golden_case(case, rundir, backend=backend, timeout=timeout)
    workdir = rundir / hashlib.sha1(case.id.encode()).hexdigest()[:16]
    workdir.mkdir(parents=True, exist_ok=True)
    sut = _sut(case.api)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    try:
        try:
            save_obs = get_pool(case.world_size, backend).run(
                sut.save_side, case, str(workdir), timeout=timeout, seed=case.seed)
        except RankError as exc:
            return CaseResult(case, _apply_known(case, _failed(case, _rank_error_verdict(exc, "save side failed"))),
                              {"total": time.perf_counter() - t0})
        timings["save"] = max(o["timings"].get("save", 0.0) for o in save_obs)
        failed = [o for o in save_obs if rp._err(o.get("saved"))]
        if failed and not case.fault:  # nothing was written: there is nothing to load
            v = error(f"torch raised in the {case.api} save call on rank {failed[0]['rank']}, "
                      f"so nothing could be loaded:\n{rp._err(failed[0]['saved'])}")
            timings["total"] = time.perf_counter() - t0
            return CaseResult(case, _apply_known(case, _failed(case, v)), timings)
        if case.fault:
            from .faults import apply_fault, p15_verdict

            try:
                what = apply_fault(case, workdir)
            except Exception:  # noqa: BLE001
                v = error("could not apply the fault:\n" + traceback.format_exc())
                return CaseResult(case, {**_all(na("fault case: only P15")), "P15": v}, timings)
            try:
                load_obs = get_pool(case.dst_world_size, backend).run(
                    sut.load_side, case, str(workdir), timeout=fault_timeout, seed=case.seed)
                outcome: object = load_obs
            except RankError as exc:
                outcome = exc
            try:
                v15 = p15_verdict(case, what, outcome)
            except Exception:  # noqa: BLE001  (a bug of the suite: say so, keep going)
                v15 = error(f"{SUITE_FAILED} while judging this case:\n" + traceback.format_exc())
            verdicts = {**_all(na("fault case: only P15 is checked")), "P15": v15}
            timings["total"] = time.perf_counter() - t0
            return CaseResult(case, _apply_known(case, verdicts), timings)
        try:
            load_obs = get_pool(case.dst_world_size, backend).run(
                sut.load_side, case, str(workdir), timeout=timeout, seed=case.seed)
        except RankError as exc:
            kind = "hung" if isinstance(exc, RankTimeout) else "failed"
            return CaseResult(case, _apply_known(case, _failed(case, _rank_error_verdict(exc, f"load side {kind}"))),
                              {**timings, "total": time.perf_counter() - t0})
        timings["load"] = max(o["timings"].get("load", 0.0) for o in load_obs)
        try:
            verdicts = evaluate(case, save_obs, load_obs, workdir)
        except Exception:  # noqa: BLE001  (a bug of the suite: say so, keep going)
            verdicts = _failed(case, error(f"{SUITE_FAILED} while evaluating this case:\n"
                                           + traceback.format_exc()))
        timings["total"] = time.perf_counter() - t0
        return CaseResult(case, _apply_known(case, verdicts), timings)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run_cases(cases: Sequence[Case], *, backend: str | None = None, timeout: float = 120.0,
              fault_timeout: float = 30.0,
              on_result: Callable[[CaseResult], None] | None = None,
              calibration: str | os.PathLike | None = None) -> list[CaseResult]:
    """Run every case in order; ``on_result`` sees each result as it lands (progress); the
    scaling fits are folded in at the end (``apply_scaling``; ``calibration``: the bounds
    calibration file, default the packaged one)."""
    results = []
    rundir = Path(tempfile.mkdtemp(prefix="fsdpc-run-"))
    try:
        for case in cases:
            r = run_case(case, rundir, backend=backend, timeout=timeout,
                         fault_timeout=fault_timeout, calibration=calibration)
            results.append(r)
            if on_result is not None:
                on_result(r)
        for i, r in enumerate(results):  # failing bounds cases: once more, later (rules)
            if r.case.bounds and any(r.properties[p].status == "fail" for p in ("P13", "P14")):
                results[i] = run_bounds_case(r.case, rundir, backend=backend, timeout=timeout,
                                             calibration=calibration)
    finally:
        shutil.rmtree(rundir, ignore_errors=True)
    if any(r.measurements for r in results):
        results = apply_scaling(results, calibration)
    return results
