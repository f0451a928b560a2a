"""A failure on some ranks while the others wait in a collective is decided within the pool's
error grace, not at the call's timeout; and a rank function the ranks cannot import is
refused in the controller before any rank is spawned.

Wall-clock bounds here are generous upper bounds (the default timeout is 120 s; a decided
call takes the 3 s grace plus the stack dump), never tight timings.
"""
from __future__ import annotations

import subprocess
import textwrap
import time

import pytest

from fsdp_conformance.run import execute as runner
from fsdp_conformance.cases import Case
from fsdp_conformance.harness import RankError, RankPool, RankTimeout, get_pool, probes
from fsdp_conformance.harness.pool import DEFAULT_TIMEOUT_S
from fsdp_conformance.options import RunOptions
from fsdp_conformance.sut.records import RecordedError
from suites.conftest import PYTHON, ROOT, env_for_subprocess, pid_alive
from suites.harness import crash_probes as cp

DECIDED_S = 10.0


def _failures(err: RankError) -> dict[int, object]:
    return {f.rank: f for f in err.failures}


def _pool2():
    pool = get_pool(2, timeout=DEFAULT_TIMEOUT_S)
    assert pool.timeout == DEFAULT_TIMEOUT_S == 120.0
    pool.run(probes.noop)  # started and healthy before the clock starts
    return pool


def test_raise_while_the_other_rank_waits_in_all_reduce_is_decided_in_the_grace():
    pool = _pool2()
    pids = pool.pids
    t0 = time.monotonic()
    with pytest.raises(RankError) as info:
        pool.run(cp.raise_then_all_reduce, 1)
    took = time.monotonic() - t0
    assert took < DECIDED_S, f"decided after {took:.1f}s"
    err = info.value
    assert not isinstance(err, RankTimeout)
    f = _failures(err)
    assert f[1].kind == "exception ValueError" and "planted crash on rank 1" in f[1].detail
    assert f[0].kind == "stuck-after-error"
    assert "raise_then_all_reduce" in f[0].detail and "all_reduce" in f[0].detail
    assert pool.run(probes.whoami) == [(0, 2, 1), (1, 2, 1)]
    assert not any(pid_alive(p) for p in pids)


def test_failure_returned_through_guarded_is_decided_in_the_grace():
    pool = _pool2()
    t0 = time.monotonic()
    with pytest.raises(RankError) as info:
        pool.run(cp.guarded_fail_then_barrier, 1)
    took = time.monotonic() - t0
    assert took < DECIDED_S, f"decided after {took:.1f}s (the timeout is {pool.timeout:.0f}s)"
    err = info.value
    assert not isinstance(err, RankTimeout)
    assert "failed on rank(s) [1]" in err.summary and "rank(s) [0] did not finish" in err.summary
    f = _failures(err)
    assert f[1].kind == "exception ValueError (returned)"
    assert "planted crash on rank 1" in f[1].detail and "in guarded" in f[1].detail
    assert f[0].kind == "stuck-after-error"
    assert "guarded_fail_then_barrier" in f[0].detail and "barrier" in f[0].detail
    assert pool.run(probes.whoami) == [(0, 2, 1), (1, 2, 1)]


def test_failure_returned_on_every_rank_is_returned_as_before():
    pool = _pool2()
    pids = pool.pids
    out = pool.run(cp.guarded_fail_everywhere)
    for r, (value, seconds) in enumerate(out):
        assert isinstance(value, RecordedError) and seconds == 0.0
        assert value.exc_type == "ValueError"
        assert value.traceback.rstrip().endswith(f"ValueError: planted crash on rank {r}")
    assert pool.pids == pids, "failures every rank returned must not rebuild the pool"


def _run_planted(tmp_path, bad_ranks: tuple[int, ...]):
    case = Case(api="fsdp1.full", world_size=2)
    pool = _pool2()
    pool.run(cp.plant_crash, bad_ranks)
    try:
        t0 = time.monotonic()
        result = runner.run_case(case, tmp_path, RunOptions(fault_timeout=30.0))
        return result, time.monotonic() - t0
    finally:
        if pool.alive:  # a rebuilt pool has no patch left; a live one still does
            pool.run(cp.unplant_crash)


def test_planted_crash_on_one_rank_of_a_case_is_decided_in_the_grace(tmp_path):
    result, took = _run_planted(tmp_path, (1,))
    assert took < DECIDED_S, f"case decided after {took:.1f}s"
    checked = [p for p, v in result.properties.items() if v.status != "n/a"]
    assert checked == [f"P{i}" for i in range(12) if i != 5]
    for p in checked:
        v = result.properties[p]
        assert v.status == "error", (p, v)
        assert v.detail.startswith("save side failed: save_side failed on rank(s) [1]")
        assert "planted crash on rank 1" in v.detail
        assert "--- rank 0: stuck-after-error ---" in v.detail and "optim_state_dict" in v.detail
    assert get_pool(2).run(probes.whoami) == [(0, 2, 1), (1, 2, 1)]


def test_planted_crash_on_every_rank_keeps_its_verdict(tmp_path):
    pool = _pool2()
    pids = pool.pids
    result, took = _run_planted(tmp_path, (0, 1))
    assert took < DECIDED_S, f"case decided after {took:.1f}s"
    v = result.properties["P1"]
    assert v.status == "error"
    assert v.detail.startswith("torch raised in the fsdp1.full save call on rank 0, so nothing "
                               "could be loaded:\n")
    assert v.detail.rstrip().endswith("planted crash on rank 0 (test-only injection)")
    assert pool.pids == pids


def _outer():
    def nested(ctx):
        return ctx.rank
    return nested


@pytest.mark.parametrize("fn, reason", [
    (lambda ctx: ctx.rank, "it is a lambda"),
    (_outer(), "it is defined inside the function '_outer'"),
])
def test_unimportable_function_is_refused_before_any_rank_starts(fn, reason):
    pool = RankPool(2)
    try:
        with pytest.raises(TypeError) as info:
            pool.run(fn)
        msg = str(info.value)
        assert fn.__qualname__ in msg and reason in msg
        assert "cannot be sent to the ranks" in msg and "importable module" in msg
        assert pool.pids == [] and not pool.alive
    finally:
        pool.close()


_STDIN_SCRIPT = textwrap.dedent("""
    from fsdp_conformance.harness import RankPool, probes

    def work(ctx):
        return ctx.rank

    pool = RankPool(2)
    try:
        pool.run(work)
    except TypeError as exc:
        print("REFUSED:", exc)
    print("PIDS:", pool.pids)
    try:
        pool.run(probes.noop)
    except RuntimeError as exc:
        print("START:", exc)
    print("PIDS:", pool.pids)
    pool.close()
""")


def test_function_of_a_stdin_main_is_refused_before_any_rank_starts():
    proc = subprocess.run([PYTHON, "-"], input=_STDIN_SCRIPT, capture_output=True, text=True,
                          cwd=ROOT, env=env_for_subprocess(), timeout=120)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr
    refused = next(ln for ln in out.splitlines() if ln.startswith("REFUSED:"))
    assert "__main__:work cannot be sent to the ranks" in refused
    assert "'<stdin>', which is not a file" in refused and "importable module" in refused
    start = next(ln for ln in out.splitlines() if ln.startswith("START:"))
    assert "cannot start a RankPool" in start and "<stdin>" in start
    assert out.count("PIDS: []") == 2, out
    assert "Traceback" not in proc.stderr, proc.stderr


def test_case_whose_rank_died_once_runs_again_and_keeps_the_first_death(tmp_path):
    """A rank that aborts in the first attempt (a planted SIGABRT in the save call) does
    not decide the case: it runs once more on a fresh pool (which has no plant) and passes;
    the first death is kept, with the signal and the reason printed above the long stack."""
    case = Case(api="fsdp1.full", world_size=2)
    pool = _pool2()
    pool.run(cp.plant_abort, 1)
    result = runner.run_case(case, tmp_path, RunOptions(fault_timeout=30.0))
    if get_pool(2).alive:
        get_pool(2).run(cp.unplant_crash)
    checked = {p: v.status for p, v in result.properties.items() if v.status != "n/a"}
    assert checked and set(checked.values()) <= {"pass", "known"}, checked
    assert "rank(s) [1] died during the call" in result.rerun
    assert "SIGABRT" in result.rerun
    assert f"{cp.ABORT_REASON} 1" in result.rerun, result.rerun
    assert result.rerun.rstrip().endswith("(second attempt: completed)")


def test_case_whose_rank_dies_every_time_is_an_error_naming_the_death(tmp_path, monkeypatch):
    """A death that comes again in the second attempt is the case's error, as before."""
    from fsdp_conformance.run import lifecycle

    case = Case(api="fsdp1.full", world_size=2)
    real = lifecycle._attempt

    def plant_then_attempt(*args):
        get_pool(2).run(cp.plant_abort, 1)
        return real(*args)

    monkeypatch.setattr(lifecycle, "_attempt", plant_then_attempt)
    result = runner.run_case(case, tmp_path, RunOptions(fault_timeout=30.0))
    if get_pool(2).alive:
        get_pool(2).run(cp.unplant_crash)
    v = result.properties["P1"]
    assert v.status == "error" and "died during the call" in v.detail and "SIGABRT" in v.detail
    assert result.rerun.rstrip().endswith("(second attempt: a rank died again)")


def test_a_users_own_save_whose_rank_died_once_runs_again_and_keeps_the_first_death():
    """A rank that dies in a user's own save (a planted SIGABRT in FSDP.optim_state_dict,
    which the user's save calls) is not the user's code failing: the case runs once more on
    a fresh pool and passes, and the first death is kept (user/kinds.py, run/lifecycle.py)."""
    from examples.my_model import GatedNet, batch, loss, make_optimizer
    from fsdp_conformance.user import check
    from suites.plugin import userfns

    pool = _pool2()
    pool.run(cp.plant_abort, 1)
    try:
        [result] = check(GatedNet, batch, plan=["body", "head"], optimizer=make_optimizer,
                         loss=loss, fsdp_version=1, world_sizes=["2"], save_fn=userfns.save,
                         load_fn=userfns.load)
    finally:
        if get_pool(2).alive:
            get_pool(2).run(cp.unplant_crash)
    assert result.case.api == "custom:save"  # the load is the save's counterpart
    checked = {p: v.status for p, v in result.properties.items() if v.status != "n/a"}
    assert checked and set(checked.values()) <= {"pass", "known"}, checked
    assert "rank(s) [1] died during the call" in result.rerun and "SIGABRT" in result.rerun
    assert result.rerun.rstrip().endswith("(second attempt: completed)")
