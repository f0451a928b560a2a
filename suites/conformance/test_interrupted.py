"""An interrupted conformance run (SIGTERM: a CI job's time limit; SIGINT: Ctrl-C) writes the
report of the cases it decided, marked incomplete, and leaves no rank process behind."""
from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from fsdp_conformance.report.run_report import headline, load_report

from suites.conftest import PYTHON, ROOT, env_for_subprocess, pid_alive

SELECTION = "fsdp1.full ws1"  # a few cheap one-rank cases of the quick tier


def _children(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                         text=True).stdout
    return {int(x) for x in out.split()}


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_interrupted_run_writes_a_partial_report(tmp_path, sig, code):
    out = tmp_path / "partial.json"
    env = {**env_for_subprocess(), "FSDPC_PROGRESS_EVERY": "1"}
    listed = subprocess.run([PYTHON, "-m", "fsdp_conformance", "run", "-k", SELECTION,
                             "--list"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    planned = len(listed.stdout.split())
    assert planned >= 3, listed
    # a job started in the background by a shell without job control (nohup ... &, some CI
    # runners) inherits SIGINT ignored, and Python then never installs its Ctrl-C handler:
    # the child starts with the default disposition, as in a terminal
    proc = subprocess.Popen([PYTHON, "-m", "fsdp_conformance", "run", "-k", SELECTION,
                             "--out", str(out)], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 180
    line = ""
    while time.monotonic() < deadline:  # wait for the first decided case
        line = proc.stderr.readline()
        if line.startswith("[1/") or not line:
            break
    assert line.startswith(f"[1/{planned}]"), f"no progress line; last: {line!r}"
    kids = set()
    for p in _children(proc.pid):
        kids |= {p} | _children(p)
    proc.send_signal(sig)
    try:
        rc = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the run did not exit within 60 s of the signal")
    stderr = proc.stderr.read()
    assert rc == code, stderr[-2000:]
    assert "INCOMPLETE" in stderr
    report = load_report(out)  # a valid run report of the schema
    assert report["incomplete"].startswith("interrupted (" + ("SIGTERM" if code == 143 else "Ctrl-C"))
    assert report["planned_cases"] == planned
    assert 1 <= report["summary"]["cases"] < planned
    assert report["ok"] is False  # an incomplete run never passes the gate
    assert headline(report).startswith("INCOMPLETE")
    assert json.loads(out.read_text())["cases"][0]["properties"]
    assert out.with_suffix(".md").is_file()
    time.sleep(1)
    assert not [p for p in kids if pid_alive(p)], "rank processes outlived the run"
