"""The reference's FSDP2 layout (ignored params, HSDP), shard/gather, and its reading of
DTensor-like values (duck-typed: no torch.distributed here), on hand-computed examples."""
from __future__ import annotations

import pytest
import torch

from fsdp_conformance.properties.statediff import assert_state_dicts_equal
from fsdp_conformance.reference import (
    LayoutError,
    ShapeMismatch,
    dtensor_box,
    flatten_sharded,
    fsdp2_gather,
    fsdp2_layout,
    fsdp2_shard,
    layout_from_spec,
    shard_full,
    sharded_to_pieces,
    to_pieces,
)


class Shard:
    def __init__(self, dim):
        self.dim = dim

    def is_shard(self):
        return True

    def is_replicate(self):
        return False


class StridedShard(Shard):
    split_factor = 2


class Replicate:
    def is_shard(self):
        return False

    def is_replicate(self):
        return True


class Mesh:
    def __init__(self, shape, coord):
        self.shape, self._coord = tuple(shape), tuple(coord)

    def get_coordinate(self):
        return self._coord


class FakeDTensor:
    """What the reference may use of a DTensor: shape, placements, device_mesh, to_local()."""

    def __init__(self, full, mesh, placements):
        self.shape, self.device_mesh, self.placements = full.shape, mesh, placements
        offsets, local = dtensor_box(full.shape, mesh, placements)
        box = tuple(slice(o, o + n) for o, n in zip(offsets, local))
        self._local = full[box].clone()

    def to_local(self):
        return self._local


def test_dtensor_box_shard0_chunk_semantics():
    rows = [dtensor_box((5, 3), Mesh((4,), (r,)), [Shard(0)]) for r in range(4)]
    assert rows == [((0, 0), (2, 3)), ((2, 0), (2, 3)), ((4, 0), (1, 3)), ((5, 0), (0, 3))]


def test_dtensor_box_hsdp_and_nested_shards():
    # HSDP (Replicate(), Shard(0)) on a (2, 2) mesh: rank g at (g // 2, g % 2)
    got = [dtensor_box((5,), Mesh((2, 2), (g // 2, g % 2)), [Replicate(), Shard(0)])
           for g in range(4)]
    assert got == [((0,), (3,)), ((3,), (2,)), ((0,), (3,)), ((3,), (2,))]
    # (Shard(0), Shard(0)): chunk of a chunk, in mesh-dim order
    got = [dtensor_box((5,), Mesh((2, 2), (g // 2, g % 2)), [Shard(0), Shard(0)]) for g in range(4)]
    assert got == [((0,), (2,)), ((2,), (1,)), ((3,), (1,)), ((4,), (1,))]


class StridedShard213(StridedShard):
    """torch 2.13's ``_StridedShard``: ``is_shard()`` is False."""

    def is_shard(self):
        return False


def test_dtensor_box_rejects_a_strided_shard_without_the_shard_it_follows_and_mismatches():
    for strided in (StridedShard, StridedShard213):
        with pytest.raises(NotImplementedError, match="no later mesh dims"):
            dtensor_box((4,), Mesh((2,), (0,)), [strided(0)])
        with pytest.raises(NotImplementedError, match="no later mesh dims"):  # 2 != 3 pieces
            dtensor_box((6,), Mesh((2, 3), (0, 0)), [strided(0), Shard(0)])
    with pytest.raises(ShapeMismatch):
        dtensor_box((4,), Mesh((2, 2), (0, 1)), [Shard(0)])


TP_SHAPES = [("norm.weight", (6,)), ("fc1.weight", (10, 6)), ("fc1.bias", (10,)),
             ("fc2.weight", (6, 10)), ("fc2.bias", (6,)), ("head.weight", (3, 6))]
TP_PLAN = {"fc1": "colwise", "fc2": "rowwise"}


def test_fsdp2_layout_over_tensor_parallel_boxes_by_hand():
    """(dp, tp) = (2, 2): rank g at (g // 2, g % 2). Colwise fc1: tp halves of its 10 rows
    (0-5, 5-10), each chunked over dp (3 + 2 rows). Rowwise fc2: tp halves of its 10
    columns, dp chunks of its 6 rows. The norm: dp chunks only, the same on both tp ranks,
    on the dp mesh alone (outside the plan); the row-wise bias on both dims, replicated."""
    L = fsdp2_layout(TP_SHAPES, 4, tp_size=2, tp_plan=TP_PLAN)
    fc1, fc2, bias2, norm, head = (L.param(f) for f in ("fc1.weight", "fc2.weight", "fc2.bias",
                                                         "norm.weight", "head.weight"))
    assert [fc1.box(g) for g in range(4)] == [((0, 3), (0, 6)), ((5, 8), (0, 6)),
                                              ((3, 5), (0, 6)), ((8, 10), (0, 6))]
    assert [fc2.box(g) for g in range(4)] == [((0, 3), (0, 5)), ((0, 3), (5, 10)),
                                              ((3, 6), (0, 5)), ((3, 6), (5, 10))]
    assert [norm.box(g) for g in range(4)] == [((0, 3),), ((0, 3),), ((3, 6),), ((3, 6),)]
    assert fc1.placements(2) == [("strided_shard", 0, 2), ("shard", 0)]
    assert fc2.placements(2) == [("shard", 0), ("shard", 1)]
    assert bias2.placements(2) == [("shard", 0), ("replicate",)]
    assert head.placements(2) == [("shard", 0)] and head.mesh_shape((2, 2)) == (2,)
    assert bias2.mesh_shape((2, 2)) == (2, 2)
    assert fc1.padded_local_shape(1) == (3, 6) and fc2.padded_local_shape(3) == (3, 5)
    assert [fc2.owner(i) for i in (0, 5, 10, 19, 59)] == [0, 1, 0, 1, 3]
    assert list(L.first_replica()) == [0, 1, 2, 3]
    # the reference's reading of torch's placements gives the same boxes
    for g in range(4):
        coord = (g // 2, g % 2)
        for p, pls in ((fc1, [StridedShard(0), Shard(0)]), (fc1, [StridedShard213(0), Shard(0)]),
                       (fc2, [Shard(0), Shard(1)]), (norm, [Shard(0), Replicate()])):
            off, shape = dtensor_box(p.shape, Mesh((2, 2), coord), pls)
            assert (off, shape) == (p.offset(g), p.local_shape(g)), (p.fqn, g)


def test_fsdp2_shard_gather_round_trip_over_tensor_parallel_and_bad_plans():
    L = fsdp2_layout(TP_SHAPES, 4, tp_size=2, tp_plan=TP_PLAN)
    g = torch.Generator().manual_seed(3)
    full = {"state": {f: {"m": torch.randn(s, generator=g), "step": torch.tensor(2.0)}
                      for f, s in TP_SHAPES},
            "param_groups": [{"lr": 0.5, "params": [f for f, _ in TP_SHAPES]}]}
    locals_ = [fsdp2_shard(L, full, r) for r in range(4)]
    assert torch.equal(locals_[3]["state"]["fc2.weight"]["m"],
                       full["state"]["fc2.weight"]["m"][3:6, 5:10])
    assert_state_dicts_equal(full, fsdp2_gather(L, locals_))
    with pytest.raises(LayoutError, match="not both"):
        fsdp2_layout(TP_SHAPES, 4, tp_size=2, tp_plan=TP_PLAN, shard_world_size=2)
    with pytest.raises(LayoutError, match="style"):
        fsdp2_layout(TP_SHAPES, 4, tp_size=2, tp_plan={"fc1": "sequence"})
    with pytest.raises(LayoutError, match="divide"):
        fsdp2_layout(TP_SHAPES, 6, tp_size=4, tp_plan=TP_PLAN)
    with pytest.raises(LayoutError, match="not an nn.Linear"):
        fsdp2_layout(torch.nn.Sequential(torch.nn.LayerNorm(4)), 2, tp_size=2,
                     tp_plan={"0": "colwise"})


def test_to_pieces_column_shard_splits_into_runs():
    full = torch.arange(12.0).view(3, 4)
    v = FakeDTensor(full, Mesh((2,), (1,)), [Shard(1)])  # columns 2, 3
    pcs = to_pieces(v)
    assert [(s, o, t.tolist()) for s, o, t in pcs] == [
        ((3, 4), 2, [2.0, 3.0]), ((3, 4), 6, [6.0, 7.0]), ((3, 4), 10, [10.0, 11.0])]
    assert to_pieces(torch.tensor(1.0)) is None
    empty = FakeDTensor(torch.zeros(2, 3), Mesh((4,), (3,)), [Shard(0)])
    assert to_pieces(empty) == []


@pytest.mark.parametrize("ws", [2, 3, 4])
def test_flatten_sharded_from_dtensors_equals_shard_full(ws):
    """Row-chunked DTensors of every rank -> a flat FSDP1 unit's local shard (use_orig_params
    False and True): the reference's duck-typed DTensor path equals shard_full."""
    g = torch.Generator().manual_seed(0)
    shapes = {"a.weight": (5, 3), "a.bias": (5,), "b.weight": (2, 5)}
    full = {"state": {f: {"exp_avg": torch.randn(s, generator=g, dtype=torch.float64),
                          "step": torch.tensor(3.0)} for f, s in shapes.items()},
            "param_groups": [{"lr": 0.1, "params": list(shapes)}]}
    for orig in (False, True):
        layout = layout_from_spec([("", list(shapes.items()))], ws, use_orig_params=orig)
        sharded = [{"state": {f: {"exp_avg": FakeDTensor(st["exp_avg"], Mesh((ws,), (r,)), [Shard(0)]),
                                  "step": st["step"]} for f, st in full["state"].items()},
                    "param_groups": full["param_groups"]} for r in range(ws)]
        neutral = [sharded_to_pieces(d) for d in sharded]
        for r in range(ws):
            want = shard_full(layout, full, r)
            assert_state_dicts_equal(want, flatten_sharded(layout, sharded, r))
            assert_state_dicts_equal(want, flatten_sharded(layout, neutral, r))


def test_fsdp2_layout_ignored_and_hsdp():
    L = fsdp2_layout([("w", (5, 3)), ("side.w", ()), ("b", (2,))], 4, ignored=("side",),
                     shard_world_size=2)
    w, side = L.param("w"), L.param("side.w")
    assert not side.sharded and side.local_shape(3) == ()
    assert [w.rows(g) for g in range(4)] == [(0, 3), (3, 5), (0, 3), (3, 5)]
    assert L.plain_params == (side,) and list(L.first_replica()) == [0, 1]
    with pytest.raises(LayoutError, match="0-dim"):
        fsdp2_layout([("s", ())], 2)
    with pytest.raises(LayoutError, match="divide"):
        fsdp2_layout([("w", (4,))], 4, shard_world_size=3)


def test_fsdp2_shard_gather_round_trip_with_plain_param_and_hsdp():
    L = fsdp2_layout([("w", (5, 3)), ("side.w", (2, 2)), ("b", (2,))], 4, ignored=("side",),
                     shard_world_size=2)
    g = torch.Generator().manual_seed(1)
    full = {"state": {f: {"m": torch.randn(s, generator=g), "step": torch.tensor(2.0)}
                      for f, s in [("w", (5, 3)), ("side.w", (2, 2)), ("b", (2,))]},
            "param_groups": [{"lr": 0.5, "betas": (0.9, 0.99), "params": ["w", "side.w", "b"]}]}
    locals_ = [fsdp2_shard(L, full, r) for r in range(4)]
    assert locals_[1]["state"]["w"]["m"].shape == (2, 3)
    assert torch.equal(locals_[3]["state"]["side.w"]["m"], full["state"]["side.w"]["m"])
    assert_state_dicts_equal(full, fsdp2_gather(L, locals_))


def _held_once(total: int) -> dict:
    """LBFGS's form: one state for all params under the first, vectors over every param."""
    g = torch.Generator().manual_seed(3)
    d = torch.randn(total, generator=g, dtype=torch.float64)
    return {"state": {"a": {"d": d, "old_dirs": [d * 2, d * 3], "H_diag": torch.tensor(0.5),
                            "n_iter": 2, "t": 0.1}},
            "param_groups": [{"lr": 0.1, "params": ["a", "b"]}]}


def test_state_of_a_param_every_rank_holds_whole_may_have_any_shape():
    """A shard group of one rank steps its params whole, so their state is the optimizer's
    own in any shape (LBFGS's flat vectors over every param, held under the first): shard
    gives it whole, gather takes it back as held, bitwise, on one rank and on every
    replica of an HSDP mesh of one shard rank."""
    shapes = [("a", (3, 4)), ("b", (5,))]
    full = _held_once(17)
    for layout in (fsdp2_layout(shapes, 1), fsdp2_layout(shapes, 2, shard_world_size=1)):
        local = [fsdp2_shard(layout, full, r) for r in range(layout.world_size)]
        for d in local:
            assert_state_dicts_equal(d["state"], full["state"])
        assert_state_dicts_equal(fsdp2_gather(layout, local)["state"], full["state"])


def test_state_not_shaped_like_its_param_is_refused_where_a_rank_holds_a_piece():
    """At two shard ranks each holds rows of ``a``: a 17-element vector under it has no
    piece to cut, so shard refuses it naming the param and key, and gather refuses
    such local state naming the rank."""
    shapes = [("a", (3, 4)), ("b", (5,))]
    layout = fsdp2_layout(shapes, 2)
    with pytest.raises(ShapeMismatch) as e:
        fsdp2_shard(layout, _held_once(17), 0)
    assert e.value.param == "a" and e.value.key == "d"
    local = [{"state": {"a": {"d": torch.zeros(9, dtype=torch.float64)}},
              "param_groups": []} for _ in range(2)]
    with pytest.raises(ShapeMismatch) as e:
        fsdp2_gather(layout, local)
    assert e.value.param == "a" and e.value.key == "d" and e.value.rank == 0
