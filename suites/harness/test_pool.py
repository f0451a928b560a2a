"""RankPool: basics at world sizes 1-4, seeding, and every failure mode."""
from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import threading
import time

import pytest
import torch

from fsdp_conformance.harness import (RankDied, RankError, RankPool, RankTimeout, get_pool,
                                      probes)
from suites.conftest import PYTHON, ROOT, env_for_subprocess, pid_alive


@pytest.mark.parametrize("ws", [1, 2, 3, 4])
def test_results_in_rank_order_and_group_works(rank_pool, ws):
    pool = rank_pool(ws)
    out = pool.run(probes.whoami)
    assert out == [(r, ws, ws * (ws - 1) // 2) for r in range(ws)]


def test_run_each_gives_each_rank_its_own_args(rank_pool):
    pool = rank_pool(3)
    ts = [torch.arange(r + 1, dtype=torch.float64) for r in range(3)]
    out = pool.run_each(probes.tensor_roundtrip, [(t,) for t in ts])
    assert len(out) == 3
    for r, (t, rank) in enumerate(out):
        assert rank == r
        assert torch.equal(t, ts[r]) and t.dtype == torch.float64


def test_registry_reuses_pools_and_pools_coexist(rank_pool):
    assert rank_pool(2) is rank_pool(2)
    a, b = rank_pool(2), rank_pool(3)
    a.run(probes.noop), b.run(probes.noop)
    assert a.alive and b.alive
    assert not set(a.pids) & set(b.pids)
    assert a.run(probes.whoami)[0][2] == 1 and b.run(probes.whoami)[0][2] == 3


def test_same_seed_same_bits_different_seed_different_bits(rank_pool):
    pool = rank_pool(2)
    first = pool.run(probes.random_bits, seed=5)
    pool.run(probes.random_bits, seed=99)
    second = pool.run(probes.random_bits, seed=5)
    other = pool.run(probes.random_bits, seed=6)
    for a, b in zip(first, second):
        assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])
    # every rank got the same seed
    assert torch.equal(first[0][2], first[1][2])
    assert not torch.equal(first[0][2], other[0][2])


def test_every_rank_hashes_strings_with_the_fixed_seed(rank_pool):
    """torch orders some dicts and sets by string hash; a random per-process seed made a
    case's verdict text differ between runs. The ranks hash as ``PYTHONHASHSEED=0`` does,
    in a controller whose own seed is random (as pytest's is)."""
    from fsdp_conformance.harness.pool import RANK_HASH_SEED

    text = "fc1.weight"
    want = subprocess.run([PYTHON, "-c", f"print(hash({text!r}))"], capture_output=True,
                          text=True, check=True,
                          env={**env_for_subprocess(), "PYTHONHASHSEED": RANK_HASH_SEED})
    out = rank_pool(2).run(probes.string_hash, text)
    assert out == [(int(want.stdout), RANK_HASH_SEED)] * 2


def test_every_rank_computes_on_the_threads_torchrun_gives_it(rank_pool):
    """Several ranks share the cores: each gets 1 intra-op thread, as torchrun gives it,
    unless the controller's environment sets ``OMP_NUM_THREADS`` (then that). The
    controller itself keeps torch's default."""
    import torch

    want = int(os.environ.get("OMP_NUM_THREADS") or 1)
    assert rank_pool(2).run(probes.threads) == [(want, str(want))] * 2
    if "OMP_NUM_THREADS" not in os.environ and (os.cpu_count() or 1) > 1:
        assert torch.get_num_threads() > 1, "the controller's own threads must be left alone"


def test_a_ranks_start_up_objects_are_frozen_out_of_garbage_collection(rank_pool):
    """torch's modules and the process group are moved to the permanent generation when the
    rank is ready, so the full collection before every peak measurement is cheap: the
    collector traverses what calls made, not the ~290,000 objects of the imports."""
    for frozen, tracked in rank_pool(2).run(probes.collector):
        assert frozen > 100_000 and tracked < 20_000, (frozen, tracked)


def test_exception_on_one_rank_names_it_and_pool_stays_usable(rank_pool):
    pool = rank_pool(3)
    pids = pool.pids
    with pytest.raises(RankError) as info:
        pool.run(probes.raise_on, 1)
    err = info.value
    assert err.ranks == [1]
    assert "planted failure on rank 1" in str(err) and "Traceback" in str(err)
    assert "raise_on" in str(err)
    assert pool.run(probes.whoami)[2] == (2, 3, 3)
    assert pool.pids == pids, "a clean exception must not rebuild the pool"


def test_a_failures_log_tail_holds_only_what_the_failing_call_printed(rank_pool):
    from suites.harness import crash_probes

    pool = rank_pool(2)
    pool.run(crash_probes.say, "an earlier call's line")
    with pytest.raises(RankError) as info:
        pool.run(crash_probes.say_then_raise_on, "the failing call's line", 1)
    text = str(info.value)
    assert "[rank log, last lines]" in text and "the failing call's line" in text
    assert "an earlier call's line" not in text  # another call's output is not this failure's


def test_exception_while_others_wait_in_collective_rebuilds(rank_pool):
    pool = rank_pool(3)
    pids = pool.pids
    with pytest.raises(RankError) as info:
        pool.run(probes.raise_before_collective, 0, timeout=60)
    err = info.value
    assert not isinstance(err, RankTimeout)
    kinds = {f.rank: f.kind for f in err.failures}
    assert kinds[0].startswith("exception")
    assert kinds[1] == kinds[2] == "stuck-after-error"
    assert "raise_before_collective" in err.failures[1].detail  # their stacks are shown
    assert pool.run(probes.whoami) == [(r, 3, 3) for r in range(3)]
    assert set(pool.pids).isdisjoint(pids)
    assert not any(pid_alive(p) for p in pids)


def test_dead_rank_reports_exit_code_and_pool_is_rebuilt(rank_pool):
    pool = rank_pool(4)
    pids = pool.pids
    with pytest.raises(RankDied) as info:
        pool.run(probes.exit_on, 2, 7)
    died = [f for f in info.value.failures if f.kind == "died"]
    assert [f.rank for f in died] == [2]
    assert "exited with code 7" in died[0].detail
    assert pool.run(probes.whoami) == [(r, 4, 6) for r in range(4)]
    assert not any(pid_alive(p) for p in pids)


def test_killed_rank_reports_signal(rank_pool):
    pool = rank_pool(2)
    victim = pool.pids[1]
    import os

    os.kill(victim, signal.SIGKILL)
    time.sleep(0.2)
    with pytest.raises(RankDied) as info:
        pool.run(probes.whoami)
    assert "SIGKILL" in str(info.value)
    assert pool.run(probes.whoami) == [(0, 2, 1), (1, 2, 1)]


def test_skipped_collective_times_out_with_every_stack_then_rebuilds(rank_pool):
    pool = rank_pool(3)
    pids = pool.pids
    t0 = time.monotonic()
    with pytest.raises(RankTimeout) as info:
        pool.run(probes.skip_collective, 1, timeout=3)
    assert time.monotonic() - t0 < 3 + 10
    err = info.value
    assert err.ranks == [0, 2]  # rank 1 skipped the collective and returned
    for f in err.failures:
        assert f.kind == "hung"
        assert "skip_collective" in f.detail and "all_reduce" in f.detail
    assert not any(pid_alive(p) for p in pids)
    assert pool.run(probes.whoami) == [(r, 3, 3) for r in range(3)]


def test_unpicklable_result_is_an_error_not_a_hang(rank_pool):
    pool = rank_pool(1)
    with pytest.raises(RankError, match="could not be sent"):
        pool.run(probes.unpicklable_result)
    assert pool.run(probes.whoami) == [(0, 1, 0)]


def test_non_importable_function_is_refused():
    with RankPool(1) as pool:
        with pytest.raises(TypeError, match="importable"):
            pool.run(lambda ctx: None)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="world_size"):
        RankPool(0)
    with pytest.raises(ValueError, match="nccl"):
        RankPool(2, "nccl") if not torch.cuda.is_available() else RankPool(99, "nccl")
    with RankPool(2) as pool:
        with pytest.raises(ValueError, match="per_rank_args has 1"):
            pool.run_each(probes.noop, [()])


def test_close_stops_every_rank():
    pool = RankPool(3)
    with pool:
        pids = pool.pids
        pool.run(probes.noop)
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in pids)



def test_a_pool_killed_while_a_lane_marks_it_broken_closes_each_handle_once():
    """An interrupted run kills its pools from the main thread while a lane thread, seeing
    its ranks die, marks the same pool broken: one of the two closes the generation's
    handles, the other finds none (two closes of one descriptor number close whatever
    reused it: seen as EBADF in the scratch removal of an interrupted CI run)."""
    pool = RankPool(2)
    pool.run(probes.noop)
    inside, release = threading.Event(), threading.Event()
    closers: dict[int, list[str]] = {}
    for proc in pool._procs:
        kill = proc.kill

        def held_kill(kill=kill):
            if threading.current_thread().name == "killer":
                inside.set()
                assert release.wait(10)
            kill()
        proc.kill = held_kill
    for conn in pool._conns + pool._lifelines:
        close = conn.close

        def counted_close(conn=conn, close=close):
            closers.setdefault(id(conn), []).append(threading.current_thread().name)
            close()
        conn.close = counted_close
    handles = len(pool._conns) + len(pool._lifelines)
    killer = threading.Thread(target=pool.close, kwargs={"kill": True}, name="killer")
    killer.start()
    try:
        assert inside.wait(10), "close(kill=True) did not reach the ranks"
        pool._mark_broken()  # what a lane does when its call sees the ranks die
    finally:
        release.set()
        killer.join(20)
    assert not killer.is_alive()
    assert len(closers) == handles
    assert all(names == ["killer"] for names in closers.values()), closers

_CHILD = textwrap.dedent("""
    import signal, sys, time
    from fsdp_conformance.harness import get_pool, probes
    if __name__ == "__main__":
        # a shell without job control starts background jobs with SIGINT ignored, and Python
        # keeps an inherited SIG_IGN: give the child Ctrl-C back, as a terminal would have it
        signal.signal(signal.SIGINT, signal.default_int_handler)
        pool = get_pool(3)
        pool.run(probes.noop)
        print(" ".join(map(str, pool.pids)), flush=True)
        if sys.argv[1] == "block":
            pool.run(probes.sleep, 600, timeout=900)
        # "exit": leave without closing; atexit must stop the ranks
""")


def _start_child(mode: str, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    proc = subprocess.Popen([PYTHON, str(script), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=env_for_subprocess())
    line = proc.stdout.readline()
    assert line.strip(), f"child printed no pids; stderr:\n{proc.stderr.read()}"
    return proc, [int(x) for x in line.split()]


def _gone_within(pids, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(pid_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def test_no_rank_outlives_a_controller_that_exits_without_closing(tmp_path):
    proc, pids = _start_child("exit", tmp_path)
    assert proc.wait(60) == 0
    assert _gone_within(pids, 10)


def test_no_rank_outlives_a_sigkilled_controller(tmp_path):
    proc, pids = _start_child("block", tmp_path)
    time.sleep(0.5)
    proc.kill()
    proc.wait(30)
    assert _gone_within(pids, 10), "ranks survived their SIGKILLed controller"


def test_ctrl_c_tears_everything_down(tmp_path):
    proc, pids = _start_child("block", tmp_path)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) != 0
    assert "KeyboardInterrupt" in proc.stderr.read()
    assert _gone_within(pids, 10)


def test_get_pool_outside_torchrun_is_a_spawned_pool():
    pool = get_pool(1)
    assert isinstance(pool, RankPool)


def test_ranks_have_the_torchrun_environment(rank_pool):
    """Trainers read RANK/WORLD_SIZE/LOCAL_RANK/... (accelerate's PartialState): without them
    a rank looks like a single process."""
    out = rank_pool(3).run(probes.torchrun_env)
    for r, env in enumerate(out):
        assert env["RANK"] == env["LOCAL_RANK"] == str(r)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "3"
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
    assert len({e["MASTER_PORT"] for e in out}) == 1
