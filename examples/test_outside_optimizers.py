"""Optimizers from outside torch under the plugin (``outside_optimizers.py``), through the
built-in FSDP2 paths (torch's distributed state-dict API), at 2 ranks. What the suite finds,
asserted exactly (CPU, gloo, torch 2.13):

- Lion, ``fsdp2.sharded`` (DCP): every property passes.
- Lion, ``fsdp2.full``: DSD's full load turns its ``betas`` tuple into a list, as it does
  Adam's (torch's ``dsd-full-load-tuple-to-list``; Lion is no zoo optimizer, so the test
  declares it with its symptom): P6, P7, P11 known, the state itself bitwise (P3).
- Schedule-free AdamW, ``fsdp2.sharded``: the load restores **no optimizer state**, and the
  suite says so as torch's known limitation ``dsd-init-skips-optimizer-with-empty-state``
  (P3, P6, P7 known; its model, every param's state left empty, makes them pass exactly).
  The factory's ``train()`` leaves an empty state entry per param (the optimizer trait
  ``empty_state_at_start``, seen on a fresh one when the model is checked), so DSD's
  ``_init_optim_state`` (state_dict.py:633-635: "if optim.state: return") takes the
  optimizer for initialised and skips the zero-grad step that would create its state; the
  template ``get_optimizer_state_dict`` returns has no tensors for ``dcp.load`` to fill, and
  the resumed run starts its ``z`` and ``exp_avg_sq`` afresh. Through ``fsdp2.full`` the
  same skipped step leaves ``set_optimizer_state_dict`` no tensor to take the device from,
  and the load raises ``AssertionError: Expected device to be set`` (state_dict.py:1146-1157)
  on every rank (``dsd-stateless-full-load``, as for SGD without momentum).
"""
import pytest

pytest.importorskip("lion_pytorch", reason="the `trainers` extra (scripts/setup-env installs it)")
pytest.importorskip("schedulefree", reason="the `trainers` extra (scripts/setup-env installs it)")

from examples.outside_optimizers import (data, make_lion, make_model,  # noqa: E402
                                         make_schedulefree)

BETAS = dict(reason="DSD's full load turns betas (0.9, 0.99) into a list "
                    "(dsd-full-load-tuple-to-list)", symptom="'betas']: type; expected tuple")


def _statuses(results) -> dict:
    return {r.case.api: {p: v.status for p, v in r.properties.items()
                         if v.status not in ("pass", "n/a")} for r in results}


@pytest.mark.fsdp_known("P6,P7,P11", **BETAS)
def test_lion(fsdp_roundtrip):
    results = fsdp_roundtrip(make_model, data, fsdp_version=2, plan=["0", "2"],
                             optimizer=make_lion, world_sizes=["2"], links=1)
    assert _statuses(results) == {"fsdp2.full": {"P6": "known", "P7": "known",
                                                 "P11": "known"}, "fsdp2.sharded": {}}
    assert [r.properties["P3"].status for r in results] == ["pass", "pass"]


def test_schedulefree_state_is_lost_or_refused_as_torch_known_limitations(fsdp_roundtrip):
    results = fsdp_roundtrip(make_model, data, fsdp_version=2, plan=["0", "2"],
                             optimizer=make_schedulefree, world_sizes=["2"], links=1)
    got = {r.case.api: {p: (v.status, v.known) for p, v in r.properties.items()
                        if v.status not in ("pass", "n/a")} for r in results}
    refused = ("known", "dsd-stateless-full-load")
    assert got["fsdp2.full"] == {p: refused for p in ("P3", "P6", "P7", "P11")}, got
    full = next(r for r in results if r.case.api == "fsdp2.full").properties["P3"]
    assert "AssertionError: Expected device to be set" in full.detail, full.detail
    lost = ("known", "dsd-init-skips-optimizer-with-empty-state")
    assert got["fsdp2.sharded"] == {p: lost for p in ("P3", "P6", "P7")}, got
    p3 = next(r for r in results if r.case.api == "fsdp2.sharded").properties["P3"]
    assert "state['0.weight']['z']: missing" in p3.detail, p3.detail
    assert "state['0.weight']['exp_avg_sq']: missing" in p3.detail, p3.detail


def test_the_empty_state_trait_is_seen_on_a_fresh_optimizer():
    import torch

    from fsdp_conformance.zoo.optimizers import EMPTY_STATE_AT_START, optimizer_traits_of

    model = make_model()
    sf = make_schedulefree(list(model.named_parameters()))
    assert optimizer_traits_of(sf) == (EMPTY_STATE_AT_START,)
    assert optimizer_traits_of(make_lion(list(model.named_parameters()))) == ()
    adagrad = torch.optim.Adagrad(model.parameters())  # state at construction, with tensors
    assert adagrad.state and optimizer_traits_of(adagrad) == ()
    sf.zero_grad()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    sf.step()  # once stepped, its state holds tensors
    assert optimizer_traits_of(sf) == ()
