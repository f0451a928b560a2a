"""P1 and P3 are each one function (properties/saved.py, properties/loaded.py) that every
observer hands its observations and the family's reference; their rules, checked on the
reference's own dicts (no ranks): a wrong value on one rank fails naming it, a rank that
raised beside a wrong value elsewhere is a failure that shows both (a second bug never
hides behind an error), nothing compared is n/a, never a pass."""
from __future__ import annotations

import copy

import torch

from fsdp_conformance.properties.families import FSDP1
from fsdp_conformance.properties.loaded import LoadedState, p3_loaded
from fsdp_conformance.properties.saved import SavedDict, p1_saved
from fsdp_conformance.properties.verdict import error, na
from fsdp_conformance.reference import layout_from_spec, shard_full

UNITS = [("", [("a.w", (4, 3)), ("a.b", (4,))]), ("u1", [("u1.c.w", (5, 2))])]
WS = 2


def _layout():
    return layout_from_spec(UNITS, WS, use_orig_params=False, strategy="FULL_SHARD",
                            shard_world_size=None, dtype=torch.float64)


def _full(layout):
    g = torch.Generator().manual_seed(0)
    state = {}
    for fqn in layout.fqns():
        _, slot = layout.find(fqn)
        state[fqn] = {"exp_avg": torch.randn(slot.shape, generator=g, dtype=torch.float64),
                      "step": torch.tensor(2.0)}
    return {"state": state, "param_groups": [{"lr": 0.1, "params": list(layout.fqns())}]}


def _shards(layout, full):
    return [shard_full(layout, full, r, per_element={"exp_avg"}) for r in range(WS)]


def _nudged(d):
    d = copy.deepcopy(d)
    st = next(iter(d["state"].values()))
    st["exp_avg"].view(-1)[0] += 1.0
    return d


def test_p3_passes_the_reference_shards_and_fails_a_nudged_rank_by_name():
    layout = _layout()
    full = _full(layout)
    shards = _shards(layout, full)
    ok = [LoadedState(rank=r, got=shards[r], source=full, own=shards[r]) for r in range(WS)]
    v = p3_loaded(FSDP1, layout, ok)
    assert v.status == "pass", v.detail
    assert "own state" in v.detail
    bad = [ok[0], LoadedState(rank=1, got=_nudged(shards[1]), source=full)]
    v = p3_loaded(FSDP1, layout, bad)
    assert v.status == "fail"
    assert v.detail.startswith("rank 1 after loading differs from reference.shard_full"), v.detail


def test_p3_a_rank_that_raised_beside_a_wrong_rank_is_a_failure_showing_both():
    layout = _layout()
    full = _full(layout)
    shards = _shards(layout, full)
    raised = LoadedState(rank=0, problem=error("torch raised while loading on rank 0:\nBoom"))
    v = p3_loaded(FSDP1, layout, [raised, LoadedState(rank=1, got=_nudged(shards[1]),
                                                      source=full)])
    assert v.status == "fail" and "rank 1 after loading differs" in v.detail
    assert "Boom" in v.detail
    v = p3_loaded(FSDP1, layout, [raised, LoadedState(rank=1, got=shards[1], source=full)])
    assert v.status == "error" and "Boom" in v.detail


def test_p3_nothing_compared_is_na_and_a_reference_check_alone_does_not_count():
    layout = _layout()
    full = _full(layout)
    shards = _shards(layout, full)
    states = [LoadedState(rank=r, label="set_full", problem=na("path set_full was not run"))
              for r in range(WS)]
    states += [LoadedState(rank=r, source=full, own=shards[r]) for r in range(WS)]
    v = p3_loaded(FSDP1, layout, states)
    assert (v.status, v.detail) == ("n/a", "path set_full was not run")
    # the reference's own check still fails when the own state disagrees
    states[-1] = LoadedState(rank=1, source=full, own=_nudged(shards[1]))
    v = p3_loaded(FSDP1, layout, states)
    assert v.status == "fail"
    assert "reference.shard_full(full) on rank 1 differs from the rank's own state" in v.detail


def test_p3_own_state_differs():
    layout = _layout()
    full = _full(layout)
    shards = _shards(layout, full)
    v = p3_loaded(FSDP1, layout, [LoadedState(rank=0, got=shards[0], source=full,
                                              own=_nudged(shards[0]))])
    assert v.status == "fail"
    assert "rank 0 after loading differs from the rank's own state before saving" in v.detail
def test_p1_gather_of_the_locals_passes_and_a_nudged_save_fails_by_rank():
    layout = _layout()
    full = _full(layout)
    locals_ = _shards(layout, full)
    v = p1_saved(FSDP1, layout, locals_, [SavedDict(rank=0, label="x.full", got=full)])
    assert v.status == "pass", v.detail
    v = p1_saved(FSDP1, layout, locals_, [SavedDict(rank=0, label="x.full", got=_nudged(full))])
    assert v.status == "fail"
    assert v.detail.startswith("x.full on rank 0 differs from reference.gather_full"), v.detail


def test_p1_rank0_only_elsewhere_empty_and_errors_beside_differences():
    layout = _layout()
    full = _full(layout)
    locals_ = _shards(layout, full)
    saves = [SavedDict(rank=0, label="p", got=full, rank0_only=True),
             SavedDict(rank=1, label="p", got={}, rank0_only=True)]
    assert p1_saved(FSDP1, layout, locals_, saves).status == "pass"
    saves[1] = SavedDict(rank=1, label="p", got=full, rank0_only=True)
    v = p1_saved(FSDP1, layout, locals_, saves)
    assert v.status == "fail" and "p on rank 1 (rank 0 only) is not empty" in v.detail
    raised = SavedDict(rank=1, label="p", problem=error("torch raised in p on rank 1:\nBoom"))
    v = p1_saved(FSDP1, layout, locals_, [SavedDict(rank=0, label="p", got=_nudged(full)),
                                          raised])
    assert v.status == "fail" and "Boom" in v.detail
    v = p1_saved(FSDP1, layout, locals_, [raised])
    assert v.status == "error"
    assert p1_saved(FSDP1, layout, locals_, [SavedDict(rank=0, problem=na("skipped"))]) \
        .status == "n/a"
