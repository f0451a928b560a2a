"""``pytest -n 2``: every worker has its own pools (distinct ports), the report merges every
worker's cases, and no rank, pool or forkserver process outlives the run."""
from __future__ import annotations

import json
import subprocess
import time

from suites.conftest import PYTHON, ROOT, env_for_subprocess, pid_alive


def test_xdist_two_workers_report_and_no_leftover_processes(tmp_path):
    probe = tmp_path / "probe"
    probe.mkdir()
    report = tmp_path / "report.json"
    env = {**env_for_subprocess(), "FSDPC_PROBE_DIR": str(probe)}
    p = subprocess.run([PYTHON, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider",
                        "-p", "suites.plugin.xdist_probe", "-q", "-rs",
                        "examples/test_my_model.py::test_checkpoint_roundtrip",
                        "--fsdp-world-sizes", "1,2", "--fsdp-report", str(report)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "2 passed, 1 skipped" in p.stdout  # ws1, ws2; ws2->3 is outside 1,2
    lines = [json.loads(ln) for f in probe.glob("*.jsonl") for ln in f.read_text().splitlines()]
    workers = {ln["worker"]: ln["pid"] for ln in lines}
    assert set(workers) == {"gw0", "gw1"} and len(set(workers.values())) == 2
    ports = {w: {pool["port"] for ln in lines if ln["worker"] == w for pool in ln["pools"]}
             for w in workers}
    assert all(ports.values()) and not (ports["gw0"] & ports["gw1"]), ports
    # the controller merged both workers' cases into one report of the CLI's schema
    data = json.loads(report.read_text())
    assert data["schema"] == "fsdp-conformance/run/1" and data["ok"] is True
    assert data["summary"]["cases"] == 4 and data["world_sizes"] == [1, 2]
    assert {c["api"] for c in data["cases"]} == {"fsdp1.full", "fsdp1.sharded"}
    # nothing outlives the run: ranks, forkservers, workers
    pids = {pid for ln in lines for pool in ln["pools"] for pid in pool["pids"]}
    pids |= {ln["forkserver"] for ln in lines if ln["forkserver"]} | set(workers.values())
    deadline = time.monotonic() + 10
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(pids) >= 5 and not [pid for pid in pids if pid_alive(pid)]


def test_known_limitations_met_are_listed_after_the_tests_even_when_they_pass():
    """A passing round trip that met a known torch limitation says so in pytest's terminal
    summary (one line per entry, as pytest lists xfails), merged from the xdist workers."""
    p = subprocess.run([PYTHON, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q",
                        "examples/test_fsdp2_trainer.py::test_builtin_fsdp2_paths"],
                       cwd=ROOT, env=env_for_subprocess(), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "fsdp-conformance: known torch limitations met" in p.stdout
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("KNOWN "))
    assert line.startswith("KNOWN dsd-full-load-tuple-to-list: 1 case (P6, P7, P11), e.g. "
                           "fsdp2.full/"), line


def test_fsdp_case_keeps_only_the_tests_that_run_round_trips():
    """``pytest --fsdp-case ID`` (the report's rerun line of a plugin case) deselects the
    tests that cannot make a case, so it reruns just that case."""
    p = subprocess.run([PYTHON, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                        "--collect-only", "examples/test_lightning_trainer.py",
                        "--fsdp-case", "no-such-case"],
                       cwd=ROOT, env=env_for_subprocess(), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    kept = [ln for ln in p.stdout.splitlines() if "::" in ln]
    assert "4/8 tests collected (4 deselected)" in p.stdout, p.stdout[-2000:]
    assert all("test_fabric_save_load" in ln or "restores_the_scheduler" in ln
               for ln in kept), kept
