"""Checks that check (issue 15): each property below once passed without observing anything
or with a tolerance that hid a real bug; each test plants the bug on real FSDP observations
(or on the comparison itself) and the verdict must be "fail", or "n/a" where nothing can be
observed."""
from __future__ import annotations

import dataclasses

import torch

from fsdp_conformance.cases import Case
from fsdp_conformance.properties.roundtrip import round_trip_verdicts
from fsdp_conformance.properties.run_props import _norm_diffs
from fsdp_conformance.properties.statediff import diff_state_dicts
from fsdp_conformance.run.faults import apply_fault
from fsdp_conformance import api_paths
from fsdp_conformance.sut import roundtrip


def _obs(rank_pool, case, tmp_path):
    save = rank_pool(case.world_size).run(roundtrip.save_side, case, str(tmp_path), seed=case.seed)
    load = rank_pool(case.dst_world_size).run(roundtrip.load_side, case, str(tmp_path),
                                              seed=case.seed)
    return save, load


def test_step_is_exact_in_every_dtype():
    want = {"state": {"w": {"step": torch.tensor(4.0), "exp_avg": torch.ones(3)}}}
    for got_step in (3.0, 5.0):
        got = {"state": {"w": {"step": torch.tensor(got_step), "exp_avg": torch.ones(3)}}}
        # bf16's per-tensor relative L2 check let 0.25 through
        assert any("['step']" in d for d in _norm_diffs(want, got, 0.25)), got_step
        # the elementwise tolerance of P2/P6 lets a step off by one through at rtol 0.5
        assert [d.path for d in diff_state_dicts(want, got, exact=False, rtol=0.5)] == \
            ["state['w']['step']"]
    same = {"state": {"w": {"step": torch.tensor(4.0), "exp_avg": torch.ones(3) * 1.01}}}
    assert diff_state_dicts(want, same, exact=False, rtol=0.05) == []  # values keep their rtol


def test_p6_fails_a_resume_that_records_fewer_losses(rank_pool, tmp_path):
    case = Case(api="fsdp1.full", optimizer="adam", world_size=2)
    save, load = _obs(rank_pool, case, tmp_path)
    assert round_trip_verdicts(case, save, load, tmp_path)["P6"].status == "pass"
    for losses in ([], load[0].losses[:1]):
        cut = [dataclasses.replace(o, losses=losses) for o in load]
        v = round_trip_verdicts(case, save, cut, tmp_path)["P6"]
        assert v.status == "fail" and f"recorded {len(losses)} losses, expected 2" in v.detail


def test_p9_rekey_compares_the_all_ranks_dict(rank_pool, tmp_path):
    case = Case(api="fsdp1.rekey", optimizer="sgd_momentum", world_size=2)
    save, load = _obs(rank_pool, case, tmp_path)
    v = round_trip_verdicts(case, save, load, tmp_path)["P9"]
    assert v.status == "pass" and v.detail.startswith("rank0_only as documented"), v.detail
    assert "not observable on CPU" in v.detail
    bad = dataclasses.replace(save[0], saved={**save[0].saved, "param_groups": []})
    v = round_trip_verdicts(case, [bad, *save[1:]], load, tmp_path)["P9"]
    assert v.status == "fail" and "rank0_only=True differs from rank0_only=False" in v.detail


def test_p9_sharded_compares_offloaded_and_not(rank_pool, tmp_path):
    case = Case(api="fsdp1.sharded", optimizer="adam", world_size=2)
    save, load = _obs(rank_pool, case, tmp_path)
    v = round_trip_verdicts(case, save, load, tmp_path)["P9"]
    assert v.status == "pass" and "offload_to_cpu changes nothing but devices" in v.detail
    assert {o.flip for o in save} == {"unoffloaded"}  # the path's declared flip (Flip)
    nudged = {**save[1].flipped, "param_groups": [{"lr": 123.0}]}
    save2 = [save[0], dataclasses.replace(save[1], flipped=nudged)]
    v = round_trip_verdicts(case, save2, load, tmp_path)["P9"]
    assert v.status == "fail" and ("rank 1: offload_to_cpu=False gives another sharded dict "
                                   "than True") in v.detail  # the flipped save differs
    # nothing observable at all on CPU: n/a with the reason
    none = [dataclasses.replace(o, flip="", flipped=None) for o in save]
    v = round_trip_verdicts(case, none, load, tmp_path)["P9"]
    assert v.status == "n/a" and "not observable on CPU" in v.detail


def test_p8_legacy_sharded_compares_each_rank_file(rank_pool, tmp_path):
    """The files hold ShardedTensors, which torch.load(weights_only=True) refuses in 2.13 (a
    known limitation); the content read back without it is still compared, and a changed
    file fails P8 beside the refusal."""
    case = Case(api="fsdp1.legacy_sharded", optimizer="adam", world_size=2)
    save, load = _obs(rank_pool, case, tmp_path)
    v = round_trip_verdicts(case, save, load, tmp_path)["P8"]
    refused = bool(load[0].weights_only_refused)
    if refused:
        assert v.status == "fail" and v.detail.startswith("torch.load(weights_only=True) refused")
        assert "changed its file's dict" not in v.detail
    accepted = [dataclasses.replace(o, weights_only_refused="") for o in load]
    v = round_trip_verdicts(case, save, accepted, tmp_path)["P8"]
    assert v.status == "pass" and "2 per-rank files" in v.detail
    reread = {**load[1].reread, "param_groups": [{"lr": 123.0}]}
    load2 = [load[0], dataclasses.replace(load[1], reread=reread)]
    v = round_trip_verdicts(case, save, load2, tmp_path)["P8"]
    assert v.status == "fail" and "rank 1: torch.save -> torch.load" in v.detail


def test_wrong_model_fault_names_only_the_other_models_params(tmp_path):
    """The conv net and the MLP both have head.weight: an error naming it does not say the
    checkpoint is another model's, so P15 must see a name only the conv net has."""
    from fsdp_conformance.zoo import build_model

    case = Case(api="fsdp1.full", optimizer="adam", fault="wrong_model")
    torch.save({"state": {"inp.weight": {"exp_avg": torch.ones(2, 2)}},
                "param_groups": [{"lr": 0.1, "params": ["inp.weight"]}]}, tmp_path / api_paths.FULL_FILE)
    what = apply_fault(case, tmp_path)
    mine = {n for n, _ in build_model("mlp", 0, torch.float64).named_parameters()}
    assert what["names"] and not set(what["names"]) & mine, what["names"]


# -- bfloat16: each tensor by its own scale; P6 on the resumed update ----------------------

BF16 = Case(api="fsdp1.full", optimizer="adam", dtype="bf16", world_size=2, load_world_size=3)


def _bf16_obs(rank_pool, tmp_path, lr_factor: float = 1.0):
    save = rank_pool(BF16.world_size).run(roundtrip.save_side, BF16, str(tmp_path), seed=BF16.seed)
    if lr_factor != 1.0:  # the checkpoint's lr off by lr_factor: the resume trains with it
        sd = torch.load(tmp_path / api_paths.FULL_FILE, weights_only=True)
        for g in sd["param_groups"]:
            g["lr"] *= lr_factor
        torch.save(sd, tmp_path / api_paths.FULL_FILE)
    load = rank_pool(BF16.dst_world_size).run(roundtrip.load_side, BF16, str(tmp_path),
                                              seed=BF16.seed)
    return save, load


def test_bf16_p2_judges_each_state_tensor_by_its_own_scale(rank_pool, tmp_path):
    """Adam's exp_avg_sq is ~1e-4: the old elementwise atol of 1e-2 let it be zeroed."""
    save, load = _bf16_obs(rank_pool, tmp_path)
    assert round_trip_verdicts(BF16, save, load, tmp_path)["P2"].status == "pass"
    for damage in (torch.zeros_like, lambda t: t * 1.5):
        saved = {**save[0].saved, "state": {
            k: {**st, "exp_avg_sq": damage(st["exp_avg_sq"])} if k == "block.0.weight" else st
            for k, st in save[0].saved["state"].items()}}
        v = round_trip_verdicts(BF16, [dataclasses.replace(save[0], saved=saved), *save[1:]],
                                load, tmp_path)["P2"]
        assert v.status == "fail" and "['block.0.weight']['exp_avg_sq']" in v.detail, v.detail


def test_bf16_p6_fails_a_one_percent_lr_error(rank_pool, tmp_path):
    save, load = _bf16_obs(rank_pool, tmp_path / "clean")
    v = round_trip_verdicts(BF16, save, load, tmp_path / "clean")["P6"]
    assert v.status == "pass", v.detail
    save, load = _bf16_obs(rank_pool, tmp_path / "lr", lr_factor=1.01)
    v = round_trip_verdicts(BF16, save, load, tmp_path / "lr")["P6"]
    assert v.status == "fail" and "the resumed update is 1.0" in v.detail, v.detail


def test_bf16_p6_fails_a_skipped_step_and_a_resume_that_never_updates(rank_pool, tmp_path):
    from fsdp_conformance.properties import run_props as rp
    from fsdp_conformance.properties.baseline import continue_from
    from fsdp_conformance.properties.layouts import reference_layout

    save, load = _bf16_obs(rank_pool, tmp_path)
    start = rp.save_point(reference_layout(BF16), save)
    one_step = continue_from(dataclasses.replace(BF16, resume_steps=1), *start).params_at_end
    for params, why in ((one_step, "a skipped step"), (start[0], "no update")):
        bad = [dataclasses.replace(load[0], final_params=params), *load[1:]]
        v = round_trip_verdicts(BF16, save, bad, tmp_path)["P6"]
        assert v.status == "fail" and "the resumed update is" in v.detail, (why, v.detail)
