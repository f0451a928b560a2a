"""The reference's naming rule for a tied param owned by a unit that does not hold its first
FQN (reference/layout_build.py, "Name of a tied parameter"), on the zoo's tied model."""
from __future__ import annotations

import pytest

from fsdp_conformance import reference as ref
from fsdp_conformance.zoo import build_model, model_spec


def _layout(plan, orig, ws=2):
    model = build_model("tied")
    return ref.build_layout(model, model_spec("tied").plans[plan], ws, use_orig_params=orig)


def test_orig_params_names_state_by_first_fqn_in_model():
    lay = _layout("split_out", orig=True)
    (out,) = [u for u in lay.units if u.name == "out"]
    slot = out.params[0]
    assert (slot.fqn, slot.aliases, slot.flat_fqn) == (
        "embed.weight", ("out.weight",), "out.weight")
    assert out.fqns == ("embed.weight",) and out.flat_fqns == ("out.weight",)
    assert lay.optimizer_keys()[0] == "embed.weight"  # named_parameters() order
    assert lay.canonical("out.weight") == "embed.weight"
    assert lay.find("out.weight")[0] is out


@pytest.mark.parametrize("plan,owner", [("split", "embed"), ("nested", "")])
def test_names_agree_when_the_owner_holds_the_first_fqn(plan, owner):
    for orig in (False, True):
        lay = _layout(plan, orig)
        (slot,) = [p for u in lay.units for p in u.params if p.aliases]
        assert (slot.fqn, slot.aliases, slot.flat_fqn) == ("embed.weight", ("out.weight",), "")
        assert [u.name for u in lay.units if slot in u.params] == [owner]


def test_flat_params_keep_the_unit_relative_name():
    lay = _layout("split_out", orig=False)
    (out,) = [u for u in lay.units if u.name == "out"]
    assert out.fqns == out.flat_fqns == ("out.weight",)
    assert out.params[0].aliases == ("embed.weight",)
    assert lay.optimizer_keys() == ["_flat_param", "out._flat_param"]
