"""LBFGS in the zoo (issue 49): state held once for all params, a step that needs a closure.

The zoo's step gives LBFGS its zero / forward / backward as the closure, which
``max_iter=1`` calls exactly once a step (every rank runs the same collectives as for
any other optimizer); the single-process baseline's snapshot at the save is detached from
the history lists later steps append to."""
from __future__ import annotations

import torch

from fsdp_conformance.zoo import build_model, build_optimizer, make_batch, train_step


def _lbfgs_model():
    model = build_model("mlp", 0, torch.float64)
    optim = build_optimizer("lbfgs", list(model.named_parameters()))
    return model, optim


def test_the_zoo_step_calls_the_lbfgs_closure_once_and_trains_as_lbfgs_with_its_closure():
    model, optim = _lbfgs_model()
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    for step in range(3):
        train_step(model, optim, make_batch("mlp", 0, step, 12, torch.float64))
    assert len(calls) == 3  # one forward per step, so one set of collectives under FSDP

    by_hand = build_model("mlp", 0, torch.float64)
    hand = torch.optim.LBFGS(by_hand.parameters(), lr=0.1, max_iter=1)
    from fsdp_conformance.zoo import loss_of

    for step in range(3):
        x = make_batch("mlp", 0, step, 12, torch.float64)

        def closure():
            hand.zero_grad()
            loss = loss_of(by_hand, x)
            loss.backward()
            return loss

        hand.step(closure)
    for (n, a), b in zip(model.named_parameters(), by_hand.parameters()):
        assert torch.equal(a, b), n
    st = optim.state[next(iter(model.parameters()))]
    assert st["n_iter"] == 3 and len(st["old_dirs"]) >= 1
    total = sum(p.numel() for p in model.parameters())
    assert st["d"].shape == (total,)  # one vector over every param, under the first


def test_the_snapshot_at_the_save_keeps_lbfgs_history_as_it_was():
    """``named_osd`` clones tensors inside lists too: LBFGS appends to ``old_dirs`` in place
    at later steps, and a snapshot sharing the list would show the later history."""
    from fsdp_conformance.properties.baseline import named_osd

    model, optim = _lbfgs_model()
    names = [n for n, _ in model.named_parameters()]
    for step in range(2):
        train_step(model, optim, make_batch("mlp", 0, step, 12, torch.float64))
    snap = named_osd(optim, names)
    before = [t.clone() for t in snap["state"][names[0]]["old_dirs"]]
    for step in range(2, 5):
        train_step(model, optim, make_batch("mlp", 0, step, 12, torch.float64))
    after = snap["state"][names[0]]["old_dirs"]
    assert len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(after, before))
    assert len(optim.state[next(iter(model.parameters()))]["old_dirs"]) > len(before)


def test_lbfgs_has_one_implementation():
    import pytest

    model = build_model("mlp", 0, torch.float64)
    with pytest.raises(ValueError, match="'lbfgs' has one implementation"):
        build_optimizer("lbfgs", list(model.named_parameters()), impl="foreach")
