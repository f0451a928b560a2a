"""What torch raises at scale is a verdict (scale/check.py, known/scale.py): a known
limitation is "known" only when torch raises exactly as its entry models, everything else is
still checked beside it, and anything torch raises that no entry models is a failure naming
the ranks."""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from fsdp_conformance.known import scale as known_scale
from fsdp_conformance.scale import check as scale_check
from fsdp_conformance.scale.check import check_scale
from suites.scale.plants import shift_piece


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Linear(6, 6)
        self.gate = nn.Parameter(torch.tensor(0.5))  # a unit's scalar: torch names it "gate"


class WithScalars(nn.Module):
    """CLIP's learnable temperature and a gated block: two 0-dim parameters."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 6)
        self.logit_scale = nn.Parameter(torch.tensor(1.0))
        self.layers = nn.ModuleList([Block()])


def test_a_scalar_parameter_is_the_known_limitation_and_the_rest_is_still_checked():
    r = check_scale(WithScalars, "16", "12")
    [k] = r.known
    assert (k.key, k.status, k.params) == ("fsdp2-scalar-param", "known",
                                           ("logit_scale", "layers.0.gate"))
    assert "fully_shard doesn't support scalar parameters" in k.detail
    assert r.ok, {s: (v.mismatches, v.plans, v.raised) for s, v in r.sides.items()}
    assert r.params == 6  # every parameter counted; the 4 others sharded and checked
    assert all(not s.raised and not s.cover for s in r.sides.values())


def test_a_second_bug_beside_the_known_one_is_still_caught(monkeypatch):
    # rank 1 of 16: the weight's second row, one row down
    shift_piece(monkeypatch, "lin.weight",
                lambda off: (off[0] + 1, *off[1:]) if off[0] == 1 else None)
    r = check_scale(WithScalars, "16", "12")
    assert [k.status for k in r.known] == ["known"]
    assert not r.ok
    assert r.sides["save"].mismatches == (
        "rank 1: lin.weight: torch holds shape (1, 8) at offset (2, 0), the reference (1, 8) "
        "at (1, 0)",)


class _Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 6)


def _entry(**changes):
    [entry] = known_scale.SCALE_KNOWN
    return dataclasses.replace(entry, **changes)


def test_torch_raising_otherwise_than_modelled_is_a_failure(monkeypatch):
    monkeypatch.setattr(known_scale, "SCALE_KNOWN", (_entry(
        raises=r"ValueError: fully_shard refuses (?P<param>\S+)"),))
    r = check_scale(WithScalars, "16", "12")
    [k] = r.known
    assert k.status == "fail" and "raised otherwise than fsdp2-scalar-param models" in k.detail
    assert not r.ok


def test_an_entry_torch_no_longer_needs_fails_as_fixed_upstream(monkeypatch):
    monkeypatch.setattr(known_scale, "SCALE_KNOWN", (_entry(
        concerns=lambda shapes: ["lin.bias"]),))
    r = check_scale(_Plain, "16", "12")
    [k] = r.known
    assert k.status == "fail" and "without raising" in k.detail and "fixed upstream?" in k.detail
    assert not r.ok


class NonContiguous(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 6)
        self.odd = nn.Parameter(torch.empty(6, 4).t())


def test_what_torch_raises_unmodelled_is_a_failure_naming_the_ranks():
    r = check_scale(NonContiguous, "16", "12")
    assert not r.ok and r.known == ()
    [line] = r.sides["save"].raised
    assert line.startswith(f"ranks {list(r.sides['save'].ranks)}: torch raised "
                           "NotImplementedError: FSDP does not support non-contiguous"), line


def test_what_the_check_itself_raises_is_not_blamed_on_torch(monkeypatch):
    def broken(shapes, mesh, rank):
        raise KeyError("a planted bug of the reference's boxes")

    monkeypatch.setattr(scale_check, "expected", broken)
    r = check_scale(_Plain, "4")
    assert not r.ok
    assert r.sides["save"].raised == (
        "ranks [0, 1, 2, 3]: fsdp-conformance raised KeyError: \"a planted bug of the reference's "
        "boxes\"",), r.sides["save"].raised
