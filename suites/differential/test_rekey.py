"""Differential tests of P5 rekey: ``FSDP.rekey_optim_state_dict`` (PARAM_ID <-> PARAM_NAME)
on the rank pool against ``reference.rekey_to_ids`` / ``rekey_to_names``, in both uses of
torch's docstring: FSDP's full dict -> a plain model's optimizer, and a plain optimizer's
dict -> ``shard_full_optim_state_dict`` of the FSDP model. Bitwise; see
``properties/rekey_props.py`` for the list of comparisons."""
from __future__ import annotations

import pytest

from fsdp_conformance.cases import Case
from fsdp_conformance.properties.rekey_props import p5_rekey, to_plain
from fsdp_conformance.sut import rekey

from .test_fsdp1 import _assert_ok


def _p5(case, obs):
    return p5_rekey(case, to_plain=to_plain(case, obs[0]), from_plain=obs)


@pytest.mark.parametrize("ws", [1, 2, 3])
@pytest.mark.parametrize("orig", [False, True], ids=["flat", "orig"])
@pytest.mark.parametrize("opt", ["adam", "sgd_momentum", "adagrad"])
@pytest.mark.parametrize("model", ["mlp", "tied", "frozen"])
def test_rekey_both_ways(rank_pool, model, opt, orig, ws):
    case = Case(model=model, plan="nested", optimizer=opt, use_orig_params=orig, world_size=ws,
                groups=2)
    obs = rank_pool(ws).run(rekey.observe, case, seed=case.seed)
    _assert_ok(_p5(case, obs), f"P5 {case.id}", case, "P5")


@pytest.mark.parametrize("orig", [False, True], ids=["flat", "orig"])
def test_rekey_one_group_default_optim_input(rank_pool, orig):
    """One group holding model.parameters() in order: the ``optim_input=None`` path of torch's
    rekey (ids = positions in ``model.parameters()``) runs and is compared too."""
    case = Case(model="mlp", plan="nested", optimizer="adam", use_orig_params=orig, world_size=2)
    obs = rank_pool(2).run(rekey.observe, case, seed=case.seed)
    assert "n/a" not in obs[0]["a_ids_legacy"], obs[0]["a_ids_legacy"]
    _assert_ok(_p5(case, obs), f"P5 {case.id}", case, "P5")


def test_p5_catches_wrong_rekeys(rank_pool):
    """P5 is not vacuous: a changed value, a swapped key or a dropped param fails it."""
    import copy

    case = Case(model="mlp", plan="nested", optimizer="adam", use_orig_params=True,
                world_size=2, groups=2)
    obs = rank_pool(2).run(rekey.observe, case, seed=case.seed)
    assert _p5(case, obs).status == "pass"

    bad = copy.deepcopy(obs)
    bad[0]["a_ids"]["state"][0]["exp_avg"].view(-1)[3] += 1e-12
    v = _p5(case, bad)
    assert v.status == "fail" and "state[0]['exp_avg']" in v.detail, v.detail

    bad = copy.deepcopy(obs)
    names = bad[1]["b_names"]["state"]
    names["inp.weight"], names["block.0.weight"] = names["block.0.weight"], names["inp.weight"]
    v = _p5(case, bad)
    assert v.status == "fail" and "rank 1" in v.detail, v.detail

    bad = copy.deepcopy(obs)
    del bad[0]["b_reloaded"]["state"][2]
    v = _p5(case, bad)
    assert v.status == "fail" and "b_reloaded" not in v.detail and "missing" in v.detail, v.detail
