"""The habits of pytest users on ``fsdp-conformance run`` (issue 47): ``-x`` / ``--maxfail``
stop early with a report that says so, ``--lf`` reruns what failed, ``-q`` prints the
verdict and the failures' ids, ``--junit-xml`` writes what CI shows. Real failures: a
scheduler restored one step short, planted in every rank (sched_plants.py)."""
from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET

import pytest

from suites.conformance.sched_plants import PLANT_ENV, SETUP
from suites.conftest import PYTHON, ROOT, env_for_subprocess

CLI = [PYTHON, "-m", "fsdp_conformance", "run", "-k", "sched and fsdp2.full", "--bounds", "off"]

pytestmark = pytest.mark.slow


def _run(out, *args: str, plant: str = "") -> subprocess.CompletedProcess:
    env = {**env_for_subprocess(),
           **({"FSDPC_RANK_SETUP": SETUP, PLANT_ENV: plant} if plant else {})}
    return subprocess.run([*CLI, "--out", str(out), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_exitfirst_lf_quiet_and_junit(tmp_path):
    out, xml = tmp_path / "r.json", tmp_path / "r.xml"
    p = _run(out, "-x", "-q", "--junit-xml", str(xml), plant="last_epoch_short")
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    rep = json.loads(out.read_text())
    failing = [c["id"] for c in rep["cases"] if any(
        v["status"] in ("fail", "error") for v in c["properties"].values())]
    assert len(failing) == 1 and "stopped after 1 failing case(s) (--maxfail 1)" in \
        rep["incomplete"], rep.get("incomplete")
    assert len(rep["cases"]) < rep["planned_cases"]
    assert f"FAIL {failing[0]}" in p.stdout and "STOPPED:" in p.stderr
    assert "┃" not in p.stdout  # -q: no matrix
    suite = ET.parse(xml).getroot().find("testsuite")
    assert suite.get("failures") == "1" and suite.get("errors") == "1"  # + run/incomplete
    failed = [tc for tc in suite.iter("testcase") if tc.find("failure") is not None]
    assert [f"{tc.get('classname')}/{tc.get('name')}" for tc in failed] == failing
    assert "P11" in failed[0].find("failure").get("message")
    assert "rerun: fsdp-conformance run --case" in failed[0].find("failure").text
    p = _run(out, "--lf", "-v")  # the plant gone: only the failed case, and it passes
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert f"--lf: 1 case(s) that failed in {out}" in p.stderr
    assert [c["id"] for c in json.loads(out.read_text())["cases"]] == failing
    assert f"KNOWN {failing[0]}" in p.stderr or f"PASS {failing[0]}" in p.stderr
