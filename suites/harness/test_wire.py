"""The pool's message encoding (harness/wire.py): tensors arrive bitwise, with their view of
their storage; what it does not encode itself goes through pickle's own rules."""
from __future__ import annotations

import multiprocessing as mp
import pickle

import pytest
import torch

from fsdp_conformance.harness import wire


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert type(b) is type(a)
    assert (b.dtype, b.shape, b.stride(), b.storage_offset(), b.requires_grad) == \
        (a.dtype, a.shape, a.stride(), a.storage_offset(), a.requires_grad)
    assert torch.equal(a.detach().view(-1).view(torch.uint8) if a.is_contiguous() and a.dim()
                       else a.detach().reshape(-1).contiguous().view(torch.uint8),
                       b.detach().view(-1).view(torch.uint8) if b.is_contiguous() and b.dim()
                       else b.detach().reshape(-1).contiguous().view(torch.uint8))


CASES = {
    "fp64": torch.randn(5, 3, dtype=torch.float64),
    "bf16": torch.randn(7, dtype=torch.bfloat16),
    "fp16 with nan and -0.0": torch.tensor([float("nan"), -0.0, 1.5], dtype=torch.float16),
    "int64": torch.arange(6).reshape(2, 3),
    "bool": torch.tensor([True, False, True]),
    "0-dim step": torch.tensor(3.0),
    "empty": torch.empty(0, 4),
    "transposed view": torch.randn(4, 6).t(),
    "slice at an offset": torch.randn(10)[3:8],
    "leaf requiring grad": torch.randn(3, requires_grad=True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_tensor_arrives_bitwise_with_its_view_of_its_storage(name):
    t = CASES[name]
    _same(t, wire.loads(wire.dumps(t)))


def test_a_record_arrives_whole_and_tensors_no_longer_share_memory_with_the_sender():
    rec = {"state": {"w": {"exp_avg": torch.randn(4), "step": torch.tensor(1.0)}},
           "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": ["w"]}], "note": None}
    got = wire.loads(wire.dumps(rec))
    assert got["param_groups"] == rec["param_groups"] and got["note"] is None
    _same(rec["state"]["w"]["exp_avg"], got["state"]["w"]["exp_avg"])
    got["state"]["w"]["exp_avg"].add_(1)
    assert not torch.equal(got["state"]["w"]["exp_avg"], rec["state"]["w"]["exp_avg"])


def test_what_wire_does_not_encode_itself_is_pickled_as_pickle_does():
    p = torch.nn.Parameter(torch.randn(3))
    got = wire.loads(wire.dumps(p))
    assert type(got) is torch.nn.Parameter and torch.equal(got, p)
    with pytest.raises(RuntimeError, match="non-leaf tensor that requires grad"):
        wire.dumps(torch.randn(2, requires_grad=True) * 2)
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        wire.dumps(lambda: 0)


def _echo(conn) -> None:
    wire.send(conn, wire.recv(conn))


def test_a_message_crosses_a_process_boundary():
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_echo, args=(there,), daemon=True)
    child.start()
    try:
        msg = ("ok", 7, {name: t for name, t in CASES.items()}, ())
        wire.send(here, msg)
        assert here.poll(60), "the child did not answer within 60 s"
        back = wire.recv(here)
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
    assert back[:2] == ("ok", 7) and back[3] == ()
    for name, t in CASES.items():
        _same(t, back[2][name])
