"""Hand-computed layouts a reader can check on paper."""

import pytest
import torch
from torch import nn

from fsdp_conformance.reference import (
    LayoutError,
    Piece,
    build_layout,
    fsdp2_layout,
    layout_from_spec,
)

SPEC = [("", [("a", (3,)), ("b", (5,))])]


def test_two_params_world3_flat_params():
    # use_orig_params=False: no padding. flat = a[0:3] b[0:5], N = 8, S = ceil(8/3) = 3.
    # rank 0: flat[0:3] = a[0:3]; rank 1: flat[3:6] = b[0:3]; rank 2: flat[6:8] = b[3:5] + 1 pad
    L = layout_from_spec(SPEC, 3, use_orig_params=False)
    u = L.units[0]
    assert [(p.fqn, p.offset) for p in u.params] == [("a", 0), ("b", 3)]
    assert (u.flat_numel, u.padded_numel, u.shard_numel) == (8, 9, 3)
    assert [u.shard_range(r) for r in range(3)] == [(0, 3), (3, 6), (6, 8)]
    assert u.param_pieces(0) == (Piece("a", 0, 3, 0),)
    assert u.param_pieces(1) == (Piece("b", 0, 3, 0),)
    assert u.param_pieces(2) == (Piece("b", 3, 5, 0),)
    assert u.numels_with_padding() == (3, 5)
    assert L.optimizer_keys() == ["_flat_param"]


def test_two_params_world3_orig_params_fp32():
    # use_orig_params=True, fp32: align = 16 // 4 = 4 elements.
    # a at 0 (3), pad 1, b at 4 (5) -> 9, already a multiple of 3 -> N = 9, S = 3.
    # rank 0: [0:3] = a; rank 1: [3:6] = pad + b[0:2]; rank 2: [6:9] = b[2:5]
    L = layout_from_spec(SPEC, 3, use_orig_params=True)
    u = L.units[0]
    assert [(p.fqn, p.offset) for p in u.params] == [("a", 0), ("b", 4)]
    assert (u.flat_numel, u.padded_numel, u.shard_numel) == (9, 9, 3)
    assert u.param_pieces(0) == (Piece("a", 0, 3, 0),)
    assert u.param_pieces(1) == (Piece("b", 0, 2, 1),)
    assert u.param_pieces(2) == (Piece("b", 2, 5, 0),)
    assert u.numels_with_padding() == (3, 1, 5)
    assert u.is_padding_mask() == (False, True, False)
    assert L.optimizer_keys() == ["a", "b"]


def test_orig_params_world_size_padding_and_bf16():
    # bf16: align = 8. a(3) at 0, pad 5, b(5) at 8 -> 13; pad to a multiple of 4 -> 16.
    L = layout_from_spec(SPEC, 4, use_orig_params=True, dtype=torch.bfloat16)
    u = L.units[0]
    assert [p.offset for p in u.params] == [0, 8]
    assert u.numels_with_padding() == (3, 5, 5, 3)
    assert (u.flat_numel, u.shard_numel) == (16, 4)
    # S = 4: rank 2 = [8, 12) = b[0:4], rank 3 = [12, 16) = b[4:5] + 3 padding
    assert u.param_pieces(2) == (Piece("b", 0, 4, 0),)
    assert u.param_pieces(3) == (Piece("b", 4, 5, 0),)
    # a(3) at 0, pad 5, c(1) at 8 -> 9, pad to 12; S = 3: rank 3 = [9, 12) is only padding
    L = layout_from_spec([("", [("a", (3,)), ("c", ())])], 4, use_orig_params=True, dtype=torch.bfloat16)
    assert L.units[0].flat_numel == 12 and L.units[0].param_pieces(3) == ()


def test_trailing_ranks_own_nothing():
    # N = 2, W = 4: S = 1; ranks 2 and 3 hold one padding element each.
    L = layout_from_spec([("", [("w", (2,))])], 4, use_orig_params=False)
    u = L.units[0]
    assert [u.shard_range(r) for r in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert u.param_pieces(3) == ()
    assert u.shard_numel == 1


def test_no_shard_and_world_size_one():
    L = layout_from_spec(SPEC, 1, use_orig_params=False)
    assert L.strategy == "NO_SHARD" and not L.units[0].sharded
    L = layout_from_spec(SPEC, 2, use_orig_params=True, strategy="NO_SHARD")
    u = L.units[0]
    # still padded to a multiple of the process-group size (2): 3 +1 +5 = 9 -> 10
    assert (u.flat_numel, u.shard_numel, u.shard_range(1)) == (10, 10, (0, 10))


def test_hybrid_shard_ranks():
    L = layout_from_spec(SPEC, 4, use_orig_params=False, strategy="HYBRID_SHARD", shard_world_size=2)
    assert [L.shard_rank(r) for r in range(4)] == [0, 1, 0, 1]
    assert L.units[0].shard_numel == 4


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 1)  # weight (1,3), bias (1,)
        self.b = nn.Sequential(nn.Linear(2, 5), nn.Linear(5, 1, bias=False))
        self.c = nn.Parameter(torch.zeros(7))
        self.d = nn.Linear(1, 2)
        self.tied = self.a


def test_build_layout_matches_fsdp_probe():
    # Observed with torch 2.13 (3 ranks, wrap b and b.1, ignore d).
    m = Net()
    L = build_layout(m, ["b", "b.1"], 3, use_orig_params=False, ignored=["d"])
    assert L.optimizer_keys() == ["_flat_param", "b._flat_param", "b.1._flat_param", "d.weight", "d.bias"]
    root, b, b1 = L.units
    assert root.fqns == ("c", "a.weight", "a.bias")  # root's own param first
    assert root.params[1].aliases == ("tied.weight",)
    assert b.fqns == ("b.0.weight", "b.0.bias") and b1.fqns == ("b.1.weight",)
    assert [u.shard_numel for u in L.units] == [4, 5, 2]
    L = build_layout(m, ["b", "b.1"], 3, use_orig_params=True, ignored=["d"])
    assert L.optimizer_keys() == ["c", "a.weight", "a.bias", "b.0.weight", "b.0.bias", "b.1.weight",
                                  "d.weight", "d.bias"]
    assert [u.numels_with_padding() for u in L.units] == [(7, 1, 3, 1, 1, 2), (10, 2, 5, 1), (5, 1)]


def test_build_layout_errors():
    with pytest.raises(LayoutError, match="nope"):
        build_layout(Net(), ["nope"], 2, use_orig_params=False)
    m = Net()
    m.a.bias.requires_grad_(False)
    with pytest.raises(LayoutError, match="requires_grad"):
        build_layout(m, [], 2, use_orig_params=False)
    build_layout(m, [], 2, use_orig_params=True)  # allowed with original params


def test_fsdp2_layout():
    L = fsdp2_layout([("w", (5, 3)), ("b", (2,))], 4)
    w = L.param("w")
    assert [w.rows(r) for r in range(4)] == [(0, 2), (2, 4), (4, 5), (5, 5)]
    assert w.local_shape(3) == (0, 3)
    assert L.param("b").rows(2) == (2, 2)
    with pytest.raises(LayoutError, match="0-dim"):
        fsdp2_layout([("s", ())], 2)
