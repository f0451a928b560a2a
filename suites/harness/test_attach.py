"""Attach mode: the pool API on the ranks of a real torchrun job (gloo, loopback)."""
from __future__ import annotations

import json
import socket
import subprocess

import pytest

from suites.conftest import PYTHON, ROOT, env_for_subprocess

JOB = ROOT / "suites" / "harness" / "attach_job.py"
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(args, mode, out, timeout=120):
    """The job, its temporary files under ``out``'s folder ``tmp/`` (``_scratch_left``)."""
    cmd = [PYTHON, "-m", "torch.distributed.run", *args, str(JOB), mode, str(out)]
    tmp = out.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    return subprocess.Popen(cmd, cwd=ROOT, env={**env_for_subprocess(), "TMPDIR": str(tmp)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _scratch_left(out) -> list[str]:
    """The ranks' scratch directories a job of ``_torchrun`` left behind."""
    return sorted(p.name for p in (out.parent / "tmp").glob("fsdpc-attach-*"))


def _single_node(nproc: int) -> list[str]:
    return ["--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--max-restarts", "0"]


def _check_basic(seen: dict, ws: int) -> None:
    assert seen["world_size"] == ws
    assert seen["whoami"] == [[r, ws, ws * (ws - 1) // 2] for r in range(ws)]
    assert seen["each"] == [3 * r for r in range(ws)]
    assert seen["seeded_equal"] is True
    assert seen["error"]["ranks"] == [ws - 1]
    assert f"planted failure on rank {ws - 1}" in seen["error"]["text"]
    assert seen["after_error"] == seen["whoami"]
    assert seen["default_group_after_close"] is False, "close() destroys the group attach() made"
    assert seen["scratch_left_after_close"] == [], "close() removes every rank's scratch"


def test_torchrun_two_ranks(tmp_path):
    out = tmp_path / "seen.json"
    proc = _torchrun(_single_node(2), "basic", out)
    log, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, log
    _check_basic(json.loads(out.read_text()), 2)


def _never_closed_job_ends_cleanly(tmp_path, mode: str) -> str:
    """Run a 2-rank job of ``mode`` that never closes its pool; it must exit 0 without the
    gloo abort and with both ranks' answers. Returns the log."""
    out = tmp_path / "seen.json"
    proc = _torchrun(_single_node(2), mode, out)
    log, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, log
    assert "terminate called" not in log
    assert json.loads(out.read_text())["whoami"] == [[0, 2, 1], [1, 2, 1]]
    assert _scratch_left(out) == []
    return log


def test_torchrun_job_that_never_closes_its_pool_still_ends_cleanly(tmp_path):
    """Rank 0 closes the pool at exit: the serving rank leaves and nothing aborts."""
    _never_closed_job_ends_cleanly(tmp_path, "no-close")


def test_never_closed_pool_leaves_no_gloo_thread_at_exit_even_with_a_late_watchdog(tmp_path):
    """A call's watchdog thread that runs late (a loaded machine) held the pool and so its
    gloo groups past the exit-time close(): their threads were alive as the interpreter
    finalized, and the group destructor could then run on that thread mid-finalization and
    abort rank 0 (issue 32). close() now joins the watchdog and drops the groups itself."""
    log = _never_closed_job_ends_cleanly(tmp_path, "no-close-late-watchdog")
    at_exit = json.loads((tmp_path / "seen.json.atexit.json").read_text())
    assert at_exit == {"gloo_threads": 0, "python_threads": ["MainThread"]}, log


def test_torchrun_two_agents_on_loopback_as_two_nodes(tmp_path):
    out = tmp_path / "seen.json"
    port = _free_port()
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"fsdpc-{port}",
              "--max-restarts", "0"]
    agents = [_torchrun(common, "basic", out) for _ in range(2)]
    logs = [a.communicate(timeout=180)[0] for a in agents]
    assert [a.returncode for a in agents] == [0, 0], "\n".join(logs)
    _check_basic(json.loads(out.read_text()), 2)


@pytest.mark.parametrize("mode", ["rank0-free-hang", "rank0-free-hang-slow-leaver",
                                  "rank0-free-late-hang"])
def test_torchrun_hang_with_free_controller_raises_rank_timeout(tmp_path, mode):
    """The stuck ranks exit 124 only once rank 0, which handled the RankTimeout, exits.
    ``-late-hang``: rank 0's own part outlasts the watchdog's grace; the barrier still gives
    up at the call's deadline, so rank 0 is not taken for stuck (it was: the barrier counted
    its timeout from its own start)."""
    out = tmp_path / "seen.json"
    proc = _torchrun(_single_node(3), mode, out)
    log, _ = proc.communicate(timeout=180)
    seen = json.loads(out.read_text())
    assert seen["timeout"]["ranks"] == [1, 2]
    assert "skip_collective" in seen["timeout"]["text"]
    assert proc.returncode != 0, "the stuck ranks must be made to exit (torchrun fails the job)"
    assert _scratch_left(out) == [], "a timed-out job still removes every rank's scratch"


@pytest.mark.parametrize("mode", ["rank0-stuck-hang", "rank0-stuck-hang-slow-leaver"])
def test_torchrun_hang_inside_controller_dumps_stacks_and_exits_124(tmp_path, mode):
    """No rank exits 124 before every rank removed its scratch: torchrun would otherwise stop
    a rank that is slow to leave (a loaded machine; ``-slow-leaver`` delays it 2 s) before its
    clean-up, which CI once saw."""
    out = tmp_path / "seen.json"
    proc = _torchrun(_single_node(2), mode, out)
    log, _ = proc.communicate(timeout=180)
    assert proc.returncode != 0
    assert not out.exists(), "the hung call must not return"
    assert "RankTimeout" in log and "rank 0 itself is stuck" in log
    assert "skip_collective" in log and "all_reduce" in log
    assert "exitcode  : 124" in log or "exit code 124" in log or "124" in log
    assert _scratch_left(out) == [], "a timed-out job still removes every rank's scratch"
