"""``inspect`` on checkpoints real FSDP writes on a 2-rank pool (zoo ``mlp``, plan
``nested``, 2 Adam steps): each rank's FSDP1 ``optim.state_dict()`` (int ids; flat and
original params), the SHARDED ``optim_state_dict`` saved with DCP, and each rank's FSDP2
sharded ``get_optimizer_state_dict`` (DTensors) ``torch.save``d. The layout the summary
implies must be the one the run used, and the sizes must add up to the model's params."""
from __future__ import annotations

import math

import pytest
import torch

from fsdp_conformance.harness.probes import fsdp1_checkpoint
from fsdp_conformance.inspection import inspect_path
from fsdp_conformance.zoo import build_model
from suites.inspect.ranks import fsdp2_sharded_rank_files

WS = 2
SHAPES = {n: tuple(p.shape) for n, p in build_model("mlp", 0).named_parameters()}


@pytest.fixture(scope="module", params=[False, True], ids=["flat", "orig"])
def fsdp1_saved(request, rank_pool, tmp_path_factory):
    root = tmp_path_factory.mktemp("orig" if request.param else "flat")
    res = rank_pool(WS).run(fsdp1_checkpoint, "mlp", "nested", request.param, str(root / "dcp"),
                            timeout=120)
    (root / "ids").mkdir()
    for r, out in enumerate(res):
        torch.save(out["local"], root / "ids" / f"optim_rank{r}.pt")
    return root, request.param, res[0]["keys"]


def test_fsdp1_local_dicts_imply_their_layout(fsdp1_saved):
    root, uop, keys = fsdp1_saved
    s = inspect_path(root / "ids")
    assert (s.format, s.world_size, s.key_type) == ("rank-files", WS, "int")
    assert [p.key for p in s.params] == list(range(len(keys)))
    assert s.warnings == () and {p.step for p in s.params} == {2.0}
    sizes = [next(st for st in p.state if st.name == "exp_avg").rank_numel for p in s.params]
    if not uop:  # one FlatParameter per unit, padded to a multiple of WS, split evenly
        assert any("FlatParameter shards" in line for line in s.layout)
        assert all(len(set(n)) == 1 for n in sizes)
        flat = sum(n[0] for n in sizes) * WS
        assert flat >= sum(math.prod(v) for v in SHAPES.values()) and flat % WS == 0
    else:  # original params: the slices of each param add up to it (no padding in state)
        assert any("per-rank slices" in line for line in s.layout)
        assert [sum(n or 0 for n in ns) for ns in sizes] == [math.prod(SHAPES[k]) for k in keys]
        partial = [f for f in s.findings if f.code == "partial-ranks"]
        assert (len(partial) == 1 and partial[0].level == "note") == \
            any(None in ns for ns in sizes)


def test_fsdp1_sharded_dcp(fsdp1_saved):
    s = inspect_path(fsdp1_saved[0] / "dcp", values=True)
    assert (s.world_size, s.location, s.findings) == (WS, '["optim"]', ())
    assert sorted(p.key for p in s.params) == sorted(SHAPES)  # FQNs, flat or not
    for p in s.params:
        assert {st.name: st.shape for st in p.state} == \
            {"step": (), "exp_avg": SHAPES[p.key], "exp_avg_sq": SHAPES[p.key]}


def test_fsdp2_sharded_dtensors_saved_per_rank(rank_pool, tmp_path):
    fqns = rank_pool(WS).run(fsdp2_sharded_rank_files, str(tmp_path), timeout=120)[0]
    s = inspect_path(tmp_path)
    assert (s.world_size, s.key_type, s.warnings) == (WS, "fqn", ())
    assert sorted(p.key for p in s.params) == fqns == sorted(SHAPES)
    assert any("DTensor" in line and "S(0)" in line for line in s.layout)
    for p in s.params:
        st = next(st for st in p.state if st.name == "exp_avg")
        assert (st.kind, st.shape, st.world_size) == ("dtensor", SHAPES[p.key], WS)
        assert sum(st.rank_numel) == math.prod(SHAPES[p.key])
    one = inspect_path(tmp_path / "optim_rank1.pt")
    assert one.world_size == WS and [f.code for f in one.warnings] == ["one-rank-file"]


def test_fsdp2_dtensors_of_one_rank_are_the_whole_state(rank_pool, tmp_path):
    rank_pool(1).run(fsdp2_sharded_rank_files, str(tmp_path), timeout=120)
    s = inspect_path(tmp_path / "optim_rank0.pt")
    assert s.world_size == 1 and s.warnings == ()
    assert s.layout == ("8 params as DTensor saved at world size 1: the file holds the whole "
                        "state",)


def test_an_app_states_scheduler_and_step_are_shown_beside_the_optimizer(rank_pool, tmp_path):
    """A trainer's DCP app state (model, optimizer, LR scheduler, step) on 2 ranks: inspect
    finds the optimizer under 'app.optim' and shows what the resume needs beside it: the
    scheduler's fields and the step, read from the checkpoint."""
    from suites.inspect.ranks import fsdp2_app_state_dcp

    rank_pool(WS).run(fsdp2_app_state_dcp, str(tmp_path / "ckpt"), timeout=120)
    s = inspect_path(tmp_path / "ckpt")
    assert s.description == "DCP checkpoint, optimizer dict under 'app.optim'"
    sched = next(line for line in s.layout if line.startswith("beside the optimizer, "
                                                                "app.scheduler: "))
    assert "last_epoch 3" in sched and "gamma 0.9" in sched and "base_lrs [0.1]" in sched
    assert "beside the optimizer, app: step 3" in s.layout
    assert not any("app.model" in line for line in s.layout)  # the weights are no such field
