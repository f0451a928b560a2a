"""``inspect`` on checkpoints made here with plain ``torch.optim``: trainer dicts, int and
FQN keys, and one planted problem per test, each of which must produce its finding (code,
level, and a message naming the param); unreadable inputs must raise a UsageError that
names the file and says why."""
from __future__ import annotations

import math
import shutil
import zipfile

import pytest
import torch

from fsdp_conformance.reshard import UsageError
from fsdp_conformance.inspection import inspect_path
from suites.inspect.made import (MODEL_FQNS, MODEL_SHAPES, flip_tensor_byte, fqn_osd, named,
                                save, trained)
from suites.inspect.test_fixtures import FIXTURES


def test_trainer_dict_with_int_keyed_optimizer(tmp_path):
    model, optim = trained("adam", steps=3)
    path = save({"model": model.state_dict(), "optim": optim.state_dict(), "epoch": 7},
                tmp_path / "ckpt.pt")
    s = inspect_path(path)
    assert (s.location, s.key_type, s.optimizer) == ('["optim"]', "int", "Adam")
    assert [p.key for p in s.params] == [0, 1, 2, 3]
    assert [p.state[1].shape for p in s.params] == [MODEL_SHAPES[f] for f in MODEL_FQNS]
    assert {p.step for p in s.params} == {3.0}
    assert s.findings == () and s.counts()["with_state"] == 4
    assert s.state_bytes == sum(2 * 8 * math.prod(v) + 4 for v in MODEL_SHAPES.values())


def test_fqn_keyed_full_dict_nested_in_a_list(tmp_path):
    path = save({"optimizers": [fqn_osd("adamw")]}, tmp_path / "ckpt.pt")
    s = inspect_path(path)
    assert (s.location, s.key_type, s.optimizer) == ('["optimizers"][0]', "fqn", "AdamW")
    assert [p.key for p in s.params] == list(MODEL_FQNS)
    assert s.findings == ()


def test_several_optimizer_dicts_need_key(tmp_path):
    path = save({"gen": fqn_osd("adam"), "disc": fqn_osd("sgd_momentum")}, tmp_path / "gan.pt")
    with pytest.raises(UsageError, match=r"2 optimizer dicts.*--key") as e:
        inspect_path(path)
    assert str(path) in str(e.value)
    assert inspect_path(path, key="disc").optimizer == "SGD"
    with pytest.raises(UsageError, match="'nope' names no optimizer dict"):
        inspect_path(path, key="nope")


def test_stateless_sgd_is_a_note(tmp_path):
    s = inspect_path(save(fqn_osd("sgd"), tmp_path / "sgd.pt"))
    assert [(f.level, f.code) for f in s.findings] == [("note", "empty-state")]


def _set(osd, key, name, value):
    osd["state"][key][name] = value


def _nan(osd):
    osd["state"]["2.weight"]["exp_avg"][1, 2] = float("nan")


def _empty_group(osd):
    osd["param_groups"].append({**osd["param_groups"][0], "params": [], "lr": 0.5})


def _split_groups(osd):
    g = osd["param_groups"][0]
    osd["param_groups"] = [{**g, "params": g["params"][:2]}, {**g, "params": g["params"][1:]}]


def _orphan(osd):
    osd["param_groups"][0]["params"].remove("2.bias")


def _mixed(osd):
    osd["state"][3] = osd["state"].pop("2.bias")


def _bf16(osd):
    st = osd["state"]["0.bias"]
    st["exp_avg"], st["exp_avg_sq"] = st["exp_avg"].bfloat16(), st["exp_avg_sq"].bfloat16()


def _prefixed(osd):
    osd["state"]["_fsdp_wrapped_module.0.weight"] = osd["state"].pop("0.weight")
    osd["param_groups"][0]["params"][0] = "_fsdp_wrapped_module.0.weight"


PLANTED = {  # name: (alter the FQN-keyed Adam dict, finding code, text its message holds)
    "step differs": (lambda o: _set(o, "2.bias", "step", torch.tensor(9.0)), "step-disagree",
                     "'2.bias'"),
    "step kinds": (lambda o: _set(o, "0.bias", "step", 2), "step-kind-mixed", "'0.bias'"),
    "nan in exp_avg": (_nan, "nonfinite", "'2.weight'['exp_avg'] (1 elements)"),
    "empty group": (_empty_group, "empty-group", "param group 1 has no params"),
    "in two groups": (_split_groups, "in-two-groups", "'0.bias'"),
    "state in no group": (_orphan, "not-in-group", "'2.bias'"),
    "mixed keys": (_mixed, "mixed-keys", "int ids (3)"),
    "missing state key": (lambda o: o["state"]["2.weight"].pop("exp_avg_sq"), "state-names-differ",
                          "'2.weight'"),
    "dtype mixture": (_bf16, "dtype-mixture", "bfloat16 x2"),
    "wrapper prefix": (_prefixed, "wrapper-prefix", "'_fsdp_wrapped_module.0.weight'"),
}


@pytest.mark.parametrize("plant", PLANTED, ids=list(PLANTED))
def test_planted_problem_gives_its_warning(tmp_path, plant):
    alter, code, text = PLANTED[plant]
    clean = inspect_path(save(fqn_osd("adam"), tmp_path / "clean.pt"))
    assert clean.findings == ()
    osd = fqn_osd("adam")
    alter(osd)
    s = inspect_path(save(osd, tmp_path / "planted.pt"))
    found = [f for f in s.findings if f.code == code]
    assert len(found) == 1 and found[0].level == "warning", s.findings
    assert text in found[0].message


def test_frozen_param_has_no_state_warning(tmp_path):
    model, optim = trained("adam", freeze="2.weight")
    s = inspect_path(save(named(model, optim.state_dict()), tmp_path / "frozen.pt"))
    [f] = s.findings
    assert (f.level, f.code) == ("warning", "no-state")
    assert "1 of 4 params" in f.message and "'2.weight'" in f.message
    p = next(p for p in s.params if p.key == "2.weight")
    assert p.state == () and p.groups == (0,)
    assert s.counts()["in_groups_without_state"] == 1


def test_never_stepped_adam_is_an_empty_state_warning(tmp_path):
    model, optim = trained("adam", steps=0)
    s = inspect_path(save(optim.state_dict(), tmp_path / "fresh.pt"))
    assert [(f.level, f.code) for f in s.findings] == [("warning", "empty-state")]


def test_legacy_format_file_is_read(tmp_path):
    path = tmp_path / "old.pt"
    torch.save(fqn_osd("adam"), path, _use_new_zipfile_serialization=False)
    s = inspect_path(path)
    assert s.counts()["with_state"] == 4 and s.findings == ()


def _truncated(tmp_path):
    good = save(fqn_osd("adam"), tmp_path / "good.pt").read_bytes()
    (tmp_path / "bad.pt").write_bytes(good[: len(good) // 2])


def _zip_without_pickle(tmp_path):
    with zipfile.ZipFile(tmp_path / "bad.pt", "w") as z:
        z.writestr("notes.txt", "hello")


UNREADABLE = {  # name: (write tmp_path/bad.pt, text the error holds)
    "truncated": (_truncated, "truncated or corrupt"),
    "text": (lambda d: (d / "bad.pt").write_text("step: 3\n"), "not a torch.save file"),
    "empty": (lambda d: (d / "bad.pt").write_bytes(b""), "empty file"),
    "zip": (_zip_without_pickle, "no data.pkl"),
    "no optimizer": (lambda d: save({"model": {"w": torch.ones(2)}}, d / "bad.pt"),
                     "no optimizer state dict"),
    "empty dict": (lambda d: save({}, d / "bad.pt"), "rank0_only=True"),
    "bad groups": (lambda d: save({"state": {}, "param_groups": [[0, 1]]}, d / "bad.pt"),
                   "param_groups[0] is a list"),
}


@pytest.mark.parametrize("kind", UNREADABLE, ids=list(UNREADABLE))
def test_unreadable_file_names_file_and_why(tmp_path, kind):
    write, text = UNREADABLE[kind]
    write(tmp_path)
    with pytest.raises(UsageError) as e:
        inspect_path(tmp_path / "bad.pt")
    assert str(tmp_path / "bad.pt") in str(e.value) and text in str(e.value)
    assert e.value.exit_code == 2


def test_rank_directory_findings_and_errors(tmp_path):
    model, optim = trained("adam")
    for r in (0, 1, 3):
        save(optim.state_dict(), tmp_path / f"optim_rank{r}.pt")
    s = inspect_path(tmp_path)
    assert s.world_size == 2 and s.format == "rank-files"
    assert [f.code for f in s.warnings] == ["rank-gap"]
    assert "'optim_rank2.pt' does not" in s.warnings[0].message
    # whole multi-dim tensors on every rank: replicated, the 1-D ones of equal size too
    assert any("4 params whole on every rank" in line for line in s.layout)
    assert not any("FlatParameter" in line for line in s.layout)
    (tmp_path / "optim_rank1.pt").write_bytes(b"junk")
    with pytest.raises(UsageError) as e:
        inspect_path(tmp_path)
    assert "optim_rank1.pt" in str(e.value) and "rank 1" in str(e.value)


def test_rank_step_and_groups_disagree(tmp_path):
    a, b = fqn_osd("adam", steps=2), fqn_osd("adam", steps=3)
    b["param_groups"][0]["lr"] = 0.5
    save(a, tmp_path / "optim_rank0.pt")
    save(b, tmp_path / "optim_rank1.pt")
    s = inspect_path(tmp_path)
    assert sorted(f.code for f in s.warnings) == ["rank-groups-disagree", "rank-step-disagree"]
    step = next(f for f in s.warnings if f.code == "rank-step-disagree")
    assert "for 4 params: '0.weight' (rank 0: 2.0, rank 1: 3.0)" in step.message


def test_directory_without_rank_files_lists_what_is_there(tmp_path):
    save(fqn_osd("adam"), tmp_path / "optim.pt")
    with pytest.raises(UsageError, match=r"no per-rank file 'optim_rank0.pt'.*'optim.pt'"):
        inspect_path(tmp_path)
    with pytest.raises(UsageError, match="input does not exist"):
        inspect_path(tmp_path / "missing")


def test_dcp_with_a_missing_data_file(tmp_path):
    src = FIXTURES / "fsdp2.sharded-adam-mlp.root-dtensor-ws2-fp64" / "dcp"
    shutil.copytree(src, tmp_path / "dcp")
    (tmp_path / "dcp" / "__1_0.distcp").unlink()
    with pytest.raises(UsageError, match=r"missing: '__1_0.distcp'") as e:
        inspect_path(tmp_path / "dcp")
    assert str(tmp_path / "dcp") in str(e.value)
    with pytest.raises(UsageError, match="--key 'model' selects 0"):
        inspect_path(src, key="model")


def test_sharded_tensor_world_size_against_file_count(tmp_path):
    src = FIXTURES / "fsdp1.legacy_sharded-adam-mlp.root-orig-ws3-fp64"
    for r in range(2):  # rank 2's file left behind
        shutil.copy(src / f"optim_rank{r}.pt", tmp_path / f"optim_rank{r}.pt")
    s = inspect_path(tmp_path, unsafe_load=True)
    [f] = s.warnings
    assert f.code == "world-size-mismatch"
    assert "saved at world size 3 but there are 2 rank files" in f.message


def test_byte_changed_after_saving_is_a_crc_warning(tmp_path):
    path = save(fqn_osd("adam"), tmp_path / "flipped.pt")
    flip_tensor_byte(path)
    s = inspect_path(path)  # torch.load itself reads it without complaint
    # storage 0 is the first param's step: its value changed too
    assert [f.code for f in s.warnings] == ["crc-mismatch", "step-disagree"]
    assert str(path) in s.warnings[0].message and "/data/0'" in s.warnings[0].message
