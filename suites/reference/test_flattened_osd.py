"""``reference.unflatten_osd``: torch's flattened optimizer state dict
(``flatten_optimizer_state_dict=True``) in the nested form, and its refusals; P11 with no
rank loaded."""
from __future__ import annotations

import pytest
import torch

from fsdp_conformance import reference as ref

GROUPS = [["inp.weight", "block.0.weight"], ["head.weight"]]


def _flat() -> dict:
    return {
        "state.inp.weight.step": torch.tensor(2.0), "state.inp.weight.exp_avg": torch.ones(3),
        "state.block.0.weight.step": torch.tensor(2.0),
        "state.block.0.weight.exp_avg": torch.zeros(2),
        "param_groups.inp.weight.lr": 0.1, "param_groups.inp.weight.betas": (0.9, 0.99),
        "param_groups.block.0.weight.lr": 0.1, "param_groups.block.0.weight.betas": (0.9, 0.99),
        "param_groups.head.weight.lr": 0.5, "param_groups.head.weight.betas": (0.8, 0.9),
    }


def test_unflatten_gives_the_nested_form_with_the_optimizers_groups():
    out = ref.unflatten_osd(_flat(), GROUPS)
    assert list(out["state"]) == ["inp.weight", "block.0.weight"]  # head.weight: no state
    assert torch.equal(out["state"]["block.0.weight"]["exp_avg"], torch.zeros(2))
    assert out["param_groups"] == [
        {"lr": 0.1, "betas": (0.9, 0.99), "params": ["inp.weight", "block.0.weight"]},
        {"lr": 0.5, "betas": (0.8, 0.9), "params": ["head.weight"]}]


@pytest.mark.parametrize("change,match", [
    (lambda d: d.update({"param_groups.block.0.weight.lr": 0.2}), "disagree on 'lr'"),
    (lambda d: d.pop("param_groups.head.weight.lr") and d.pop("param_groups.head.weight.betas"),
     "no 'param_groups.head.weight.\\*' key"),
    (lambda d: d.update({"state.tail.weight.step": 1}), "'state.tail.weight.step' names no param"),
    (lambda d: d.update({"extra.inp.weight": 1}), "neither 'state.\\*' nor 'param_groups.\\*'"),
])
def test_unflatten_refuses_what_no_flattening_of_a_nested_dict_gives(change, match):
    flat = _flat()
    change(flat)
    with pytest.raises(ValueError, match=match):
        ref.unflatten_osd(flat, GROUPS)


def test_p11_is_the_load_error_when_no_rank_loaded():
    from fsdp_conformance.cases import Case
    from fsdp_conformance.properties.baseline import local_run
    from fsdp_conformance.properties.groups import loaded_groups, p11_groups
    from fsdp_conformance.sut.records import LoadRecord, RecordedError

    case = Case(api="fsdp2.full", optimizer="adam", world_size=2)
    local = local_run(case)
    full = local.optim_at_save  # what a correct save gives, nested and named
    boom = RecordedError(traceback="Traceback (most recent call last):\nKeyError: 'state'\n",
                         exc_type="KeyError")
    loaded = [LoadRecord(rank=r, keys=[], meta=[], loaded=boom) for r in range(2)]
    v = p11_groups(full, loaded_groups(loaded), at_save=local.optim_at_save)
    assert v.status == "error" and "load failed on every rank" in v.detail
    assert "KeyError: 'state'" in v.detail
    fine = [LoadRecord(rank=0, keys=[], meta=[], loaded=full), loaded[1]]
    assert p11_groups(full, loaded_groups(fine), at_save=local.optim_at_save).status == "pass"  # one rank loaded: it is compared
