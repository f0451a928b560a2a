"""``Case.id`` is derived from the axis declarations (``cases.axis(shown=...)``): every axis
that makes two cases unequal makes their ids unequal, except one declared ``Hidden`` with
its reason. Work directories are named by ``sha1(case.id)`` and ``--fsdp-case`` / ``-k``
select by id, so two unequal cases sharing one would share a directory and a selection."""
from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict

from fsdp_conformance import cases
from fsdp_conformance.cases import ID_SEGMENTS, SHARED_SEGMENTS, Case, Hidden, Part

# values to try for each field (the first that makes a valid case with the base is used)
TRY = {
    "model": ["tied", "unused"], "plan": ["root", "block"], "optimizer": ["sgd", "adamw"],
    "groups": [2], "use_orig_params": [True], "strategy": ["SHARD_GRAD_OP", "NO_SHARD"],
    "world_size": [1, 4], "load_world_size": [3], "load_plan": ["root"],
    "api": ["fsdp1.sharded", "fsdp2.sharded"], "steps": [3], "batch": [8], "seed": [1],
    "dtype": ["fp32"], "resume_steps": [3], "scheduler": ["exp", "onecycle"],
    "impl": ["foreach"], "compiled": ["save"], "reshard_after_forward": [2],
    "flatten_optimizer_state_dict": [True], "cpu_offload": ["unpinned"],
    "scheduler_after_load": [True], "mixed_precision": ["bf16"], "async_save": [True],
    "app_state": [True], "nonstrict": [True], "no_broadcast": [True],
    "ignore_frozen_params": [True], "tensor_parallel": [2], "load_tensor_parallel": [2],
    "links": [2],
    "fault": ["shape"], "golden": ["2.13.0/some-fixture"], "crash": ["commit.rank0.over"],
    "bounds": [True], "inject": ["slow"],
}
BASES = [Case(api="fsdp1.full", world_size=2),
         Case(api="fsdp2.full", world_size=4, scheduler="exp"),
         Case(api="fsdp2.sharded", world_size=4, dtype="fp32"),
         Case(api="fsdp2.sharded", world_size=4, bounds=True),
         Case(api="fsdp2.sharded", world_size=4, golden="2.13.0/x")]


def _shown(f):
    return f.metadata["shown"]


def test_every_field_says_how_it_shows_in_the_id():
    own = []
    for f in dataclasses.fields(Case):
        shown = _shown(f)
        assert isinstance(shown, (str, Part, Hidden)), f.name
        if isinstance(shown, Part):
            assert shown.segment in SHARED_SEGMENTS, (f.name, shown)
        elif isinstance(shown, str):
            assert shown.startswith("/"), (f.name, shown)
            own.append(f.name)
        else:
            assert shown.why, f.name
    assert sorted(ID_SEGMENTS) == sorted([*SHARED_SEGMENTS, *own]), \
        "ID_SEGMENTS must name each shared segment and each axis with a segment of its own once"
    assert len(set(ID_SEGMENTS)) == len(ID_SEGMENTS)
    used = {_shown(f).segment for f in dataclasses.fields(Case) if isinstance(_shown(f), Part)}
    assert used == set(SHARED_SEGMENTS), "a shared segment no axis names"


def test_changing_any_shown_axis_changes_the_id():
    """For every axis not declared Hidden: some valid case with it changed from a base case
    has another id (``batch`` and the rest: ``Case(api="fsdp1.full", batch=8)`` no longer
    shares ``Case(api="fsdp1.full")``'s id)."""
    missing = []
    for f in dataclasses.fields(Case):
        if isinstance(_shown(f), Hidden):
            continue
        changed = False
        for base, value in itertools.product(BASES, TRY[f.name]):
            try:
                other = dataclasses.replace(base, **{f.name: value})
            except ValueError:
                continue
            if other == base:
                continue
            assert other.id != base.id, (f.name, value, base.id)
            changed = True
        if not changed:
            missing.append(f.name)
    assert not missing, f"no valid variation tried for {missing}: extend TRY / BASES"
    assert Case(api="fsdp1.full", batch=8).id == "fsdp1.full/adam/mlp.nested/flat/ws2/fp64/batch8"


def test_the_hidden_axes_say_why():
    hidden = {f.name: _shown(f).why for f in dataclasses.fields(Case)
              if isinstance(_shown(f), Hidden)}
    assert set(hidden) == {"fixtures"} and "one root per run" in hidden["fixtures"]
    assert cases.FIXTURES_HIDDEN == hidden["fixtures"]


def _no_shared_ids(all_cases):
    by_id = defaultdict(set)
    for c in all_cases:
        by_id[c.id].add(c)
    shared = {i: cs for i, cs in by_id.items() if len(cs) > 1}
    assert not shared, f"unequal cases share an id: {list(shared.items())[:3]}"


def test_no_two_unequal_cases_of_the_matrices_share_an_id():
    """Over both tiers' matrices (one fixtures root each, as a run has) and the plugin's
    cases of every zoo model on every path and size pair it offers."""
    from fsdp_conformance.run import matrix

    paths = matrix.default_paths()
    quick, full = matrix.quick(paths), matrix.full(paths)
    assert len(quick) > 500 and len(full) > len(quick)
    _no_shared_ids([*quick, *full])


def test_no_two_unequal_plugin_cases_share_an_id():
    from examples.my_model import GatedBlock, GatedNet, batch, make_optimizer
    from fsdp_conformance.user import user_cases, user_model
    from fsdp_conformance.user.spec import DEFAULT_PAIRS

    # a name of its own: the plugin's tests register GatedNet under its own name with other
    # options, and a second registration of one name in a process is renamed "~2"
    user = user_model(GatedNet, batch, plan={GatedBlock}, optimizer=make_optimizer,
                      name="GatedNetIds")
    got = []
    for version, tier in itertools.product((1, 2), ("quick", "full")):
        for size, steps in ((12, 2), (8, 2), (12, 3)):
            got += user_cases(user, world_sizes=DEFAULT_PAIRS[tier], tier=tier,
                              fsdp_version=version, batch=size, steps=steps,
                              use_orig_params=version == 1)
    assert len(got) > 20
    _no_shared_ids(got)
