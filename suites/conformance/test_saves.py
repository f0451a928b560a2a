"""Shared save sides (run/saves.py): round trips that differ only in how they load are
decided on one save exactly as each is on its own."""
from __future__ import annotations

import dataclasses
import re

from fsdp_conformance.cases import Case
from fsdp_conformance.options import RunOptions
from fsdp_conformance.run.execute import run_all, run_case
from fsdp_conformance.run.saves import by_save, save_key

SHARED = [
    Case(api="fsdp1.full", optimizer="adam", world_size=2, load_world_size=1),
    Case(api="fsdp2.sharded", optimizer="adam", model="unused", world_size=2, load_world_size=3),
    Case(api="fsdp1.full", optimizer="adam", world_size=2, load_world_size=3),
    Case(api="fsdp2.sharded", optimizer="adam", model="unused", world_size=2, load_world_size=1,
         nonstrict=True),
    Case(api="fsdp1.full", optimizer="adam", world_size=2, load_world_size=2, load_plan="root"),
]


def _decided(results) -> list:
    """Status, known entry, digest and detail of every property (memory addresses in the
    ranks' stack dumps blanked: they differ between any two runs)."""
    return [(r.case.id, {p: (v.status, re.sub(r"0x[0-9a-f]+", "0x_", v.detail), v.known,
                             v.digest) for p, v in r.properties.items()}) for r in results]


def test_save_keys_group_the_cases_whose_save_is_the_same():
    groups = by_save(list(enumerate(SHARED)))
    assert [[i for i, _ in g] for g in groups] == [[0, 2, 4], [1, 3]]
    base = Case(api="fsdp1.full", optimizer="adam")
    for other in (dataclasses.replace(base, world_size=3), dataclasses.replace(base, seed=1),
                  dataclasses.replace(base, plan="root"), dataclasses.replace(base, steps=0)):
        assert save_key(other) != save_key(base)  # another save
    for alone in (dataclasses.replace(base, fault="shape"), Case(api="custom:mine")):
        assert save_key(alone) is None
    assert len(by_save([(0, Case(api="custom:mine")), (1, Case(api="custom:mine"))])) == 2


def test_cases_sharing_a_save_are_decided_as_each_alone(tmp_path):
    """Same verdicts, details, known entries and digests as every case saving on its own;
    three of the five load from a kept save."""
    shared = run_all(SHARED, RunOptions(lanes=1))
    assert shared.shared_saves == 3
    alone = [run_case(c, tmp_path) for c in SHARED]
    assert _decided(shared.results) == _decided(alone)


TRAINED_ALIKE = [
    Case(api="fsdp1.full", optimizer="adam", world_size=2, load_world_size=1),
    Case(api="fsdp1.legacy_sharded", optimizer="adam", world_size=2),
    Case(api="fsdp1.dsd_sharded", optimizer="adam", world_size=2, load_world_size=3),
    Case(api="fsdp1.rekey", optimizer="adam", world_size=2, load_world_size=2, load_plan="root"),
    Case(api="fsdp2.full", optimizer="adagrad", world_size=2, load_world_size=3),
    Case(api="fsdp2.sharded", optimizer="adagrad", world_size=2, load_world_size=1),
]


def test_paths_that_train_alike_share_the_training_and_are_decided_as_each_alone(tmp_path):
    """The FSDP1 paths after the first (and the second FSDP2 path) save the state the first
    trained, kept on the ranks (sut/trained.py): same verdicts, details, known entries and
    digests as every case training on its own."""
    from fsdp_conformance.harness import get_pool
    from fsdp_conformance.sut.trained import drop

    assert [[i for i, _ in g] for g in by_save(list(enumerate(TRAINED_ALIKE)))] == [
        [0, 1, 2, 3], [4, 5]]
    get_pool(2).run(drop)  # nothing kept from an earlier test's case
    shared = run_all(TRAINED_ALIKE, RunOptions(lanes=1))
    assert shared.reused_trainings == 4 and shared.shared_saves == 0
    alone = [run_case(c, tmp_path) for c in TRAINED_ALIKE]
    assert _decided(shared.results) == _decided(alone)


def test_training_keys_leave_out_what_only_the_path_or_the_load_reads():
    from fsdp_conformance.run.saves import training_key

    base = Case(api="fsdp1.full", optimizer="adam", world_size=2)
    for same in (dataclasses.replace(base, api="fsdp1.legacy_scatter"),
                 dataclasses.replace(base, load_world_size=3, load_plan="root")):
        assert training_key(same) == training_key(base)
    for other in (dataclasses.replace(base, api="fsdp2.full"), dataclasses.replace(base, seed=1),
                  dataclasses.replace(base, use_orig_params=True),
                  dataclasses.replace(base, steps=3)):
        assert training_key(other) != training_key(base)
    for alone in (dataclasses.replace(base, fault="shape"), Case(api="custom:mine"),
                  Case(api="fsdp2.sharded", async_save=True),
                  Case(api="fsdp2.sharded", app_state=True),
                  Case(api="fsdp2.full", compiled="save")):
        assert training_key(alone) is None


def kept_after(ctx, change: bool) -> tuple[bool, bool]:
    """Rank function: train a case through sut/trained.py, change one element of the
    optimizer state or not, keep it; then ask for the same training again. (kept, reused)."""
    from fsdp_conformance.sut import roundtrip, trained
    from fsdp_conformance.sut.fsdp1 import train

    case = Case(api="fsdp1.full", optimizer="adam", world_size=ctx.world_size)
    trained.drop()
    tr = trained.trained(ctx, case, lambda: roundtrip.build(ctx, case, load_side=False),
                         lambda m, o, s: train(ctx, case, m, o, case.steps, sched=s))
    if change:
        st = next(iter(tr.optim.state.values()))
        st["exp_avg"].view(-1)[0] += 1e-3
    kept = trained.keep(tr)
    again = trained.trained(ctx, case, lambda: roundtrip.build(ctx, case, load_side=False),
                            lambda m, o, s: train(ctx, case, m, o, case.steps, sched=s))
    trained.drop()
    return kept, again.reused


def test_a_state_changed_after_training_is_not_kept(rank_pool):
    """A save call that changed the trained state would leak into the next path's case: the
    state is kept only if it still equals its snapshot bitwise, and then reused."""
    pool = rank_pool(2)
    assert pool.run(kept_after, False) == [(True, True)] * 2
    assert pool.run(kept_after, True) == [(False, False)] * 2
