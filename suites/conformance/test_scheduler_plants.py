"""The run judges the LR scheduler it restores (properties/training_state.py): a change in
torch's schedulers planted in every rank (suites/conformance/sched_plants.py) fails P6 and
P11 on real FSDP1 and FSDP2 round trips, and ``compare`` of the clean and the changed run
reports the regression."""
from __future__ import annotations

import json
import subprocess

import pytest

from suites.conformance.sched_plants import PLANT_ENV, SETUP
from suites.conftest import PYTHON, ROOT, env_for_subprocess

CLI = [PYTHON, "-m", "fsdp_conformance"]

pytestmark = pytest.mark.slow


def _run(tmp_path, name: str, select: str, plant: str = "") -> dict:
    out = tmp_path / f"{name}.json"
    env = {**env_for_subprocess(),
           **({"FSDPC_RANK_SETUP": SETUP, PLANT_ENV: plant} if plant else {})}
    p = subprocess.run([*CLI, "run", "-k", select, "--bounds", "off", "--out", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode in (0, 1), p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(out.read_text())


def _failing(report: dict, prop: str) -> dict[str, str]:
    return {c["id"]: c["properties"][prop]["detail"] for c in report["cases"]
            if c["properties"][prop]["status"] == "fail"}


def _compare(tmp_path, a: str, b: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "compare", str(tmp_path / f"{a}.json"),
                           str(tmp_path / f"{b}.json")], cwd=ROOT, env=env_for_subprocess(),
                          capture_output=True, text=True, timeout=300)


def test_a_scheduler_restored_one_step_short_fails_p6_and_p11_on_both_families(tmp_path):
    clean = _run(tmp_path, "clean", "sched")
    assert clean["correctness_ok"], [c["id"] for c in clean["cases"]
                                     if any(v["status"] in ("fail", "error")
                                            for v in c["properties"].values())]
    short = _run(tmp_path, "short", "sched", plant="last_epoch_short")
    p11, p6 = _failing(short, "P11"), _failing(short, "P6")
    for family in ("fsdp1.", "fsdp2."):
        hit = [cid for cid in p11 if cid.startswith(family)]
        assert hit, f"no {family} case failed P11: {sorted(p11)}"
        assert "scheduler after the load vs at the save: 'last_epoch': expected 2, got 1" \
            in p11[hit[0]], p11[hit[0]]
        assert any(cid.startswith(family) for cid in p6), sorted(p6)
    assert any("scheduler after resuming vs the uninterrupted run" in d for d in p6.values())
    cmp = _compare(tmp_path, "clean", "short")
    assert cmp.returncode == 1 and "REGRESSION" in cmp.stdout, cmp.stdout[-3000:]


def test_a_sequential_schedule_whose_children_are_not_restored_fails(tmp_path):
    clean = _run(tmp_path, "clean", "sched:sequential")
    assert clean["correctness_ok"] and clean["summary"]["cases"] >= 1
    planted = _run(tmp_path, "children", "sched:sequential", plant="sequential_children")
    p11 = _failing(planted, "P11")
    assert p11 and all("'_schedulers'" in d for d in p11.values()), p11
    assert _failing(planted, "P6")
    cmp = _compare(tmp_path, "clean", "children")
    assert cmp.returncode == 1 and "REGRESSION" in cmp.stdout, cmp.stdout[-3000:]
