"""Lanes (run/execute.py): cases decided side by side on pools of their own give the same
verdicts, details and order as one at a time; the controller's seeded draws never mix."""
from __future__ import annotations

import sys
import threading

import torch

from fsdp_conformance.cases import Case
from fsdp_conformance.harness import live_pools
from fsdp_conformance.options import RunOptions
from fsdp_conformance.run.execute import run_all
from fsdp_conformance.zoo import build_model, make_batch

from suites.conftest import pid_alive

CASES = [
    Case(api="fsdp1.full", optimizer="adam", world_size=2, load_world_size=1),
    Case(api="fsdp2.sharded", optimizer="adamw", world_size=1, load_world_size=2),
    Case(api="fsdp1.legacy_full", optimizer="sgd", world_size=2, fault="missing_fqn"),
    Case(api="fsdp2.full", optimizer="adagrad", world_size=2),
    Case(api="fsdp1.rekey", optimizer="adadelta", world_size=1, load_world_size=2),
]


def _decided(results) -> list:
    return [(r.case.id, {p: (v.status, v.detail, v.known) for p, v in r.properties.items()})
            for r in results]


def test_two_lanes_decide_every_case_as_one_lane_does():
    one = run_all(CASES, RunOptions(lanes=1))
    two = run_all(CASES, RunOptions(lanes=2))
    assert not one.interrupted and not two.interrupted
    assert [r.case.id for r in two.results] == [c.id for c in CASES]
    assert _decided(two.results) == _decided(one.results)
    assert {p.world_size for p in live_pools()} >= {1, 2}


def test_an_interrupted_lane_run_kills_every_rank_and_keeps_what_it_decided():
    seen: list[int] = []

    def on_result(r) -> None:
        for pool in live_pools():
            seen.extend(pool.pids)
        raise KeyboardInterrupt

    run = run_all(CASES, RunOptions(lanes=2), on_result=on_result)
    assert run.interrupted == f"interrupted (Ctrl-C) after 1 of {len(CASES)} cases"
    assert len(run.results) == 1 and run.results[0].case in CASES
    assert seen and not any(pid_alive(p) for p in seen)
    assert not live_pools()


def test_seeded_draws_on_two_threads_are_those_of_one():
    def draw() -> list:
        return [build_model("mlp", seed=s).state_dict() for s in range(3)] + \
               [make_batch("tied", 0, s, 4) for s in range(3)]

    want = draw()
    got: list = []
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as Python can
    try:
        threads = [threading.Thread(target=lambda: got.extend(draw() for _ in range(20)))
                   for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert len(got) == 40
    for one in got:
        for a, b in zip(one, want):
            if isinstance(a, dict):
                assert all(torch.equal(a[k], b[k]) for k in b)
            else:
                assert torch.equal(a, b)
