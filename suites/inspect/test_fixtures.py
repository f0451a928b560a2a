"""``inspect`` on the committed golden fixtures (fixtures/2.13.0): every save path's real
output. The summary must state what the manifest recorded when the fixture was written:
the FQNs, each state tensor's shape and dtype, the step (the case's number of steps), the
param groups (count, lr, params) and, for sharded formats, the saving world size."""
from __future__ import annotations

import ast
import json

import pytest

from fsdp_conformance.reshard import UsageError
from fsdp_conformance.inspection import SHARDED_KINDS, Summary, inspect_path
from suites.conftest import ROOT

FIXTURES = ROOT / "fixtures" / "2.13.0"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())["fixtures"]
OPTIMIZERS = {"adam": "Adam", "adamx2g": "Adam", "adamw": "AdamW", "sgd": "SGD",
              "sgd_momentum": "SGD", "adagrad": "Adagrad", "rmsprop": "RMSprop",
              "adadelta": "Adadelta", "nadam": "NAdam", "radam": "RAdam", "adamax": "Adamax",
              "asgd": "ASGD", "rprop": "Rprop", "adafactor": "Adafactor", "muon": "Muon",
              "lbfgs": "LBFGS"}
INPUT = {"full": "optim.pt", "ids": "optim.pt", "rank_files": "", "dcp": "dcp"}


def _input(fx: dict):
    d = FIXTURES / fx["name"]
    return d / INPUT[fx["format"]] if INPUT[fx["format"]] else d


def _expected_groups(fx: dict) -> list[dict]:
    return [{k: ast.literal_eval(v) for k, v in g.items() if k in ("params", "lr")}
            for g in fx["expected"]["param_groups"]]


def _check_state(s: Summary, fx: dict, by_key: dict) -> None:
    """Each param's state names, per-element shapes and dtypes, and step, as recorded."""
    steps = fx["case"]["steps"]
    for key, want in by_key.items():
        p = next(p for p in s.params if p.key == key)
        got = {st.name: st for st in p.state}
        assert set(got) == set(want), (key, set(got), set(want))
        for name, leaf in want.items():
            if "repr" in leaf:  # not a tensor (LBFGS's numbers and history lists)
                assert got[name].dtype is None and got[name].shape is None, (key, name)
                continue
            assert got[name].dtype == leaf["dtype"], (key, name)
            assert list(got[name].shape) == leaf["shape"], (key, name, got[name].shape)
        if "step" in want:
            assert p.step == steps and p.step_kind == "tensor", (key, p.step)
        else:
            assert p.step is None


@pytest.mark.parametrize("fx", MANIFEST, ids=[f["name"] for f in MANIFEST])
def test_summary_states_the_recorded_facts(fx):
    fmt, case = fx["format"], fx["case"]
    state = fx["expected"]["state"]
    s = inspect_path(_input(fx), unsafe_load=fmt == "rank_files", values=True)
    groups = _expected_groups(fx)
    assert s.optimizer == OPTIMIZERS[case["optimizer"]]
    assert len(s.groups) == len(groups) == case["groups"]
    assert [g.hyper["lr"] for g in s.groups] == [g["lr"] for g in groups]
    assert s.warnings == ()
    # tensors are checked for NaN/Inf (0 found); other values (LBFGS's numbers, lists) are not
    assert all(st.nonfinite == (0 if st.dtype else None) for p in s.params for st in p.state)
    if fmt == "ids":
        # the names are not in the file: same number of params, same shapes, int keys
        assert s.format == "file" and s.world_size is None
        shapes = sorted(tuple(st.shape) for p in s.params for st in p.state if st.per_element)
        assert shapes == sorted(tuple(v["shape"]) for st in state.values() for v in st.values()
                                if len(v["shape"]) > 0)
        if state:
            assert s.key_type == "int"
            assert [p.step for p in s.params if p.step is not None] == \
                [case["steps"]] * sum("step" in st for st in state.values())
        return
    assert [list(g.params) for g in s.groups] == [g["params"] for g in groups]
    listed = {k for g in groups for k in g["params"]}
    assert {p.key for p in s.params} == listed
    assert {p.key for p in s.params if p.state} == set(state)
    _check_state(s, fx, state)
    if fmt == "full":
        assert (s.format, s.key_type, s.world_size) == ("file", "fqn", None)
        assert any("a full dict" in line for line in s.layout)
    elif fmt == "dcp":
        assert (s.format, s.world_size, s.values_read) == ("dcp", case["world_size"], True)
        for p in s.params:
            for st in p.state:
                if st.per_element:  # the chunks tile dim 0, each written by a saving rank
                    live = [c for c in st.chunks if all(c.sizes)]
                    assert sum(c.sizes[0] for c in live) == st.shape[0]
                    assert {c.rank for c in live} <= set(range(case["world_size"]))
    else:
        # only files holding a ShardedTensor (any state) need the unsafe unpickler
        assert (s.format, s.world_size, s.unsafe_loaded) == \
            ("rank-files", case["world_size"], bool(state))
        assert len(s.files) == case["world_size"]
        for p in s.params:
            for st in p.state:
                if st.per_element:
                    assert st.kind in SHARDED_KINDS and st.world_size == case["world_size"]
                    assert sum(n for n in st.rank_numel if n) == st.numel
    if not state:  # stateless SGD: a note, not a warning
        assert [f.code for f in s.findings] == ["empty-state"]
        assert s.findings[0].level == "note"


def test_legacy_sharded_files_need_unsafe_load_and_say_so():
    fx = next(f for f in MANIFEST if f["format"] == "rank_files")
    with pytest.raises(UsageError) as e:
        inspect_path(_input(fx))
    msg = str(e.value)
    assert "optim_rank0.pt" in msg and "ShardedTensor" in msg and "--unsafe-load" in msg
    assert "weights_only" in msg


def test_one_legacy_sharded_rank_file_is_one_ranks_part():
    fx = next(f for f in MANIFEST if f["name"] == "fsdp1.legacy_sharded-adam-mlp.root-orig-ws3-fp64")
    s = inspect_path(_input(fx) / "optim_rank2.pt", unsafe_load=True)
    assert s.world_size == 3
    assert [f.code for f in s.warnings] == ["one-rank-file"]
    p = next(p for p in s.params if p.key == "block.0.weight")
    exp_avg = next(st for st in p.state if st.name == "exp_avg")
    # global shape recorded; this file holds rank 2's rows 8..10 of 11
    assert exp_avg.shape == (11, 13) and exp_avg.rank_numel == (3 * 13,)
    assert [(c.rank, c.offsets[0], c.sizes[0]) for c in exp_avg.chunks] == \
        [(0, 0, 4), (1, 4, 4), (2, 8, 3)]


def test_dcp_without_values_reads_steps_not_tensors():
    fx = next(f for f in MANIFEST if f["name"] == "fsdp2.sharded-adamw-mlp.nested-dtensor-ws3-fp64")
    s = inspect_path(_input(fx))
    assert s.values_read is False and s.location == '["optim"]'
    per_el = [st for p in s.params for st in p.state if st.per_element]
    assert per_el and all(st.nonfinite is None for st in per_el)
    assert {p.step for p in s.params} == {fx["case"]["steps"]}
    assert s.state_bytes == sum(st.numel * 8 for st in per_el) + 4 * len(s.params)
