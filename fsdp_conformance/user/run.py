"""Running one user case on the shared pools: save, load and judge it, in the controller.
Never raises for a torch or rank failure: it becomes the verdicts.

Rules
- Zoo cases without a custom path go through ``runner.run_case`` unchanged.
- A user model is registered (``UserModel.register``) in the controller and, before every
  call, on each rank.
- A custom path runs as separate stages (``rank_side.rank_custom``); a stage that raises is
  recorded and the later stages that still make sense run.
- Verdicts go through ``known.py`` (``limitations.known_view``), then through the declared
  limitations (``limitations.apply_declared``).
"""
from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
import traceback
from pathlib import Path
from typing import Sequence

from ..cases import Case
from ..harness import get_pool
from ..harness.errors import RankError, RankTimeout
from ..properties.verdict import Verdict, error, fail
from ..report.run_report import CaseResult
from ..runner import _all, _apply_known, run_case
from .limitations import Limitation, apply_declared, known_view
from .model import CustomPath, UserModel
from .rank_side import rank_custom, rank_load, rank_save
from .verdicts import evaluate_custom, evaluate_user, rank_error_text


def run_user_case(case: Case, user: UserModel | None = None, custom: CustomPath | None = None,
                  *, backend: str | None = None, timeout: float = 120.0,
                  declared: Sequence[Limitation] = (), hits: set | None = None):
    """Save, load and judge one case on the shared pools; never raises for a torch or rank
    failure (it becomes the verdicts). Zoo cases without a custom path go through
    ``runner.run_case`` unchanged."""
    rundir = Path(tempfile.mkdtemp(prefix="fsdpc-rt-"))
    try:
        if user is None and custom is None:
            r = run_case(case, rundir, backend=backend, timeout=timeout,
                         fault_timeout=min(timeout, 30.0))
            return dataclasses.replace(r, properties=apply_declared(r.properties, declared, hits))
        if user is not None:
            user.register()
        t0 = time.perf_counter()
        timings: dict[str, float] = {}

        def finish(verdicts):
            verdicts = _apply_known(known_view(case, user), verdicts)
            verdicts = apply_declared(verdicts, declared, hits)
            return CaseResult(case, verdicts, {**timings, "total": time.perf_counter() - t0})

        if custom is not None:
            return finish(_run_custom(case, user, custom, rundir, backend, timeout, timings))
        try:
            save_obs = get_pool(case.world_size, backend, timeout=timeout).run(
                rank_save, user, custom, case, str(rundir), timeout=timeout, seed=case.seed)
        except RankError as exc:
            return finish(_all(error(f"save side failed: {exc}")))
        timings["save"] = max(o.get("timings", {}).get("save", 0.0) for o in save_obs)
        try:
            load_obs = get_pool(case.dst_world_size, backend, timeout=timeout).run(
                rank_load, user, custom, case, str(rundir), timeout=timeout, seed=case.seed)
        except RankError as exc:
            kind = "hung" if isinstance(exc, RankTimeout) else "failed"
            return finish(_all(error(f"load side {kind}: {exc}")))
        timings["load"] = max(o.get("timings", {}).get("load", 0.0) for o in load_obs)
        try:
            verdicts = evaluate_user(case, save_obs, load_obs, rundir)
        except Exception:  # noqa: BLE001  (a bug of the suite: say so)
            verdicts = _all(error("the suite failed while evaluating this case:\n"
                                  + traceback.format_exc()))
        return finish(verdicts)
    finally:
        shutil.rmtree(rundir, ignore_errors=True)


def _run_custom(case: Case, user, custom: CustomPath, rundir: Path, backend, timeout: float,
                timings: dict) -> dict[str, Verdict]:
    """The stages of a custom round trip (``rank_custom``), then ``evaluate_custom``."""
    def stage(ws: int, name: str) -> list[dict]:
        return get_pool(ws, backend, timeout=timeout).run(
            rank_custom, user, custom, case, str(rundir), name, timeout=timeout, seed=case.seed)

    def merge(obs: list[dict], more: list[dict]) -> None:
        for o, m in zip(obs, more):
            o.update({k: v for k, v in m.items() if k != "timings"})
            o.setdefault("timings", {}).update(m.get("timings", {}))

    errors: dict[str, RankError] = {}
    try:
        save_obs = stage(case.world_size, "train")
    except RankError as exc:
        return _all(fail("building or training the model under FSDP raised:\n"
                         + rank_error_text(exc)))
    load_obs = None
    try:
        merge(save_obs, stage(case.world_size, "save"))
        timings["save"] = max(o["timings"].get("save", 0.0) for o in save_obs)
    except RankError as exc:
        errors["save"] = exc
    if "save" not in errors:
        try:
            load_obs = stage(case.dst_world_size, "load")
            timings["load"] = max(o["timings"].get("load", 0.0) for o in load_obs)
        except RankError as exc:
            errors["load"] = exc
    if load_obs is not None:
        for name in ("resume", "again"):
            try:
                merge(load_obs, stage(case.dst_world_size, name))
            except RankError as exc:
                errors[name] = exc
    try:
        return evaluate_custom(case, save_obs, load_obs, errors)
    except Exception:  # noqa: BLE001  (a bug of the suite: say so)
        return _all(error("the suite failed while evaluating this case:\n"
                          + traceback.format_exc()))
