"""The model of FSDP1 stepping an optimizer on each rank's shards (properties/shard_training.py),
checked without FSDP: for an elementwise optimizer it must train as the single-process run
does (the shards are only a partition of the elements), for Adafactor it must not, and what it
saves is the reference's FSDP1 full dict of 1-D shards (an unfactored variance)."""
from __future__ import annotations

import pytest

from fsdp_conformance.cases import Case
from fsdp_conformance.properties.baseline import local_run
from fsdp_conformance.properties.shard_training import shard_run
from fsdp_conformance.properties.statediff import diff_state_dicts

TOL = {"exact": False, "rtol": 1e-12, "atol": 1e-15}


def _same(expected, actual) -> list:
    return diff_state_dicts(expected, actual, **TOL)


@pytest.mark.parametrize("orig", [False, True])
@pytest.mark.parametrize("ws,load_ws", [(2, 3), (3, 2), (1, 2)])
def test_an_elementwise_optimizer_on_shards_trains_as_on_whole_params(ws, load_ws, orig):
    case = Case(api="fsdp1.full", optimizer="adam", world_size=ws, load_world_size=load_ws,
                use_orig_params=orig)
    whole, shards = local_run(case), shard_run(case, lambda full: full)
    assert _same(whole.params_at_save, shards.params_at_save) == []
    assert _same(whole.optim_at_save["state"], shards.optim_at_save["state"]) == []
    assert _same(whole.params_at_end, shards.params_at_end) == []
    assert _same(whole.optim_at_end["state"], shards.optim_at_end["state"]) == []
    assert [round(x, 9) for x in whole.losses] == [round(x, 9) for x in shards.losses]


@pytest.mark.parametrize("orig", [False, True])
def test_adafactor_on_shards_keeps_an_unfactored_variance_and_trains_otherwise(orig):
    case = Case(api="fsdp1.full", optimizer="adafactor", world_size=2, load_world_size=3,
                use_orig_params=orig)
    whole, shards = local_run(case), shard_run(case, lambda full: full)
    w = "block.0.weight"
    assert set(whole.optim_at_save["state"][w]) == {"step", "row_var", "col_var"}
    saved = shards.optim_at_save["state"][w]
    assert set(saved) == {"step", "variance"}
    assert tuple(saved["variance"].shape) == tuple(whole.params_at_save[w].shape)
    assert _same(whole.params_at_save, shards.params_at_save)  # trained otherwise
    assert _same(whole.params_at_end, shards.params_at_end)


def test_the_shards_depend_on_the_world_size():
    """Adafactor scales a step by the RMS of the shard it steps: other shards, other steps."""
    runs = [shard_run(Case(api="fsdp1.full", optimizer="adafactor", world_size=n,
                           load_world_size=n), lambda full: full) for n in (2, 3)]
    assert _same(runs[0].params_at_save, runs[1].params_at_save)


def test_what_the_model_does_not_cover_is_refused():
    case = Case(api="fsdp1.full", optimizer="adafactor", world_size=2, groups=2)
    with pytest.raises(ValueError, match="2 param groups"):
        shard_run(case, lambda full: full)
