"""The ``fsdp_roundtrip`` fixture on a user model that is not in the zoo: it passes on correct
code, and planted bugs in the user's own save function fail with a message that names the
property, the key, the rank, expected vs got, and how to rerun the case."""
from __future__ import annotations

import re
import runpy

import pytest
import torch
from torch import nn

from examples.my_model import GatedBlock, GatedNet, batch, loss, make_optimizer
from fsdp_conformance.user import (Limitation, RoundtripFailure, check, failing, user_cases,
                                   user_model)
from suites.plugin import userfns

USER = dict(plan=["body", "head"], optimizer=make_optimizer, loss=loss, fsdp_version=1)
FNS = "suites.plugin.userfns:"
JUDGED = ("P0", "P2", "P3", "P6", "P7", "P11")  # what a custom save/load is judged by


def _statuses(results):
    return [{p: v.status for p, v in r.properties.items()} for r in results]


@pytest.mark.fsdp(world_sizes=["2->1"])
def test_builtin_paths_pass_with_every_property(fsdp_roundtrip):
    results = fsdp_roundtrip(GatedNet, batch, **USER)
    assert [r.case.api for r in results] == ["fsdp1.full", "fsdp1.sharded"]
    assert all(r.case.world_size == 2 and r.case.dst_world_size == 1 for r in results)
    # the factory's name, made unique per process (another test's make_optimizer may have
    # taken it first: then make_optimizer~2, ...)
    assert re.fullmatch(r"fsdp1\.full/make_optimizer(~\d+)?x2g/GatedNet\.body\+head/flat/"
                        r"ws2->1/fp64/links2", results[0].case.id), results[0].case.id
    for st in _statuses(results):
        assert all(st[p] == "pass" for p in ("P0", "P1", "P2", "P3", "P6", "P7", "P8", "P11")), st


def test_custom_save_load_passes(fsdp_roundtrip):
    [r] = fsdp_roundtrip(GatedNet, batch, **USER, world_sizes=["2->1"],
                         save_fn=FNS + "save", load_fn=FNS + "load")
    assert r.case.api == "custom:save"
    st = _statuses([r])[0]
    assert all(st[p] == "pass" for p in JUDGED), st
    assert all(st[p] == "n/a" for p in ("P1", "P4", "P5", "P8", "P9")), st


def _failure(fsdp_roundtrip, save: str, **kw) -> str:
    with pytest.raises(pytest.fail.Exception) as info:
        fsdp_roundtrip(GatedNet, batch, **USER, world_sizes=["2->1"], save_fn=FNS + save,
                       load_fn=FNS + "load", **kw)
    return str(info.value)


def test_planted_bug_dropped_group_lr_is_named(fsdp_roundtrip, request):
    msg = _failure(fsdp_roundtrip, "save_dropping_lr")
    opt = user_model(GatedNet, batch, plan=USER["plan"], optimizer=make_optimizer,
                     loss=loss).optimizer_name  # make_optimizer, or ~N if another took it
    case = f"custom:save_dropping_lr+load/{opt}x2g/GatedNet.body+head/flat/ws2->1/fp64/links2"
    assert f"case {case}" in msg
    # which property, which key, which rank, expected vs got
    assert "P11 (param groups) FAIL: rank 0: param_groups after loading differ" in msg
    assert "[1]['lr']: missing; expected 0.001, got <absent>" in msg
    assert "P3 (load) FAIL" in msg and "P6 (resume) FAIL" in msg and "KeyError: 'lr'" in msg
    # how to rerun just that case
    assert f"rerun just this case: pytest '{request.node.nodeid}' --fsdp-case '{case}'" in msg
    # the reproducer script only on request: the failure stays one block
    assert "reproduce(Case(" not in msg and "rerun with --fsdp-reproducer" in msg


def test_reproducer_scripts_on_request(fsdp_roundtrip, request, monkeypatch):
    monkeypatch.setattr(request.config.option, "fsdp_reproducer", True)
    msg = _failure(fsdp_roundtrip, "save_dropping_lr")
    assert "reproduce(Case(model='GatedNet'" in msg and "--fsdp-reproducer" not in msg


def test_planted_bug_extra_step_on_save_is_named(fsdp_roundtrip):
    msg = _failure(fsdp_roundtrip, "save_with_extra_step")
    assert "P3 (load) FAIL: rank 0 after loading differs from reference.shard_full" in msg
    assert ("state['head._flat_param']['step']: value at elements 0..0 (1 differ, max abs diff 1); "
            "expected tensor(2.0, dtype=torch.float32), got tensor(3.0, dtype=torch.float32)") in msg
    assert "P7 (idempotent) FAIL: rank 0: the save function changed the optimizer state" in msg
    assert "P6 (resume) FAIL" in msg


def test_reproducer_from_the_message_reruns_the_case(tmp_path, capsys):
    with pytest.raises(RoundtripFailure) as info:
        check(GatedNet, batch, **USER, world_sizes=["2->1"],
              save_fn=FNS + "save_dropping_lr", load_fn=FNS + "load")
    code = str(info.value).split("run from your project root):\n", 1)[1]
    script = tmp_path / "repro.py"
    script.write_text("\n".join(ln[4:] for ln in code.splitlines()) + "\n")
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(script), run_name="__main__")
    assert done.value.code == 1
    out = capsys.readouterr().out
    assert " P11 fail" in out and "[1]['lr']: missing" in out


@pytest.mark.fsdp_known("P3,P6,P7,P11", reason="our trainer drops the head's lr (fix pending)",
                        symptom="lr")
def test_declared_limitation_turns_matching_failures_known(fsdp_roundtrip):
    [r] = fsdp_roundtrip(GatedNet, batch, **USER, world_sizes=["2->1"],
                         save_fn=FNS + "save_dropping_lr", load_fn=FNS + "load")
    assert {p: r.properties[p].status for p in ("P3", "P6", "P11")} == dict.fromkeys(
        ("P3", "P6", "P11"), "known")
    assert "our trainer drops the head's lr" in r.properties["P11"].detail


def test_strict_declared_limitation_that_does_not_reproduce_fails():
    with pytest.raises(RoundtripFailure, match="did not reproduce in any case: 'P11'"):
        check(GatedNet, batch, **USER, world_sizes=[1], paths=["fsdp1.full"],
              known=[Limitation.of("P11", reason="lr dropped")])


def test_known_torch_limitation_applies_to_a_user_optimizer_of_the_same_class():
    # AdamW + use_orig_params on CPU: FSDP1's full dict aliases exp_avg (known/entries.py); the
    # user's optimizer factory is matched to the zoo's "adamw" for known.py.
    [r] = check(GatedNet, batch, **USER, use_orig_params=True, world_sizes=[2],
                paths=["fsdp1.full"])
    assert r.properties["P1"].status == "known"
    assert r.properties["P1"].known == "orig-params-full-osd-aliasing"
    assert "exp_avg" in r.properties["P1"].detail
    assert not failing(r)


def test_a_save_side_torch_bug_is_recognised_in_user_code():
    """The user's own full-dict save (FSDP.optim_state_dict, use_orig_params=True on CPU)
    writes exp_avg holding exp_avg_sq: the suite never sees the user's file, so it predicts
    what the entry's save would have written from the state at the save, and the load
    (P3) and the resumed run (P6) are exactly that: known, naming the entry and the path."""
    [r] = check(GatedNet, batch, **USER, use_orig_params=True, world_sizes=["2"],
                save_fn=FNS + "save", load_fn=FNS + "load")
    p = r.properties
    assert {k: (p[k].status, p[k].known) for k in ("P3", "P6")} == dict.fromkeys(
        ("P3", "P6"), ("known", "orig-params-full-osd-aliasing")), p
    assert "as through the built-in path fsdp1.full" in p["P3"].detail
    assert p["P2"].status == "pass" and not failing(r)  # the state in memory is right


def test_a_second_bug_behind_a_save_side_torch_bug_fails():
    """The same save with one element of exp_avg_sq nudged in the file: the entry no longer
    explains the load, so nothing is known and P3 names the param and the key."""
    with pytest.raises(RoundtripFailure) as info:
        check(GatedNet, batch, **USER, use_orig_params=True, world_sizes=["2"],
              save_fn=FNS + "save_nudging_exp_avg_sq", load_fn=FNS + "load")
    [r] = info.value.results
    p3 = r.properties["P3"]
    assert (p3.status, p3.known) == ("fail", ""), p3
    assert "['exp_avg_sq']: value at elements 0..0 (1 differ" in p3.detail, p3.detail


def _local_factory():
    return nn.Linear(2, 2)


def test_unimportable_callables_are_refused_with_the_reason():
    with pytest.raises(TypeError, match="lambdas and nested functions"):
        user_model(lambda: nn.Linear(2, 2), batch)

    def nested():
        return nn.Linear(2, 2)

    with pytest.raises(TypeError, match="cannot be sent to the ranks"):
        user_model(nested, batch)
    with pytest.raises(ModuleNotFoundError):
        user_model("no_such_pkg.mod:Net", batch)
    assert user_model(_local_factory, batch).factory.target == \
        "suites.plugin.test_fixture:_local_factory"


def test_plan_as_policy_or_classes_and_group_unit_check():
    by_class = user_model(GatedNet, batch, plan={GatedBlock}, optimizer=make_optimizer)
    by_policy = user_model(GatedNet, batch, plan=lambda m: isinstance(m, GatedBlock))
    assert by_class.plan == by_policy.plan == ("body.0", "body.1")
    with pytest.raises(ValueError, match="not submodules of GatedNet"):
        user_model(GatedNet, batch, plan=["body.9"])
    # the root unit would hold the head (group 1) with everything else (group 0)
    with pytest.raises(ValueError, match=r"unit '<root>' .* holds params of param groups \[0, 1\]"):
        user_cases(user_model(GatedNet, batch, plan=["body"], optimizer=make_optimizer),
                   world_sizes=[2], fsdp_version=1)
    cases = user_cases(by_class, world_sizes=[2], use_orig_params=True, fsdp_version=1)
    assert [c.groups for c in cases] == [2, 2]


def test_batch_and_loss_of_a_user_model_reach_the_zoo():
    from fsdp_conformance.zoo import build_model, loss_of, make_batch

    u = user_model(GatedNet, batch, loss=loss)
    u.register()
    x = make_batch(u.name, 0, 3, 4, torch.float64)
    assert x.shape == (4, 5) and x.dtype == torch.float64
    assert torch.equal(x, make_batch(u.name, 0, 3, 4, torch.float64))
    model = build_model(u.name, 0)
    assert torch.equal(loss_of(model, x), loss(model, x))


def test_paths_beside_save_fn_is_an_error_not_ignored():
    with pytest.raises(ValueError, match=r"paths=\['fsdp1.sharded'\] and save_fn/load_fn"):
        check(GatedNet, batch, plan=["body", "head"], paths=["fsdp1.sharded"], fsdp_version=1,
              save_fn=FNS + "save_dropping_lr", load_fn=FNS + "load")


def adam(named_params):
    """A user's optimizer factory that happens to share a zoo optimizer's name."""
    import torch

    return torch.optim.Adam([p for _, p in named_params], lr=0.003)


def test_a_user_factory_named_like_a_zoo_optimizer_is_the_users():
    from fsdp_conformance.user.model import user_model

    u = user_model(GatedNet, batch, plan=["body", "head"], optimizer=adam)
    assert u.optimizer_name != "adam" and u.optimizer_name.startswith("adam~")
    u.register()
    from fsdp_conformance.zoo import build_optimizer

    opt = build_optimizer(u.optimizer_name, list(GatedNet().named_parameters()))
    assert opt.param_groups[0]["lr"] == 0.003  # the user's factory, not the zoo's Adam


def test_a_raising_save_is_reported_once_with_the_users_frames():
    with pytest.raises(RoundtripFailure) as exc:
        check(GatedNet, batch, **USER, world_sizes=[2],
              save_fn=FNS + "save_into_missing_dir", load_fn=FNS + "load")
    msg = str(exc.value)
    assert msg.count("the save function raised") == 1, msg
    assert "P3 (" in msg and "P11 (" in msg  # every property it stopped, on one line
    assert "your code:" in msg and "userfns.py" in msg and "save_into_missing_dir" in msg
    assert "where it raised:" in msg and "no-such-dir" in msg


def test_custom_case_ids_tell_loads_and_partials_apart():
    """Two loads of one save, or two partials of one function, never share a case id; a
    save and its own counterpart load show the save's name alone."""
    from functools import partial

    from examples import accelerate_trainer as acc
    from fsdp_conformance.user.model import CustomPath

    def name(save, load):
        return CustomPath.of(save, load).name

    assert name(FNS + "save", FNS + "load") == "save"
    assert name(FNS + "save_dropping_lr", FNS + "load") == "save_dropping_lr+load"
    assert name(FNS + "save", FNS + "save_dropping_lr") == "save+save_dropping_lr"
    full = name(partial(acc.save_optimizer_v1, "FULL_STATE_DICT"),
                partial(acc.load_optimizer_v1, "FULL_STATE_DICT"))
    primed = name(partial(acc.save_optimizer_v1, "SHARDED_STATE_DICT"),
                  partial(acc.load_optimizer_v1_primed, "SHARDED_STATE_DICT"))
    assert full == "save_optimizer_v1[FULL_STATE_DICT]"
    assert primed == ("save_optimizer_v1[SHARDED_STATE_DICT]"
                      "+load_optimizer_v1_primed[SHARDED_STATE_DICT]")
    # an enum member by its name; any other object by type and a hash of its repr
    from torch.distributed.fsdp import StateDictType

    from fsdp_conformance.user.refs import Ref

    full, sharded = (Ref.of(partial(userfns.save, t)).label
                     for t in (StateDictType.FULL_STATE_DICT, StateDictType.SHARDED_STATE_DICT))
    assert (full, sharded) == ("save[FULL_STATE_DICT]", "save[SHARDED_STATE_DICT]")
    a, b = (Ref.of(partial(userfns.save, x=d)).label for d in ({"k": 1}, {"k": 2}))
    assert a != b and a.startswith("save[x=dict:")
