"""Hypothesis strategies: drawn configurations are valid, drawn in the controller and run on
the ranks; a failure shrinks and prints the case id and a standalone reproducer."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import Phase, given, settings

from fsdp_conformance.run import matrix
from fsdp_conformance.cases import Case
from fsdp_conformance.properties.layouts import reference_layout
from fsdp_conformance.api_paths import resizable
from fsdp_conformance.user import CustomPath, RoundtripFailure, run_checked
from fsdp_conformance.user import strategies as fst
from fsdp_conformance.zoo import FUSED


@given(fst.cases(impls=("default", "fused", "foreach"),
                 strategies=("FULL_SHARD", "HYBRID_SHARD", "NO_SHARD")))
@settings(max_examples=150, deadline=None, database=None)
def test_drawn_cases_are_valid(case):
    assert isinstance(case, Case) and case.id
    assert matrix.groups_fit_units(case)
    if not resizable(case.api):
        assert case.dst_world_size == case.world_size and case.dst_plan == case.plan
    assert case.impl != "fused" or case.optimizer in FUSED
    assert case.strategy != "HYBRID_SHARD" or case.world_size == case.dst_world_size in (2, 4)
    assert case.plan not in ("split", "split_out")
    reference_layout(case), reference_layout(case, load_side=True)  # FSDP1 accepts the plan


@given(fst.user_roundtrips())
@settings(max_examples=60, deadline=None, database=None)
def test_generated_module_trees_are_valid(uc):
    user, case = uc
    assert case.model == user.name and case.plan == user.plan_name
    for side in (False, True):  # flat units never mix frozen and trainable params
        reference_layout(case, load_side=side)


def test_ci_profile_is_deterministic_and_deadline_free():
    s = fst.fsdp_settings()
    assert fst.profile_name() == fst.CI  # this session runs --fsdp-tier quick
    assert s.deadline is None and s.derandomize and s.max_examples == 5
    assert settings.get_profile(fst.NIGHTLY).max_examples > s.max_examples


@given(case=fst.cases(paths=("fsdp1.full", "fsdp1.sharded"), models=("mlp", "conv"),
                      world_sizes=(1, 2), optimizers=("adam", "sgd_momentum", "adagrad"),
                      use_orig_params=(False,)))
@fst.fsdp_settings(max_examples=4)
def test_drawn_zoo_cases_conform(fsdp_roundtrip, case):
    r = fsdp_roundtrip.check(case)
    assert r.properties["P3"].status in ("pass", "known")


@given(uc=fst.user_roundtrips(world_sizes=(1, 2), paths=("fsdp1.full", "fsdp1.sharded")))
@fst.fsdp_settings(max_examples=4)
def test_drawn_module_trees_conform(fsdp_roundtrip, uc):
    user, case = uc
    r = fsdp_roundtrip.check(case, user)
    assert r.properties["P6"].status in ("pass", "known", "n/a")


BUGGY = CustomPath.of("suites.plugin.userfns:save_dropping_lr", "suites.plugin.userfns:load",
                      family="fsdp1")


def test_failure_shrinks_and_prints_case_id_and_reproducer():
    """A planted bug in a user's save function, found by hypothesis on 2 param groups."""
    seen = []

    @given(fst.cases(paths=("fsdp1.full",), models=("mlp",), optimizers=("adam",), groups=(2,),
                     world_sizes=(1, 2), use_orig_params=(False,), dtypes=("fp64",), steps=(2,)))
    @settings(fst.fsdp_settings(), max_examples=3, phases=(Phase.generate, Phase.shrink),
              print_blob=False)
    def find(case):
        case = dataclasses.replace(case, api=BUGGY.api)
        seen.append(case.id)
        run_checked([case], custom=BUGGY)

    with pytest.raises(RoundtripFailure) as info:
        find()
    msg = str(info.value)
    shrunk = seen[-1]  # hypothesis replays the minimal example last
    assert len(set(seen)) > 1, seen  # it searched, then shrank
    assert shrunk.endswith("/flat/ws1/fp64") and shrunk.startswith("custom:save_dropping_lr+load/adam")
    assert f"case {shrunk}" in msg
    assert "P11 (param groups) FAIL" in msg and "['lr']: missing" in msg
    assert "reproduce(Case(model='mlp', plan=" in msg
    assert "custom=CustomPath(save=Ref(target='suites.plugin.userfns:save_dropping_lr'" in msg
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "find(" in notes and "case=Case(model='mlp'" in notes  # hypothesis's own report
