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
