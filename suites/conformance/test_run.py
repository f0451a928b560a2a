"""The conformance run: its matrix, a slice of the quick tier against the installed torch,
planted bugs that the properties must catch, bad-input (P15) cases, and the CLI."""
from __future__ import annotations

import dataclasses
import html
import itertools
import json
import subprocess
from pathlib import Path

import pytest
import torch

from fsdp_conformance.run import matrix
from fsdp_conformance.cases import SCHEDULE_NAMES, Case
from fsdp_conformance.zoo.optimizers import STATE_DTYPE_OPTIMIZERS
from fsdp_conformance.properties.roundtrip import round_trip_verdicts as evaluate
from fsdp_conformance.run.execute import run_cases
from fsdp_conformance import api_paths
from fsdp_conformance.sut import roundtrip
from fsdp_conformance.zoo import OPTIMIZERS

from suites.conftest import PYTHON, ROOT, env_for_subprocess

QUICK = matrix.quick(matrix.default_paths())


def test_quick_tier_covers_every_path_optimizer_and_world_size_pair():
    assert len(QUICK) >= 150
    assert len({c.id for c in QUICK}) == len(QUICK)
    assert [c.id for c in QUICK] == [c.id for c in matrix.quick(matrix.default_paths())]
    for api in matrix.default_paths():
        mine = [c for c in QUICK if c.api == api and not c.fault and not c.golden]
        assert {c.optimizer for c in mine} == (set(OPTIMIZERS) | set(STATE_DTYPE_OPTIMIZERS)
                                               | set(matrix.QUICK_MORE)), api
        pairs = {(c.world_size, c.dst_world_size) for c in mine}
        want = set(itertools.product((1, 2, 3, 4), repeat=2))
        if not api_paths.resizable(api):
            want = {(n, m) for n, m in want if n == m} - {(1, 1)} | {(n, n) for n in (2, 3)}
        assert want <= pairs, (api, sorted(want - pairs))
        if api.startswith("fsdp1"):  # FSDP2 has no flat/orig choice
            assert {c.use_orig_params for c in mine} == {False, True}
    assert {c.fault for c in QUICK} >= {"missing_fqn", "shape", "truncated_file"}


def test_every_torch_optim_optimizer_but_the_excluded_is_in_the_full_tier_on_every_path():
    """Issue 49: every optimizer class of torch.optim is run on every path in the full tier
    (Muon under fully_shard too), but SparseAdam (FSDP produces no
    sparse gradients: not applicable); the ones bringing a new state shape (NAdam, ASGD,
    Adafactor, Muon, LBFGS's state held once) in the quick tier."""
    import torch

    from fsdp_conformance.zoo import ALL_OPTIMIZERS

    excluded = {"SparseAdam"}
    classes = {n for n in dir(torch.optim) if isinstance(getattr(torch.optim, n), type)
               and issubclass(getattr(torch.optim, n), torch.optim.Optimizer)
               and n != "Optimizer"}
    by_class = {cls.__name__: name for name, (cls, _) in ALL_OPTIMIZERS.items()}
    assert classes - excluded <= set(by_class), classes - excluded - set(by_class)
    paths = matrix.default_paths()
    full = matrix.full(paths)
    for api in paths:
        want = {by_class[c] for c in classes - excluded}
        got = {c.optimizer for c in full if c.api == api}
        assert want <= got, (api, want - got)
        quick = {c.optimizer for c in QUICK if c.api == api}
        assert quick >= {"nadam", "asgd", "adafactor", "muon", "lbfgs"}, api
    assert {c.model for c in full if c.optimizer == "muon"} == {"matrices"}


_WITHOUT_MUON = """
import torch
del torch.optim.Muon  # as torch 2.8 and older: torch.optim.Muon came in 2.9
from fsdp_conformance.zoo import MORE_OPTIMIZERS, build_optimizer
from fsdp_conformance.zoo.optimizers import NOT_IN_THIS_TORCH
from fsdp_conformance.run import matrix
from fsdp_conformance.golden import curated, golden_cases
assert "muon" not in MORE_OPTIMIZERS and "torch.optim.Muon" in NOT_IN_THIS_TORCH["muon"]
try:
    build_optimizer("muon", [("w", torch.nn.Parameter(torch.zeros(2, 2)))])
    raise SystemExit("built a Muon that this torch does not have")
except ValueError as exc:
    assert "has no torch.optim.Muon" in str(exc), exc
paths = matrix.default_paths()
assert matrix.quick(paths) and not [c for c in matrix.full(paths) if c.optimizer == "muon"]
assert curated() and not [c for c in curated() if c.optimizer == "muon"]
assert golden_cases() and not [c for c in golden_cases() if c.optimizer == "muon"]
print("ok")
"""


def test_a_torch_without_an_optimizer_runs_without_it():
    """The zoo, the tiers, the curated fixtures and the P12 cases leave out what the installed
    torch lacks (``NOT_IN_THIS_TORCH``; the package could not even be imported under torch 2.8
    once Muon joined the zoo)."""
    out = subprocess.run([PYTHON, "-c", _WITHOUT_MUON], cwd=ROOT, env=env_for_subprocess(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_muon_under_fully_shard_is_judged_where_one_process_can_match():
    """Muon under fully_shard (issue 49): at one rank it trains as single-process Muon (P2
    pass); sharded over more ranks no single-process run is a reference (its bfloat16
    Newton-Schulz on DTensors: zoo.optimizers.NEWTON_SCHULZ_UNMATCHED), so P2 and P6 are
    n/a with that reason, P2 by the save side, P6 by either, while the checkpoint is still
    judged exactly (P1, P3, P7, P8 pass at 2 ranks); where a rank holds no row of a 2-D
    param it raises in training and in DSD's load, each its own entry."""
    from fsdp_conformance.properties.roundtrip import single_process_unmatched

    one_two = Case(api="fsdp2.sharded", optimizer="muon", model="matrices", world_size=1,
                   load_world_size=2)
    both = ("save", "load")
    assert single_process_unmatched(one_two) == ""
    assert "resumed on 2 ranks" in single_process_unmatched(one_two, both)
    assert single_process_unmatched(dataclasses.replace(one_two, optimizer="adam",
                                                        model="mlp"), both) == ""
    assert single_process_unmatched(dataclasses.replace(one_two, api="fsdp1.sharded"),
                                    both) == ""
    # where P6 continues the state at the save (a chain's later link, bfloat16), only the
    # resumed side counts: saved on 2 ranks, resumed on 1
    link = dataclasses.replace(one_two, world_size=2, load_world_size=1)
    assert single_process_unmatched(link, ("load",)) == ""
    assert "saved on 2 ranks" in single_process_unmatched(link, both)
    # FSDP2's NO_SHARD (a shard group of 1) splits nothing; HYBRID_SHARD at 4 shards over 2
    for strategy, ws, split in (("NO_SHARD", 3, False), ("HYBRID_SHARD", 4, True),
                                ("FULL_SHARD", 1, False)):
        c = dataclasses.replace(one_two, strategy=strategy, world_size=ws, load_world_size=None)
        assert bool(single_process_unmatched(c, both)) == split, (strategy, ws)
    # a user's Muon (a subclass too) by the trait a fresh one shows; not a user's Adam
    from fsdp_conformance.zoo.optimizers import (NEWTON_SCHULZ_UPDATE, optimizer_traits_of,
                                                 register_optimizer)

    class MyMuon(torch.optim.Muon):
        pass

    mine = MyMuon([torch.nn.Parameter(torch.zeros(3, 2))])
    assert optimizer_traits_of(mine) == (NEWTON_SCHULZ_UPDATE,)
    assert optimizer_traits_of(torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))])) == ()
    register_optimizer("test_run_my_muon", lambda named: MyMuon([p for _, p in named]),
                       traits=optimizer_traits_of(mine))
    register_optimizer("test_run_my_adam", lambda named: torch.optim.Adam(
        [p for _, p in named]))
    assert "Newton-Schulz" in single_process_unmatched(
        dataclasses.replace(one_two, optimizer="test_run_my_muon"), both)
    assert single_process_unmatched(
        dataclasses.replace(one_two, optimizer="test_run_my_adam"), both) == ""
    # the entries: a rank that holds no row of a trainable 2-D param (torch.chunk's split)
    from fsdp_conformance.known.entries import known_all

    empty = "muon-cannot-step-an-empty-row-shard"
    for strategy, ws, raises in (("FULL_SHARD", 2, False), ("FULL_SHARD", 3, True),
                                 ("NO_SHARD", 3, False), ("HYBRID_SHARD", 4, False),
                                 ("HYBRID_SHARD", 3, True)):
        c = dataclasses.replace(one_two, strategy=strategy, world_size=ws, load_world_size=None)
        assert (empty in [e.key for e in known_all(c, "P1")]) == raises, (strategy, ws)
        mine = dataclasses.replace(c, optimizer="test_run_my_muon")
        assert (empty in [e.key for e in known_all(mine, "P1")]) == raises, (strategy, ws)
    two = Case(api="fsdp2.rank_files", optimizer="muon", model="matrices", world_size=2)
    grows = Case(api="fsdp2.full", optimizer="muon", model="matrices", world_size=2,
                 load_world_size=3)
    three = Case(api="fsdp2.sharded", optimizer="muon", model="matrices", world_size=3,
                 load_world_size=2)
    results = {r.case.id: r.properties for r in run_cases([one_two, two, grows, three],
                                                          timeout=300)}
    v = results[one_two.id]
    assert v["P2"].status == "pass" and v["P6"].status == "n/a", v["P2"].detail
    assert "Newton-Schulz" in v["P6"].detail
    v = results[two.id]
    assert {p: v[p].status for p in ("P1", "P3", "P7", "P8")} == dict.fromkeys(
        ("P1", "P3", "P7", "P8"), "pass")
    assert v["P2"].status == v["P6"].status == "n/a" and "saved on 2 ranks" in v["P2"].detail
    v = results[grows.id]
    assert v["P1"].status == "pass" and v["P2"].status == "n/a"
    # the load raised: P6 says so (known), not n/a
    assert v["P3"].known == v["P6"].known == "dsd-init-steps-muon-on-an-empty-row-shard"
    v = results[three.id]
    assert {v[p].known for p in ("P0", "P1", "P3")} == {
        "muon-cannot-step-an-empty-row-shard"}
    assert not [p for p, x in v.items() if x.status in ("fail", "error")]


def test_fsdp2_hsdp_resharding_is_in_both_tiers():
    """FSDP2 on a 2-D mesh, saved at one mesh and loaded at another: 2x2 -> 2x2, 2x2 -> 1x2,
    1x2 -> 2x2, 2x2 -> 1x3 and back in the quick tier, every pair with 2 or 4 ranks on one
    side and every optimizer in the full tier; reshard_after_forward=False and a
    replicate-only mesh too."""
    full = matrix.full(["fsdp2.full", "fsdp2.sharded"])
    for api in ("fsdp2.full", "fsdp2.sharded"):
        hsdp = {(c.world_size, c.dst_world_size) for c in QUICK
                if c.api == api and c.strategy == "HYBRID_SHARD"}
        assert hsdp == set(matrix.QUICK_HSDP_PAIRS), (api, hsdp)
        assert {c.strategy for c in QUICK if c.api == api} >= {
            "FULL_SHARD", "HYBRID_SHARD", "SHARD_GRAD_OP", "NO_SHARD"}
        mine = [c for c in full if c.api == api and c.strategy == "HYBRID_SHARD"]
        assert {(c.world_size, c.dst_world_size) for c in mine} == set(matrix.FULL_HSDP_PAIRS)
        assert {c.optimizer for c in mine} == set(OPTIMIZERS)


def test_compiled_models_are_in_both_tiers_and_compile_the_named_side():
    """Saved compiled and loaded uncompiled, the reverse, and both, on each FSDP2 path (the
    quick tier with AdamW, the full tier with every optimizer); the named side's model is
    torch.compile's wrapper, whose FQNs carry ``_orig_mod``; FSDP1 and bounds cases refuse
    it."""
    import torch
    from torch import nn

    from fsdp_conformance.sut.roundtrip import compiled_for

    full = matrix.full(["fsdp2.full", "fsdp2.sharded"])
    for api in ("fsdp2.full", "fsdp2.sharded"):
        assert {c.compiled for c in QUICK if c.api == api} == {"", "save", "load", "both"}
        assert {c.optimizer for c in full if c.api == api and c.compiled} == set(OPTIMIZERS)
    case = Case(api="fsdp2.full", compiled="save")
    m = nn.Linear(2, 2)
    run = compiled_for(case, m, load_side=False)
    assert isinstance(run, torch._dynamo.eval_frame.OptimizedModule)
    assert list(run.state_dict()) == ["_orig_mod.weight", "_orig_mod.bias"]
    assert compiled_for(case, m, load_side=True) is m
    assert case.id.endswith("/compiled:save")
    with pytest.raises(ValueError, match="applies to the FSDP2 round trips"):
        Case(api="fsdp1.full", compiled="both")


def test_a_scheduler_built_after_the_load_is_in_both_tiers_on_every_path():
    """``scheduler_after_load``: the quick tier has one case per path (SGD momentum, two
    groups, resharded where the path can; fsdp2.full a second, loading without
    broadcast_from_rank0), the full tier every optimizer and every stateful schedule on
    every path, beside the same cases with the scheduler built before; it needs a
    scheduler."""
    paths = matrix.default_paths()
    full = matrix.full(paths)
    for api in paths:
        after_load = [c for c in QUICK if c.api == api and c.scheduler_after_load]
        assert len([c for c in after_load if not c.no_broadcast]) == 1, api
        assert len(after_load) == (2 if api == "fsdp2.full" else 1), api
        after = {c.optimizer for c in full if c.api == api and c.scheduler_after_load}
        assert after == set(OPTIMIZERS), api
        kinds = {c.scheduler for c in full if c.api == api and c.scheduler_after_load}
        assert kinds == set(SCHEDULE_NAMES), api
    case = Case(api="fsdp2.full", scheduler=True, scheduler_after_load=True)
    assert "+sched@load/" in case.id
    with pytest.raises(ValueError, match="needs scheduler=True"):
        Case(api="fsdp2.full", scheduler_after_load=True)


def _mixed_precision_dtypes(ctx, case):
    """The case's wrapped model after one training step: (its output's dtype, its params'
    dtypes, its optimizer state's floating dtypes)."""
    import torch

    from fsdp_conformance.sut.fsdp2 import wrap_fsdp2
    from fsdp_conformance.zoo import build_optimizer, make_batch, train_step

    model = wrap_fsdp2(ctx, case)
    optim = build_optimizer(case.optimizer, list(model.named_parameters()), case.groups)
    x = make_batch(case.model, case.seed, 0, case.batch, case.torch_dtype)
    out = model(x)
    train_step(model, optim, x)
    state = {v.dtype for st in optim.state.values() for k, v in st.items()
             if torch.is_tensor(v) and v.is_floating_point() and k != "step"}
    return out.dtype, {p.dtype for p in model.parameters()}, state


def test_mixed_precision_is_in_both_tiers_and_computes_in_bfloat16(rank_pool):
    """``mixed_precision="bf16"``: FSDP2's MixedPrecisionPolicy on both sides (quick: AdamW
    and Adagrad 2 -> 3, Adam with groups and a scheduler 4 -> 2; full: every optimizer); the
    wrapped model computes in bfloat16 while its params and optimizer state stay float32;
    the single-process baseline computes in bfloat16 the same way (its gradients are not
    float32's); float32 only, FSDP2 round trips only."""
    import torch

    from fsdp_conformance.zoo import build_model, make_batch
    from fsdp_conformance.zoo.models import loss_of, mixed_precision_backward

    full = matrix.full(["fsdp2.full", "fsdp2.sharded"])
    for api in ("fsdp2.full", "fsdp2.sharded"):
        mp = [c for c in QUICK if c.api == api and c.mixed_precision]
        assert {(c.optimizer, c.world_size, c.dst_world_size) for c in mp} == {
            ("adamw", 2, 3), ("adagrad", 2, 3), ("adam", 4, 2)}
        assert {c.optimizer for c in full if c.api == api and c.mixed_precision} == \
            set(OPTIMIZERS)
    case = Case(api="fsdp2.full", optimizer="adam", dtype="fp32", mixed_precision="bf16")
    assert case.id.endswith("/fp32/mp:bf16") and case.compute_dtype == "bf16"
    out, params, state = rank_pool(2).run(_mixed_precision_dtypes, case)[0]
    assert (out, params, state) == (torch.bfloat16, {torch.float32}, {torch.float32})
    model = build_model("mlp", 0, torch.float32)
    x = make_batch("mlp", 0, 0, 12, torch.float32)
    loss_of(model, x).backward()
    exact = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    mixed_precision_backward(model, x, torch.bfloat16)
    for n, p in model.named_parameters():
        assert p.dtype == p.grad.dtype == torch.float32
        assert not torch.equal(p.grad, exact[n]), n  # computed in bfloat16, not float32
        assert torch.allclose(p.grad, exact[n], rtol=0.1, atol=1e-2), n
    with pytest.raises(ValueError, match="dtype must be 'fp32'"):
        Case(api="fsdp2.full", mixed_precision="bf16")
    with pytest.raises(ValueError, match="applies to the FSDP2 round trips"):
        Case(api="fsdp1.full", dtype="fp32", mixed_precision="bf16")


def test_float32_state_for_bfloat16_params_is_in_both_tiers_on_every_path():
    """The state-dtype optimizers (float32 state, bfloat16 params) run on every path: the
    quick tier at 2 -> 3 (2 -> 2 where the path cannot reshard), the full tier at four
    world-size pairs."""
    paths = matrix.default_paths()
    full = matrix.full(paths)
    for api in paths:
        for opt in STATE_DTYPE_OPTIMIZERS:
            quick = [c for c in QUICK if c.api == api and c.optimizer == opt]
            assert [c.dtype for c in quick] == ["bf16"], api
            assert len([c for c in full if c.api == api and c.optimizer == opt]) == (
                4 if matrix.resizable(api) else 3), api


def test_async_save_writes_the_state_at_the_save_while_training_goes_on(rank_pool, tmp_path):
    """``async_save``: fsdp2.sharded writes with dcp.async_save on a checkpoint group of its
    own and takes the next optimizer step before waiting on the Future. The step ran (the
    record times it), and the checkpoint holds the state at the save, not the state one
    step later (so P8's read-back comparison can tell them apart); in both tiers."""
    from fsdp_conformance.properties.baseline import local_run
    from fsdp_conformance.properties.torch_files import read_dcp
    from fsdp_conformance.api_paths import DCP_DIR
    from fsdp_conformance.sut.roundtrip import save_side

    full = matrix.full(["fsdp2.sharded"])
    assert [(c.optimizer, c.app_state) for c in QUICK if c.async_save and not c.crash] == [
        ("adam", False), ("adam", True)]
    assert {c.optimizer for c in full if c.async_save} == set(OPTIMIZERS)
    case = Case(api="fsdp2.sharded", optimizer="adam", world_size=2, load_world_size=3,
                async_save=True)
    save = rank_pool(2).run(save_side, case, str(tmp_path), seed=case.seed)
    assert all(o.timings["race"] > 0 for o in save)
    written = read_dcp(tmp_path / DCP_DIR)["state"]
    at_save = local_run(case).optim_at_save["state"]
    later = local_run(dataclasses.replace(case, resume_steps=1)).optim_at_end["state"]
    for fqn, st in written.items():
        assert torch.allclose(st["exp_avg"], at_save[fqn]["exp_avg"], rtol=1e-9, atol=1e-12)
        assert not torch.allclose(st["exp_avg"], later[fqn]["exp_avg"], rtol=1e-6), fqn
    with pytest.raises(ValueError, match="applies to the fsdp2.sharded round trips"):
        Case(api="fsdp2.full", async_save=True)


def test_an_app_state_checkpoint_holds_model_optimizer_scheduler_and_step(rank_pool,
                                                                          tmp_path):
    """``app_state``: fsdp2.sharded writes one DCP ``Stateful`` (sut/app_state.py) under
    "app": the model, the optimizer (what ``get_state_dict`` returns), the LR scheduler's
    state and the step, each as at the save; in both tiers, with dcp.save and with
    dcp.async_save. A load that restores another step than the save's is an error."""
    from fsdp_conformance.properties.baseline import local_run
    from fsdp_conformance.api_paths import DCP_DIR
    from fsdp_conformance.sut.roundtrip import save_side
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    full = matrix.full(["fsdp2.sharded"])
    assert {(c.optimizer, c.async_save) for c in QUICK if c.app_state} == {
        ("adam", False), ("adam", True)}
    assert {c.optimizer for c in full if c.app_state} == set(OPTIMIZERS)
    case = Case(api="fsdp2.sharded", optimizer="adam", groups=2, scheduler=True,
                world_size=2, load_world_size=3, app_state=True)
    rank_pool(2).run(save_side, case, str(tmp_path), seed=case.seed)
    dcp_to_torch_save(str(tmp_path / DCP_DIR), str(tmp_path / "app.pt"))
    app = torch.load(tmp_path / "app.pt", weights_only=False)["app"]
    assert sorted(app) == ["model", "optim", "sched", "step"]
    assert app["step"] == case.steps
    assert app["sched"] == local_run(case).sched_at_save
    assert set(app["optim"]["state"]) == set(local_run(case).optim_at_save["state"])
    with pytest.raises(ValueError, match="pick one"):
        Case(api="fsdp2.sharded", scheduler=True, scheduler_after_load=True, app_state=True)


def test_nonstrict_loads_are_in_both_tiers_on_the_fsdp2_round_trips():
    """``nonstrict``: FSDP2 loads with strict=False on the ``unused`` model and the mlp (quick:
    Adam and plain SGD; full: every optimizer), on both FSDP2 round trips only."""
    full = matrix.full(["fsdp2.full", "fsdp2.sharded"])
    for api in ("fsdp2.full", "fsdp2.sharded"):
        mine = [c for c in QUICK if c.api == api and c.nonstrict
                and not c.ignore_frozen_params]  # those: test_ignore_frozen_params_...
        assert {(c.optimizer, c.model) for c in mine} == {
            ("adam", "unused"), ("adam", "mlp"), ("sgd", "unused"), ("sgd", "mlp")}
        assert {c.optimizer for c in full if c.api == api and c.nonstrict} == set(OPTIMIZERS)
    assert Case(api="fsdp2.full", nonstrict=True).id.endswith("/nonstrict")
    with pytest.raises(ValueError, match="applies to the FSDP2 round trips"):
        Case(api="fsdp1.full", nonstrict=True)


def test_ignore_frozen_params_is_in_both_tiers_and_leaves_frozen_params_out(rank_pool,
                                                                            tmp_path):
    """``ignore_frozen_params``: every FSDP2 state-dict call passes it (quick: Adam, full:
    every optimizer; the optimizer round trip on ``late_frozen`` on every FSDP2 path, and on
    fsdp2.sharded the
    app state of both frozen models, strict and not); the model part of the checkpoint
    then has no frozen param, the optimizer part still has their state."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from fsdp_conformance.api_paths import DCP_DIR
    from fsdp_conformance.sut.roundtrip import save_side

    full = matrix.full(["fsdp2.full", "fsdp2.sharded"])
    want = {(api, "late_frozen", False, False) for api in api_paths.paths_of("fsdp2")} | {
        ("fsdp2.sharded", m, app, ns) for m, app, ns in (
            ("late_frozen", False, False), ("frozen", True, False), ("frozen", True, True),
            ("late_frozen", True, False), ("late_frozen", True, True))}
    assert {(c.api, c.model, c.app_state, c.nonstrict) for c in QUICK
            if c.ignore_frozen_params} == want
    assert {c.optimizer for c in full if c.ignore_frozen_params} == set(OPTIMIZERS)
    case = Case(api="fsdp2.sharded", optimizer="adam", model="late_frozen", world_size=2,
                load_world_size=3, ignore_frozen_params=True, app_state=True)
    rank_pool(2).run(save_side, case, str(tmp_path), seed=case.seed)
    dcp_to_torch_save(str(tmp_path / DCP_DIR), str(tmp_path / "app.pt"))
    app = torch.load(tmp_path / "app.pt", weights_only=False)["app"]
    assert not any(k.startswith("inp.") for k in app["model"]), sorted(app["model"])
    assert {"inp.weight", "inp.bias"} <= set(app["optim"]["state"])


def _post_forward_mesh_sizes(ctx, case):
    """Per FSDP2 unit of the case's wrapped model: the shard size params are resharded to
    after forward (None: kept unsharded)."""
    from fsdp_conformance.sut.fsdp2 import wrap_fsdp2

    model = wrap_fsdp2(ctx, case)
    sizes = {}
    for name, mod in model.named_modules():
        group = mod._get_fsdp_state()._fsdp_param_group if hasattr(mod, "_get_fsdp_state") \
            else None
        if group is not None:
            info = group.post_forward_mesh_info
            sizes[name] = None if info is None else info.shard_mesh_size
    return sizes


def test_reshard_after_forward_as_an_int_is_in_both_tiers_and_reaches_fully_shard(rank_pool):
    """``reshard_after_forward=2``: every FSDP2 unit reshards its params to 2 of the 4 ranks
    after forward (saved at 4, loaded at 4 and at 2); the quick tier has it per FSDP2 path,
    the full tier with every optimizer; anything but a factor of both world sizes, or a
    path other than the FSDP2 round trips, is refused."""
    full = matrix.full(["fsdp2.full", "fsdp2.sharded"])
    for api in ("fsdp2.full", "fsdp2.sharded"):
        raf = [c for c in QUICK if c.api == api and c.reshard_after_forward]
        assert {(c.world_size, c.dst_world_size, c.reshard_after_forward) for c in raf} == {
            (4, 4, 2), (4, 2, 2)}
        assert {c.optimizer for c in full if c.api == api and c.reshard_after_forward} == \
            set(OPTIMIZERS)
    case = Case(api="fsdp2.full", reshard_after_forward=2, world_size=4)
    assert "/raf2/" in case.id
    sizes = rank_pool(4).run(_post_forward_mesh_sizes, case)
    assert sizes[0] and all(s == 2 for s in sizes[0].values()), sizes[0]
    assert set(rank_pool(4).run(_post_forward_mesh_sizes, Case(api="fsdp2.full",
                                                               world_size=4))[0].values()) \
        <= {None, 4}  # the default: the whole shard group (the root keeps its params)
    with pytest.raises(ValueError, match="factor"):
        Case(api="fsdp2.full", reshard_after_forward=2, world_size=4, load_world_size=3)
    with pytest.raises(ValueError, match="applies to the FSDP2 round trips"):
        Case(api="fsdp1.full", reshard_after_forward=2, world_size=4)


def _tp_placements(ctx, case):
    """The wrapped model's mesh shape and each param's placements, as the run records them."""
    from fsdp_conformance.sut.fsdp2 import mesh_shape, param_layout, wrap_fsdp2

    model = wrap_fsdp2(ctx, case)
    return (mesh_shape(ctx, case, case.tensor_parallel),
            {m["fqn"]: m["placements"] for m in param_layout(model)})


def _nudge_row_wise_state(sd):  # element [0, 7] of fc2: tp rank 1's columns, dp rank 0's rows
    sd["state"]["layers.0.fc2.weight"]["exp_avg_sq"][0, 7] += 1e-3


def test_fsdp2_over_tensor_parallel_is_in_both_tiers_and_shards_by_the_plan(rank_pool,
                                                                            tmp_path):
    """FSDP2 over a (dp, tp) mesh: the quick tier has every pair of ``TP_PAIRS`` per FSDP2
    path (2x2 -> 2x2, -> 1x2, -> 2 and 4 without tp, 2 -> 2x2), the full tier every
    optimizer there. The wrapped model is what the plan says (column-wise fc1 strided over
    dp, row-wise fc2 on both dims, the rest on dp alone); a state element planted wrong in
    the checkpoint is found on the one rank whose box holds it; other paths, strategies and
    world sizes are refused."""
    full = matrix.full(["fsdp2.full", "fsdp2.sharded"])
    for api in ("fsdp2.full", "fsdp2.sharded"):
        tp = {(c.world_size, c.tensor_parallel, c.dst_world_size, c.dst_tensor_parallel)
              for c in QUICK if c.api == api and c.model == "tp_ffn"}
        assert tp == set(matrix.TP_PAIRS), (api, tp)
        assert {c.optimizer for c in full if c.api == api and c.model == "tp_ffn"} == \
            set(OPTIMIZERS)
    case = Case(api="fsdp2.full", model="tp_ffn", optimizer="adam", world_size=4,
                tensor_parallel=2)
    assert "/tp2/" in case.id and "/tp2->0/" in dataclasses.replace(
        case, load_tensor_parallel=0).id
    mesh, placements = rank_pool(4).run(_tp_placements, case)[3]
    assert mesh == (2, 2)
    assert placements["layers.0.fc1.weight"] == [("strided_shard", 0, 2), ("shard", 0)]
    assert placements["layers.0.fc2.weight"] == [("shard", 0), ("shard", 1)]
    assert placements["layers.0.fc2.bias"] == [("shard", 0), ("replicate",)]
    assert placements["head.weight"] == placements["layers.1.norm.bias"] == [("shard", 0)]
    save = rank_pool(4).run(roundtrip.save_side, case, str(tmp_path), seed=0)
    f = tmp_path / api_paths.FULL_FILE
    sd = torch.load(f, weights_only=True)
    _nudge_row_wise_state(sd)
    torch.save(sd, f)
    load = rank_pool(4).run(roundtrip.load_side, case, str(tmp_path), seed=0)
    p3 = evaluate(case, save, load, tmp_path)["P3"]
    assert p3.status == "fail", p3.detail
    assert "rank 1 after loading differs" in p3.detail, p3.detail
    assert not any(f"rank {r} after loading" in p3.detail for r in (0, 2, 3)), p3.detail
    with pytest.raises(ValueError, match="applies to the FSDP2 round trips"):
        Case(api="fsdp1.full", model="tp_ffn", world_size=4, tensor_parallel=2)
    with pytest.raises(ValueError, match="strategy must be FULL_SHARD"):
        Case(api="fsdp2.full", model="tp_ffn", world_size=4, tensor_parallel=2,
             strategy="HYBRID_SHARD")
    with pytest.raises(ValueError, match="factor"):
        Case(api="fsdp2.full", model="tp_ffn", world_size=4, tensor_parallel=2,
             load_world_size=3)


def test_flattened_optimizer_state_dicts_are_in_both_tiers_and_are_what_is_written(rank_pool,
                                                                                   tmp_path):
    """``flatten_optimizer_state_dict=True`` on both FSDP2 paths (quick: 2 cases each, full:
    every optimizer); the sharded path's DCP checkpoint holds the flattened keys
    (``optim.param_groups.<fqn>.lr``), and the rank records the nested form."""
    from torch.distributed.checkpoint import FileSystemReader

    from fsdp_conformance.api_paths import DCP_DIR
    from fsdp_conformance.sut.roundtrip import save_side

    full = matrix.full(["fsdp2.full", "fsdp2.sharded"])
    for api in ("fsdp2.full", "fsdp2.sharded"):
        assert len([c for c in QUICK if c.api == api and c.flatten_optimizer_state_dict]) == 2
        assert {c.optimizer for c in full
                if c.api == api and c.flatten_optimizer_state_dict} == set(OPTIMIZERS)
    case = Case(api="fsdp2.sharded", optimizer="adam", world_size=2,
                flatten_optimizer_state_dict=True)
    assert case.id.endswith("/flat_osd")
    [rec, _] = rank_pool(2).run(save_side, case, str(tmp_path), seed=case.seed)
    keys = set(FileSystemReader(str(tmp_path / DCP_DIR)).read_metadata().state_dict_metadata)
    assert "optim.param_groups.inp.weight.lr" in keys and "optim.param_groups" not in keys
    assert "optim.state.inp.weight.exp_avg" in keys
    assert [g["params"] for g in rec.saved["param_groups"]] == [rec.keys]
    with pytest.raises(ValueError, match="applies to the FSDP2 round trips"):
        Case(api="fsdp1.dsd_full", flatten_optimizer_state_dict=True)


def test_cpu_offload_is_in_both_tiers_and_pinned_is_na_with_torchs_refusal_without_gpu():
    """CPUOffloadPolicy on both FSDP2 paths: unpinned is judged like any case; pinned
    (torch's default) needs an accelerator, and on a machine without one every property
    it decides is "n/a" quoting torch's refusal and where it raised, never an error and
    never a silent skip. Any other failure of the same step stays an error."""
    from fsdp_conformance.harness.errors import RankError, RankFailure
    from fsdp_conformance.run.lifecycle import StepFailed, not_applicable_here

    full = matrix.full(["fsdp2.full", "fsdp2.sharded"])
    for api in ("fsdp2.full", "fsdp2.sharded"):
        assert {c.cpu_offload for c in QUICK if c.api == api} == {"", "pinned", "unpinned"}
        assert {c.optimizer for c in full if c.api == api and c.cpu_offload == "unpinned"} \
            == set(OPTIMIZERS)
    with pytest.raises(ValueError, match="applies to the FSDP2 round trips"):
        Case(api="fsdp1.full", cpu_offload="unpinned")
    pinned = Case(api="fsdp2.sharded", optimizer="adam", world_size=2, cpu_offload="pinned")
    [r] = run_cases([pinned], timeout=120)
    decided = {p: v for p, v in r.properties.items() if p in [f"P{i}" for i in range(12)]
               and p not in ("P4", "P5", "P10")}
    if torch.accelerator.is_available():
        assert all(v.status != "n/a" for v in decided.values()), decided
    else:
        assert {v.status for v in decided.values()} == {"n/a"}, decided
        from fsdp_conformance.sut.fsdp2 import PIN_REFUSALS

        assert all(any(f"fully_shard raised RuntimeError: {r}" in v.detail for r in PIN_REFUSALS)
                   and "(in _init_sharded_param, _fsdp_param.py:" in v.detail
                   for v in decided.values()), decided
    refusal = RankFailure(0, "exception NotApplicableHere",
                          "Traceback ...\nfsdp_conformance.sut.records.NotApplicableHere: why")
    other = RankFailure(1, "exception RuntimeError", "Traceback ...\nRuntimeError: boom")
    assert not_applicable_here(StepFailed("save side", RankError("x", [refusal]),
                                          hung=False)) == "why"
    assert not_applicable_here(StepFailed("save side", RankError("x", [refusal, other]),
                                          hung=False)) == ""


def test_select_keyword_and_world_sizes():
    sel = matrix.select(QUICK, world_sizes=[2], keyword="fsdp1.full adam not adamw")
    assert sel and all(c.world_size == 2 == c.dst_world_size for c in sel)
    assert all("fsdp1.full" in c.id and "adam" in c.id and "adamw" not in c.id for c in sel)


# One case per path, in several configurations: the installed torch, as recorded in
# known/entries.py, must conform (every verdict pass, known or n/a) -- and no known limitation may
# pass silently ("fixed upstream?" fails here so known.py cannot go stale).
SLICE = [c for c in QUICK if not c.fault and not c.golden and not c.bounds and not c.crash
         and c.cpu_offload != "pinned"][::9]
# golden: suites/fixtures; bounds (P13/P14): suites/bounds; crash (P16):
# suites/conformance/test_crash.py; pinned CPU offload needs an
# accelerator (n/a here): test_cpu_offload_is_in_both_tiers_and_pinned_is_na_..._without_gpu


@pytest.mark.parametrize("case", SLICE, ids=lambda c: c.id)
def test_quick_slice_conforms(case):
    [result] = run_cases([case], timeout=120)
    bad = {p: v for p, v in result.properties.items() if not v.ok or v.fixed_upstream}
    assert not bad, "\n\n".join(f"{p} {v.status}: {v.detail[:3000]}" for p, v in bad.items())
    assert result.properties["P1"].status in ("pass", "known")
    assert result.properties["P6"].status in ("pass", "known", "n/a")


def _roundtrip(rank_pool, case, tmp_path, mutate=None):
    """Save, optionally damage the saved full dict on disk, load; the case's verdicts."""
    save = rank_pool(case.world_size).run(roundtrip.save_side, case, str(tmp_path), seed=case.seed)
    if mutate is not None:
        f = tmp_path / api_paths.FULL_FILE
        sd = torch.load(f, weights_only=True)
        mutate(sd)
        torch.save(sd, f)
    load = rank_pool(case.dst_world_size).run(roundtrip.load_side, case, str(tmp_path), seed=case.seed)
    return evaluate(case, save, load, tmp_path)


PLANTED = Case(api="fsdp1.full", optimizer="sgd_momentum", groups=2, scheduler=True,
               world_size=2, load_world_size=3)


def test_clean_roundtrip_passes(rank_pool, tmp_path):
    v = _roundtrip(rank_pool, PLANTED, tmp_path)
    for p in ("P0", "P1", "P2", "P3", "P6", "P7", "P8", "P9", "P11"):
        assert v[p].status == "pass", f"{p}: {v[p].detail}"


def _scale_lr(sd):
    sd["param_groups"][1]["lr"] *= 1.01


def _drop_momentum(sd):  # a trainer that keeps the groups but drops the momentum buffers
    sd["state"].clear()


def _drop_initial_lr(sd):
    del sd["param_groups"][0]["initial_lr"]


@pytest.mark.parametrize("mutate,caught", [
    (_scale_lr, ("P6", "P11")),          # a 1% lr error in one group
    (_drop_momentum, ("P6",)),           # a dropped momentum buffer
    (_drop_initial_lr, ("P11",)),        # an extra key lost (LR scheduler's initial_lr)
], ids=["lr+1%", "momentum-dropped", "initial_lr-dropped"])
def test_planted_bugs_are_caught(rank_pool, tmp_path, mutate, caught):
    v = _roundtrip(rank_pool, PLANTED, tmp_path, mutate)
    for p in caught:
        assert v[p].status == "fail", f"{p} missed the planted bug: {v[p].status} {v[p].detail}"


PLANTED_FSDP2 = dataclasses.replace(PLANTED, api="fsdp2.full")


@pytest.mark.parametrize("mutate,caught", [
    (None, ()),                          # the clean round trip conforms
    (_scale_lr, ("P6", "P11")),
    (_drop_momentum, ("P3", "P6")),      # DSD keeps its own zero-grad buffers: P3 sees them
], ids=["clean", "lr+1%", "momentum-dropped"])
def test_planted_bugs_are_caught_fsdp2(rank_pool, tmp_path, mutate, caught):
    """The FSDP2 full path (broadcast_from_rank0) through the same properties."""
    save = rank_pool(2).run(roundtrip.save_side, PLANTED_FSDP2, str(tmp_path), seed=0)
    if mutate is not None:
        f = tmp_path / api_paths.FULL_FILE
        sd = torch.load(f, weights_only=True)
        mutate(sd)
        torch.save(sd, f)
    load = rank_pool(3).run(roundtrip.load_side, PLANTED_FSDP2, str(tmp_path), seed=0)
    v = evaluate(PLANTED_FSDP2, save, load, tmp_path)
    if mutate is None:
        for p in ("P0", "P1", "P2", "P3", "P6", "P7", "P8", "P9", "P11"):
            assert v[p].status == "pass", f"{p}: {v[p].detail}"
    for p in caught:
        assert v[p].status == "fail", f"{p} missed the planted bug: {v[p].status} {v[p].detail}"


def test_extra_step_is_caught_by_p2(rank_pool, tmp_path):
    case = dataclasses.replace(PLANTED, optimizer="adam", load_world_size=None)
    save = rank_pool(2).run(roundtrip.save_side, case, str(tmp_path), seed=0)
    load = rank_pool(2).run(roundtrip.load_side, case, str(tmp_path), seed=0)
    for st in save[0].saved["state"].values():
        st["step"] = st["step"] + 1
    v = evaluate(case, save, load, tmp_path)
    assert v["P2"].status == "fail" and "step" in v["P2"].detail


@pytest.mark.parametrize("fault,status", [("extra_fqn", "pass"), ("missing_fqn", "known"),
                                          ("truncated_file", "known")])
def test_bad_input_cases(fault, status):
    [r] = run_cases([Case(api="fsdp1.full", optimizer="adam", world_size=2, fault=fault)],
                    fault_timeout=30)
    v = r.properties["P15"]
    assert v.status == status, v.detail
    assert all(r.properties[p].status == "n/a" for p in r.properties if p != "P15")


def test_stranded_ranks_become_a_verdict_not_a_hang():
    [r] = run_cases([Case(api="fsdp1.legacy_scatter", optimizer="adam", world_size=2,
                          fault="truncated_file")], fault_timeout=20)
    v = r.properties["P15"]
    assert v.status == "known" and "left waiting" in v.detail, v.detail


def _cli(*args, timeout=300):
    return subprocess.run([PYTHON, "-m", "fsdp_conformance", *args], cwd=ROOT,
                          env=env_for_subprocess(), capture_output=True, text=True,
                          timeout=timeout)


def test_cli_run_writes_reports(tmp_path):
    case = "fsdp1.full/adam/mlp.nested/flat/ws1->3/fp64"
    assert case in {c.id for c in QUICK}
    out = tmp_path / "r.json"
    p = _cli("run", "-k", case, "--out", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads(out.read_text())
    assert report["schema"] == "fsdp-conformance/run/1" and report["ok"] is True
    assert [c["id"] for c in report["cases"]] == [case]
    assert Path(str(out)[:-5] + ".md").read_text().startswith("#")
    page = Path(str(out)[:-5] + ".html").read_text()
    assert page.startswith("<!DOCTYPE html>") and html.escape(case) in page
    assert "P15" in report["cases"][0]["properties"]


def test_cli_usage_errors():
    assert _cli("run", "--world-sizes", "0", "--list").returncode == 2
    p = _cli("run", "-k", "no-such-case", "--list")
    assert p.returncode == 2 and "no case" in p.stderr


# -- how known limitations are applied (no rank pool needed) --------------------------------
ALIASED = Case(api="fsdp1.full", optimizer="adam", use_orig_params=True, world_size=2)


def test_known_entry_covers_its_wrong_values_but_not_a_new_crash():
    from fsdp_conformance.properties.verdict import Verdict, error, fail, suite_error
    from fsdp_conformance.known.apply import apply_known as _apply_known
    from fsdp_conformance.run.kinds import failed_verdicts as _failed

    # a wrong value is known only when the case judged again under the entry's model
    # passes: an arbitrary "exp_avg differs" with no modelled verdicts stays a failure
    v = _apply_known(ALIASED, {"P1": fail("exp_avg differs")})
    assert v["P1"].status == "fail"
    v = _apply_known(ALIASED, {"P1": fail("exp_avg differs")},
                     {"orig-params-full-osd-aliasing": {"P1": Verdict("pass")}})
    assert v["P1"].status == "known" and v["P1"].known == "orig-params-full-osd-aliasing"
    v = _apply_known(ALIASED, {"P1": fail("exp_avg differs")},
                     {"orig-params-full-osd-aliasing": {"P1": fail("exp_avg_sq differs")}})
    assert v["P1"].status == "fail" and v["P1"].known == "orig-params-full-osd-aliasing"
    assert "exp_avg_sq differs" in v["P1"].detail
    crash = _apply_known(ALIASED, _failed(ALIASED, error("load side failed: brand-new crash")))
    assert {x.status for p, x in crash.items()
            if p not in ("P5", "P12", "P13", "P14", "P15", "P16")} == {"error"}
    # the origin decides, not the text: a torch error that happens to start with the words
    # the suite uses is still a torch error, and the suite's own failure stays an error
    # whatever its text says
    case = Case(api="fsdp1.sharded", optimizer="sgd", world_size=2)
    msg = 'ValueError: `optim_state_dict` must have the keys "state"to be valid'
    mimic = _apply_known(case, {"P3": error("the suite failed: " + msg)})
    assert mimic["P3"].status == "known"
    ours = _apply_known(case, {"P3": Verdict("error", msg, origin="suite")})
    assert ours["P3"].status == "error"
    ours = _apply_known(case, _failed(case, suite_error("evaluating: " + msg)))
    assert "known" not in {x.status for x in ours.values()}


def test_known_crash_is_matched_by_its_symptom_and_carries_downstream():
    from fsdp_conformance.properties.verdict import error
    from fsdp_conformance.known.apply import apply_known as _apply_known
    from fsdp_conformance.run.kinds import failed_verdicts as _failed

    case = Case(api="fsdp1.sharded", optimizer="sgd", world_size=2)
    msg = 'load failed: ValueError: `optim_state_dict` must have the keys "state"to be valid'
    v = _apply_known(case, _failed(case, error(msg)))
    assert v["P3"].known == "dcp-drops-empty-optimizer-state"
    assert v["P0"].status == "known" and v["P11"].status == "known"  # same root cause


def test_full_tier_crashes_are_known_by_their_symptom_only():
    """Entries the full tier needed: every optimizer's crash on ShardedTensor state of an
    ignored module, the world-size-1 save crash of frozen params with use_orig_params (any
    load size), and DSD dropping frozen params' state; another crash there stays an error."""
    from fsdp_conformance.properties.verdict import error, fail
    from fsdp_conformance.known.apply import apply_known as _apply_known
    from fsdp_conformance.run.kinds import failed_verdicts as _failed

    ignored = Case(api="fsdp1.sharded", optimizer="adagrad", model="buffers", world_size=4)
    st = "RuntimeError: torch function 'addcmul_', with args: (ShardedTensor(ShardedTensorMe"
    v = _apply_known(ignored, _failed(ignored, error(f"load side failed: {st}")))
    assert v["P3"].known == "sharded-ignored-module-state-stays-sharded"
    assert v["P0"].status == "known"
    other = _apply_known(ignored, _failed(ignored, error("load side failed: KeyError: 'sum'")))
    assert other["P3"].status == "error"

    frozen = Case(api="fsdp1.full", optimizer="sgd_momentum", model="frozen",
                  use_orig_params=True, world_size=1, load_world_size=2)
    msg = "torch raised in the fsdp1.full save call on rank 0:\nKeyError: Parameter containing:"
    v = _apply_known(frozen, _failed(frozen, error(msg)))
    assert v["P1"].known == "orig-params-frozen-full-osd" and v["P11"].status == "known"

    dsd = Case(api="fsdp2.sharded", optimizer="adagrad", model="frozen", world_size=2,
               load_world_size=3)
    from fsdp_conformance.properties.verdict import Verdict

    observed = {"P3": fail("state['inp.bias']: missing; expected {'step': "
                           "tensor(0.), 'sum': tensor([0.])}, got <absent>"),
                "P7": fail("state['block.0.bias']['sum']: value at elements 0..3")}
    modelled = {"dsd-sharded-load-drops-frozen-state": {  # judged again under its model
        "P3": Verdict("pass"), "P7": fail("state['block.0.bias']['sum']: value at 0..3")}}
    v = _apply_known(dsd, observed, modelled)
    assert v["P3"].known == "dsd-sharded-load-drops-frozen-state"
    assert v["P7"].status == "fail"  # a wrong value the model does not predict


def test_bf16_resume_comparison_names_a_type_change():
    """bfloat16's P6 compares tensors by relative L2 error, everything else exactly, with the
    same words as the other properties (a tuple that came back a list: "got list")."""
    import torch

    from fsdp_conformance.properties.run_props import _norm_diffs

    want = {"param_groups": [{"betas": (0.9, 0.999), "lr": 0.01}],
            "state": {"w": {"exp_avg": torch.ones(4)}}}
    got = {"param_groups": [{"betas": [0.9, 0.999], "lr": 0.01}],
           "state": {"w": {"exp_avg": torch.ones(4) * 1.01}}}
    (line,) = _norm_diffs(want, got, 0.15)
    assert "['betas']" in line and "got list" in line
    assert _norm_diffs(want, {**got, "param_groups": want["param_groups"]}, 0.15) == []


def test_p15_fails_when_a_rank_loads_silently_or_dies():
    from fsdp_conformance.properties.fault_props import p15_verdict
    from fsdp_conformance.harness.errors import RankError, RankFailure

    case = Case(api="fsdp1.full", optimizer="adam", world_size=2, fault="truncated_file")
    what = {"kind": "truncated_file", "file": "optim.pt", "names": []}
    one = RankError("x", [RankFailure(0, "exception RuntimeError", "RuntimeError: archive is corrupted")])
    v = p15_verdict(case, what, one)
    assert v.status == "fail" and "loaded silently" in v.detail and "[1]" in v.detail
    dead = RankError("x", [RankFailure(0, "exception RuntimeError", "RuntimeError: corrupt"),
                           RankFailure(1, "died", "killed by SIGSEGV")])
    assert "died" in p15_verdict(case, what, dead).detail
    both = RankError("x", [RankFailure(r, "exception RuntimeError", "RuntimeError: archive is corrupted")
                           for r in (0, 1)])
    assert p15_verdict(case, what, both).status == "pass"
