"""Scale mode (fsdp_conformance/scale): a model's fully_shard layout at 1,024 ranks, checked
on one machine against the reference; the quick slice of it (seconds)."""
from __future__ import annotations

import json
import subprocess

import pytest
import torch
from torch import nn

from fsdp_conformance.scale.check import check_scale, cover_problems, sample_ranks
from fsdp_conformance.scale.plans import tiling_problem
from fsdp_conformance.scale.simulate import Mesh
from suites.conftest import PYTHON, ROOT, env_for_subprocess
from suites.scale.plants import shift_piece


def test_an_moe_layer_at_1024_ranks_resharded_to_768_is_the_references():
    r = check_scale("moe", "1024", "768")
    assert r.ok, {k: s.mismatches[:3] for k, s in r.sides.items()}
    save, load = r.sides["save"], r.sides["load"]
    assert (save.mesh, load.mesh) == ("1024", "768")
    # the router's 8 rows leave most ranks empty: the sample holds the class boundaries
    assert save.empty_params >= 1 and 7 in save.ranks and 8 in save.ranks
    assert 0 in load.ranks and 767 in load.ranks


def test_hsdp_meshes_take_both_ends_of_the_replicas():
    r = check_scale("moe", "64x16", "48x16")
    assert r.ok
    assert r.sides["save"].mesh == "64x16" and max(r.sides["save"].ranks) == 1023
    assert min(r.sides["save"].ranks) == 0 and 63 * 16 in r.sides["save"].ranks


class UsersModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(1000, 96)
        self.layers = nn.ModuleList(nn.Linear(96, 96) for _ in range(2))
        self.head = nn.Linear(96, 5)


def test_a_users_factory_saved_at_512_and_loaded_at_384():
    r = check_scale(UsersModel, "512", "384")
    assert r.ok and r.params == 7
    assert r.sides["load"].empty_params == 7  # 96 rows over 384 ranks: most hold none


def test_a_piece_torch_gives_elsewhere_is_a_mismatch_naming_rank_and_param(monkeypatch):
    # rank 1 of 8: the router's second row, one row down
    shift_piece(monkeypatch, "layers.0.router.weight",
                lambda off: (off[0] + 1, *off[1:]) if off[0] == 1 else None)
    r = check_scale("moe", "8")
    assert not r.ok
    assert r.sides["save"].mismatches[0].startswith(
        "rank 1: layers.0.router.weight: torch holds shape (1, 4096) at offset (2, 0), "
        "the reference (1, 4096) at (1, 0)")


def test_the_sample_and_the_exact_cover():
    shapes = {"a": (4096,), "b": (8, 16), "c": (6, 2)}
    m = Mesh.parse("1024")
    ranks = sample_ranks(shapes, m)
    assert {0, 1, 1023, 7, 8, 5, 6} <= set(ranks) and len(ranks) < 20
    assert cover_problems(shapes, Mesh.parse("768")) == []
    assert cover_problems({"s": ()}, m) == ["s: a 0-dim parameter (fully_shard rejects it)"]
    with pytest.raises(ValueError, match="a mesh is written N, RxS .* or DxTtp"):
        Mesh.parse("64y16")


def test_the_command_writes_its_report_and_refuses_an_unknown_model(tmp_path):
    out = tmp_path / "s.json"
    p = subprocess.run([PYTHON, "-m", "fsdp_conformance", "scale", "--model", "moe", "--save",
                        "256", "--load", "192", "--out", str(out)], cwd=ROOT,
                       env=env_for_subprocess(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "fsdp-conformance/scale/1" and doc["ok"] is True
    assert doc["sides"]["load"]["mesh"] == "192" and doc["ranks_per_second"] > 0
    md = (tmp_path / "s.md").read_text()
    assert md.startswith("# fsdp-conformance scale: moe")
    assert "- PASS pieces that differ from the reference: 0" in md and "- PASS torch raised: nothing" in md
    # what the fake group and meta tensors cannot reach is said, with torch's own words,
    # and is not part of the OK: FSDP1's flat parameters
    why = doc["unreached"]["fsdp1"]
    assert why.startswith("FSDP1 on a meta module") and "without device_id it " in why
    assert "Not simulated at scale" in why and "- not reached (fsdp1): " in \
        (tmp_path / "s.md").read_text()
    bad = subprocess.run([PYTHON, "-m", "fsdp_conformance", "scale", "--model", "gpt5",
                          "--save", "8"], cwd=ROOT, env=env_for_subprocess(),
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "not a built-in model" in bad.stderr


def test_dcp_plans_of_a_rank_are_checked_and_a_missing_saved_chunk_is_named():
    from fsdp_conformance.scale.models import build
    from fsdp_conformance.scale.plans import (checkpoint, load_problems, save_problems,
                                              saved_metadata)
    from fsdp_conformance.scale.simulate import adam_state, shapes_of, simulated_rank

    fn = lambda: build("moe")  # noqa: E731
    shapes = shapes_of(fn)
    saved, load = Mesh.parse("16"), Mesh.parse("12")
    with simulated_rank(fn, load, 1) as (model, sd):
        ckpt = checkpoint(sd, adam_state(model, sd, flatten=True))
        metadata = saved_metadata(ckpt, shapes, saved)
        assert "optim.state.layers.0.ffn_norm.weight.exp_avg" in metadata.state_dict_metadata
        assert load_problems(ckpt, shapes, metadata, load, 1) == []
        state = metadata.state_dict_metadata["optim.state.layers.0.ffn_norm.weight.exp_avg"]
        state.chunks = [c for c in state.chunks if c.offsets[0] != 256]  # rows 256..511 gone
        problems = load_problems(ckpt, shapes, metadata, load, 1)
    assert problems == ["rank 1: optim.state.layers.0.ffn_norm.weight.exp_avg: load plan "
                        "reads 172 elements, its piece has 342 (offset (342,), size (342,))"]
    with simulated_rank(fn, saved, 3) as (model, sd):
        ckpt = checkpoint(sd, adam_state(model, sd, flatten=False))
        assert save_problems(ckpt, shapes, saved, 3) == []
        wrong = save_problems(ckpt, shapes, Mesh.parse("8"), 3)  # another mesh's pieces
    assert any(p.startswith("rank 3: optim.state.") for p in wrong)
    assert any(p.startswith("rank 3: model.") for p in wrong)


def _coordinated(mesh_text: str, rank: int):
    """Torch's coordinator over every rank of the mesh, the simulated rank's plan its own
    (scale/plans.py ``coordinate``): ``(Coordinated, ckpt key table)``."""
    from fsdp_conformance.scale.models import build
    from fsdp_conformance.scale.plans import (checkpoint, coordinate, key_table,
                                              local_save_plan, saved_metadata)
    from fsdp_conformance.scale.simulate import adam_state, shapes_of, simulated_rank

    fn = lambda: build("moe")  # noqa: E731
    shapes, mesh = shapes_of(fn), Mesh.parse(mesh_text)
    with simulated_rank(fn, mesh, rank) as (model, sd):
        ckpt = checkpoint(sd, adam_state(model, sd, flatten=False))
        table = key_table(ckpt, shapes)[0]
        return coordinate({rank: local_save_plan(ckpt)}, table, shapes, mesh,
                          saved_metadata(ckpt, shapes, mesh)), table


def test_the_coordinator_deduplicates_every_ranks_save_plan_and_a_missed_replica_is_named(
        monkeypatch):
    """torch's create_global_plan over all 256 ranks of a 4x64 HSDP mesh leaves every key
    written once and writes the reference's metadata; without de-duplication (planted:
    one that keeps everything) torch's coordinator refuses the plans and the replicas'
    pieces and the plain keys are named as written more than once."""
    import torch.distributed.checkpoint.default_planner as dp

    c, _ = _coordinated("4x64", 65)
    assert c.problems == () and c.metadata is not None
    assert (c.from_torch, c.from_reference) == (1, 255)
    monkeypatch.setattr(dp, "dedup_save_plans", lambda plans, *a, **kw: plans)
    c, _ = _coordinated("4x64", 65)
    problems = list(c.problems)
    assert problems[0].startswith("torch's coordinator (create_global_plan) refused the 256 "
                                  "ranks' plans"), problems[:3]
    assert any(p.startswith("model.layers.0.ffn_norm.weight: rows ") and "written twice" in p
               for p in problems), problems[:5]
    assert any(p.endswith("written by 256 ranks after de-duplication, expected 1")
               for p in problems), problems[:5]


def test_a_plain_key_de_duplication_leaves_with_no_writer_is_named(monkeypatch):
    """Planted in torch's de-duplication: every writer of one param's ``step`` dropped. "Each
    plain key by one rank" must also catch a key written by none."""
    import torch.distributed.checkpoint.default_planner as dp

    real = dp.dedup_save_plans
    gone = "optim.state.layers.0.ffn_norm.weight.step"

    def dropping(plans, *a, **kw):
        import dataclasses

        return [dataclasses.replace(p, items=[i for i in p.items if i.index.fqn != gone])
                for p in real(plans, *a, **kw)]
    monkeypatch.setattr(dp, "dedup_save_plans", dropping)
    c, table = _coordinated("16", 3)
    assert gone in table
    assert f"{gone}: written by no ranks after de-duplication, expected 1" in c.problems, \
        c.problems


def test_every_read_is_checked_by_position_and_key(monkeypatch):
    """Planted in torch's load planner on a rank of 12 loading a save at 16: (1) the reads of
    exp_avg take the saved exp_avg_sq (same chunks, another tensor); (2) one read takes the
    wrong rows inside its saved chunk (its storage offset 2 rows short). Both were passed
    by counting elements; by position each is named with the key and where it reads."""
    import dataclasses

    import torch
    import torch.distributed.checkpoint.default_planner as dp

    from fsdp_conformance.scale.models import build
    from fsdp_conformance.scale.plans import checkpoint, load_problems, saved_metadata
    from fsdp_conformance.scale.simulate import adam_state, shapes_of, simulated_rank

    fn = lambda: build("moe")  # noqa: E731
    shapes, saved, load = shapes_of(fn), Mesh.parse("16"), Mesh.parse("12")
    key = "optim.state.layers.0.ffn_norm.weight.exp_avg"
    real = dp.DefaultLoadPlanner.create_local_plan

    def check(mutate):
        def planted(self):
            plan = real(self)
            return dataclasses.replace(plan, items=[mutate(i) for i in plan.items])
        monkeypatch.setattr(dp.DefaultLoadPlanner, "create_local_plan", planted)
        try:
            with simulated_rank(fn, load, 1) as (model, sd):
                ckpt = checkpoint(sd, adam_state(model, sd, flatten=False))
                return load_problems(ckpt, shapes, saved_metadata(ckpt, shapes, saved), load, 1)
        finally:
            monkeypatch.setattr(dp.DefaultLoadPlanner, "create_local_plan", real)

    assert check(lambda i: i) == []
    swapped = check(lambda i: dataclasses.replace(i, storage_index=dataclasses.replace(
        i.storage_index, fqn=key + "_sq")) if i.dest_index.fqn == key else i)
    assert f"rank 1: {key}: a read fills it from the saved '{key}_sq'" in swapped, swapped

    def shifted(i):
        if i.dest_index.fqn != key or i.storage_offsets[0] < 2:
            return i
        return dataclasses.replace(i, storage_offsets=torch.Size(
            [i.storage_offsets[0] - 2, *i.storage_offsets[1:]]))
    moved = check(shifted)
    assert len(moved) == 1 and moved[0].startswith(f"rank 1: {key}: a read of ") \
        and "takes the saved elements at" in moved[0], moved


class TpModel(nn.Module):
    """A Llama-like block small enough for seconds: column-wise in, row-wise out, a norm and
    an embedding replicated over tp, rows that do not divide evenly."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 24)
        self.norm = nn.LayerNorm(24)
        self.w1 = nn.Linear(24, 40, bias=False)
        self.w2 = nn.Linear(40, 24, bias=False)
        self.head = nn.Linear(24, 10)


TP_PLAN = {"w1": "colwise", "w2": "rowwise", "head": "colwise"}


def test_fsdp_x_tp_meshes_are_written_apart_from_hsdp():
    m = Mesh.parse("128x8tp")
    assert (m.world_size, m.shard, m.tp, m.replicas, m.text) == (1024, 128, 8, 1, "128x8tp")
    assert Mesh.parse("64x16").tp == 1 and Mesh.parse("64x16").replicas == 64
    with pytest.raises(ValueError, match="tensor parallelism is written DxTtp"):
        Mesh.parse("8tp")
    with pytest.raises(ValueError, match="has tensor parallelism, but the model has no "
                                         "tensor-parallel plan"):
        m.with_plan({})


def test_fsdp_x_tp_resharded_is_the_references_on_every_tp_coordinate():
    r = check_scale(TpModel, "6x2tp", "4x2tp", tp_plan=TP_PLAN)
    assert r.ok, {k: (s.mismatches[:3], s.cover[:3], s.plans[:3]) for k, s in r.sides.items()}
    save = r.sides["save"]
    assert save.mesh == "6x2tp" and r.sides["load"].mesh == "4x2tp"
    assert {rk % 2 for rk in save.ranks} == {0, 1}  # both tp coordinates sampled
    assert max(save.ranks) == 11


def test_a_tensor_parallel_piece_torch_gives_elsewhere_is_named(monkeypatch):
    # the second tp coordinate's column block, one column right
    shift_piece(monkeypatch, "w2.weight", lambda off: (off[0], off[1] + 1) if off[1] else None)
    r = check_scale(TpModel, "2x2tp", tp_plan=TP_PLAN)
    assert not r.ok
    assert any(m.startswith("rank 1: w2.weight: torch holds shape") and "at offset (0, 21)"
               in m for m in r.sides["save"].mismatches), r.sides["save"].mismatches


def test_the_tiling_of_a_row_wise_grid():
    shape = (4, 6)
    grid = [((0, 0), (2, 3)), ((2, 0), (2, 3)), ((0, 3), (2, 3)), ((2, 3), (2, 3))]
    assert tiling_problem(shape, grid) is None
    assert tiling_problem(shape, grid[:3]) == ("rows 2..4 of the block at (3,) written by no "
                                               "rank")
    assert "written twice" in tiling_problem(shape, grid + [((1, 0), (2, 3))])
    assert tiling_problem(shape, grid[:2]) == ("the blocks cover 3 of the 6 elements of each "
                                               "row (1 block(s))")
    assert tiling_problem(shape, grid[:2] + [((0, 2), (4, 4))]) == \
        "the blocks at (0,) and (2,) overlap"


class TiedWithBuffers(nn.Module):
    """A trainer's model whose state dict is more than its parameters: an output head tied
    to the embedding (two keys, one tensor), a BatchNorm's running statistics and a
    persistent buffer of its own."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 12)
        self.norm = nn.BatchNorm1d(12)
        self.out = nn.Linear(12, 100, bias=False)
        self.out.weight = self.embed.weight
        self.register_buffer("seen", torch.zeros(5))


def test_the_real_state_dict_is_planned_tied_names_and_buffers_included(monkeypatch):
    """DSD's model state dict holds out.weight beside embed.weight and the buffers; every
    one of those keys is planned and checked on both sides. A save plan that drops the
    tied name's write on one rank, or FSDP2 padding a piece one row short, is named."""
    import dataclasses

    import torch.distributed.checkpoint.default_planner as dp

    from fsdp_conformance.scale import check as scale_check
    from fsdp_conformance.scale.plans import checkpoint, key_table
    from fsdp_conformance.scale.simulate import (adam_state, aliases_of, shapes_of,
                                                 simulated_rank)

    r = check_scale(TiedWithBuffers, "64", "48")
    assert r.ok, {k: (s.mismatches[:3], s.plans[:3], s.raised) for k, s in r.sides.items()}
    def fn():
        with torch.device("meta"):
            return TiedWithBuffers()
    assert aliases_of(fn) == {"out.weight": "embed.weight"}
    with simulated_rank(fn, Mesh.parse("8"), 1) as (model, sd):
        table = key_table(checkpoint(sd, adam_state(model, sd, flatten=False)),
                          {**shapes_of(fn), "out.weight": (100, 12)})[0]
    assert table["model.out.weight"].param == "out.weight"
    assert table["model.norm.running_mean"].shape == (12,) and table["model.seen"].param is None

    real = dp.DefaultSavePlanner.create_local_plan

    def dropping(self):
        plan = real(self)
        return dataclasses.replace(plan, items=[i for i in plan.items
                                                if i.index.fqn != "model.out.weight"])
    monkeypatch.setattr(dp.DefaultSavePlanner, "create_local_plan", dropping)
    r = check_scale(TiedWithBuffers, "8", "6")
    monkeypatch.setattr(dp.DefaultSavePlanner, "create_local_plan", real)
    assert not r.ok and "rank 0: model.out.weight: its save plan writes it nowhere, expected " \
        "once" in r.sides["save"].plans, r.sides["save"].plans[:4]

    padded = scale_check.torch_padding_of
    monkeypatch.setattr(scale_check, "torch_padding_of", lambda m: {
        f: (((s[0] - 1, *s[1:]), n) if f == "embed.weight" else (s, n))
        for f, (s, n) in padded(m).items()})
    r = check_scale(TiedWithBuffers, "8")
    assert any(m.startswith("rank 0: embed.weight: torch pads its piece to (12, 12), the "
                            "reference to (13, 12)") for m in r.sides["save"].mismatches), \
        r.sides["save"].mismatches[:3]
