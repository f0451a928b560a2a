"""``fsdp-conformance reshard`` (fsdp_conformance/reshard/): every input kind round-trips
(convert N -> M, then the reference gather of the output == the gather of the input,
bitwise), outputs never overwrite anything, bad input gives an error naming the file, the
param and the rank.

The inputs are real: one FSDP1 run per flavour on a 3-rank pool (zoo ``mlp``, plan
``nested``, 2 Adam steps) writes each rank's ``optim.state_dict()`` (int ids), torch's own
``full_optim_state_dict`` and a DCP checkpoint of the SHARDED ``optim_state_dict``."""
from __future__ import annotations

import os
import subprocess

import pytest
import torch

from fsdp_conformance import cli
from fsdp_conformance import reshard as cv
from fsdp_conformance import reference as ref
from fsdp_conformance.properties.statediff import assert_state_dicts_equal
from fsdp_conformance.harness.probes import fsdp1_checkpoint
from suites.conftest import PYTHON, ROOT, env_for_subprocess

SRC_WS = 3


def _normalised(full: dict) -> dict:
    """A full dict with each group's ``params`` sorted: their order follows the wrapping,
    which a conversion is allowed to change."""
    return {"state": full["state"],
            "param_groups": [{**g, "params": sorted(g["params"])} for g in full["param_groups"]]}


def assert_same_full(expected: dict, got: dict, msg: str = "") -> None:
    assert_state_dicts_equal(_normalised(expected), _normalised(got), msg=msg)


@pytest.fixture(scope="module", params=[False, True], ids=["flat", "orig"])
def saved(request, rank_pool, tmp_path_factory):
    """A real checkpoint in every input form, plus its source layout and reference gather."""
    uop = request.param
    root = tmp_path_factory.mktemp("flat" if not uop else "orig")
    res = rank_pool(SRC_WS).run(fsdp1_checkpoint, "mlp", "nested", uop, str(root / "dcp"),
                                timeout=120)
    src = cv.LayoutSpec("mlp", "nested", SRC_WS, use_orig_params=uop)
    layout = cv.build_layout_for(src)
    assert res[0]["keys"] == layout.optimizer_keys()
    (root / "ids").mkdir()
    (root / "names").mkdir()
    for r, out in enumerate(res):
        torch.save(out["local"], root / "ids" / f"optim_rank{r}.pt")
        torch.save(ref.to_named(out["local"], res[r]["keys"]), root / "names" / f"optim_rank{r}.pt")
    locals_ = [ref.to_named(o["local"], layout.optimizer_keys(), rank=r) for r, o in enumerate(res)]
    gathered = ref.gather_full(layout, locals_)
    if not uop:  # with use_orig_params=True torch's full dict is corrupt on CPU (known/entries.py)
        assert_state_dicts_equal(gathered, res[0]["full"], msg="reference gather vs torch")
        torch.save(res[0]["full"], root / "full.pt")
    else:
        torch.save(gathered, root / "full.pt")
    return {"root": root, "src": src, "layout": layout, "gathered": gathered, "uop": uop}


DESTINATIONS = [  # (world size, plan, use_orig_params)
    (2, "block", None),  # None: same as the source
    (4, "root", True),
    (1, "nested", False),
]


def _convert_and_gather(saved, inp, out, dst_ws, plan, uop, **kw):
    dst = cv.LayoutSpec("mlp", plan, dst_ws, use_orig_params=saved["uop"] if uop is None else uop)
    res = cv.convert(inp, out, dst, src=saved["src"], **kw)
    dst_layout = cv.build_layout_for(dst)
    outs = cv.load_rank_files(out, dst_layout)
    assert len(outs) == dst_ws
    return res, ref.gather_full(dst_layout, outs)


@pytest.mark.parametrize("dst_ws,plan,uop", DESTINATIONS)
def test_full_dict_input_round_trips(saved, tmp_path, dst_ws, plan, uop):
    res, got = _convert_and_gather(saved, saved["root"] / "full.pt", tmp_path / "out",
                                   dst_ws, plan, uop)
    assert res.input_kind == "full"
    assert_same_full(saved["gathered"], got)
    assert res.params == 8 and res.bytes_written > 0


@pytest.mark.parametrize("keys", ["ids", "names"])
@pytest.mark.parametrize("dst_ws,plan,uop", DESTINATIONS)
def test_rank_files_input_round_trips(saved, tmp_path, keys, dst_ws, plan, uop):
    res, got = _convert_and_gather(saved, saved["root"] / keys, tmp_path / "out", dst_ws, plan, uop)
    assert res.input_kind == "ranks"
    assert_same_full(saved["gathered"], got)
    first = torch.load(tmp_path / "out" / "optim_rank0.pt", weights_only=True)
    assert {type(k) for k in first["state"]} == {int if keys == "ids" else str}


@pytest.mark.parametrize("dst_ws,plan,uop", DESTINATIONS[:2])
def test_dcp_input_round_trips(saved, tmp_path, dst_ws, plan, uop):
    res, got = _convert_and_gather(saved, saved["root"] / "dcp", tmp_path / "out", dst_ws, plan, uop)
    assert res.input_kind == "dcp"
    assert_same_full(saved["gathered"], got)


def test_rank_files_to_full_dict(saved, tmp_path):
    dst = cv.LayoutSpec("mlp", "nested", 2)
    cv.convert(saved["root"] / "ids", tmp_path / "full.pt", dst, src=saved["src"], out_format="full")
    assert_same_full(saved["gathered"], torch.load(tmp_path / "full.pt", weights_only=True))


def test_loaded_output_is_what_fsdp_must_load(saved, tmp_path):
    """The per-rank output equals reference.shard_full of the input's full dict, rank by rank."""
    dst = cv.LayoutSpec("mlp", "block", 2, use_orig_params=not saved["uop"])
    cv.convert(saved["root"] / "dcp", tmp_path / "out", dst)
    layout = cv.build_layout_for(dst)
    outs = cv.load_rank_files(tmp_path / "out", layout)
    for r in range(2):
        assert_state_dicts_equal(ref.shard_full(layout, saved["gathered"], r), outs[r],
                                 msg=f"rank {r}")


# -- refusing to overwrite ----------------------------------------------------------------
def _listing(p):
    return sorted((str(q.relative_to(p)), q.stat().st_size) for q in p.rglob("*"))


@pytest.mark.parametrize("target", ["existing_dir", "existing_file", "dangling_link", "input"])
def test_refuses_to_write_over_anything(saved, tmp_path, target):
    inp = saved["root"] / "ids"
    before = _listing(inp)
    if target == "existing_dir":
        out = tmp_path / "out"
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    elif target == "existing_file":
        out = tmp_path / "out.pt"
        out.write_text("mine")
    elif target == "dangling_link":
        out = tmp_path / "link"
        out.symlink_to(tmp_path / "nowhere")
    else:
        out = inp
    dst = cv.LayoutSpec("mlp", "nested", 2, use_orig_params=saved["uop"])
    with pytest.raises(cv.UsageError, match="refusing to write over") as ei:
        cv.convert(inp, out, dst, src=saved["src"])
    assert ei.value.exit_code == 2 and str(out) in str(ei.value)
    assert _listing(inp) == before
    if target == "existing_dir":
        assert (out / "keep.txt").read_text() == "mine" and len(list(out.iterdir())) == 1
    if target == "existing_file":
        assert out.read_text() == "mine"
    assert not list(tmp_path.glob(".*tmp-*")), "a temporary was left behind"


def test_cli_refusal_exits_2(saved, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    rc = cli.main(["reshard", str(saved["root"] / "full.pt"), "--out", str(out), "--model", "mlp",
                   "--plan", "nested", "--dst-world-size", "2"]
                  + (["--use-orig-params"] if saved["uop"] else []))
    assert rc == 2
    assert "refusing to write over an existing path" in capsys.readouterr().err


# -- bad input -----------------------------------------------------------------------------
def test_wrong_model_names_the_fqn(saved, tmp_path):
    """A checkpoint of ``mlp`` read as ``conv``: the error names an mlp FQN conv lacks."""
    dst = cv.LayoutSpec("conv", "nested", 2, use_orig_params=saved["uop"])
    for inp in ("full.pt", "dcp"):
        with pytest.raises(cv.CheckpointMismatch) as ei:
            cv.convert(saved["root"] / inp, tmp_path / f"out-{inp}", dst)
        e = ei.value
        assert e.param in {"inp.weight", "inp.bias", "block.0.weight", "block.0.bias",
                           "block.2.weight", "block.2.bias"}, e
        assert repr(e.param) in str(e) and str(saved["root"] / inp) in str(e)
        assert not (tmp_path / f"out-{inp}").exists()


def test_wrong_model_for_rank_files_names_file_rank_and_key(saved, tmp_path):
    src = cv.LayoutSpec("conv", "nested", SRC_WS, use_orig_params=saved["uop"])
    dst = cv.LayoutSpec("conv", "nested", 2, use_orig_params=saved["uop"])
    for keys in ("ids", "names"):
        with pytest.raises(cv.CheckpointMismatch) as ei:
            cv.convert(saved["root"] / keys, tmp_path / keys, dst, src=src)
        e = ei.value
        assert e.rank is not None and f"optim_rank{e.rank}.pt" in str(e), e
        assert e.param is not None and repr(e.param) in str(e), e


def test_truncated_rank_file_names_file_and_rank(saved, tmp_path):
    bad = tmp_path / "in"
    bad.mkdir()
    for r in range(SRC_WS):
        data = (saved["root"] / "ids" / f"optim_rank{r}.pt").read_bytes()
        (bad / f"optim_rank{r}.pt").write_bytes(data[: len(data) // 2] if r == 1 else data)
    dst = cv.LayoutSpec("mlp", "nested", 2, use_orig_params=saved["uop"])
    with pytest.raises(cv.UsageError) as ei:
        cv.convert(bad, tmp_path / "out", dst, src=saved["src"])
    assert ei.value.rank == 1 and "optim_rank1.pt" in str(ei.value) and "rank 1" in str(ei.value)
    assert not (tmp_path / "out").exists()


def test_missing_rank_file_and_wrong_world_size(saved, tmp_path):
    dst = cv.LayoutSpec("mlp", "nested", 2, use_orig_params=saved["uop"])
    src = cv.LayoutSpec("mlp", "nested", 4, use_orig_params=saved["uop"])
    with pytest.raises(cv.UsageError, match="missing the file of rank 3"):
        cv.convert(saved["root"] / "ids", tmp_path / "a", dst, src=src)
    src = cv.LayoutSpec("mlp", "nested", 2, use_orig_params=saved["uop"])
    with pytest.raises(cv.UsageError, match="optim_rank2.pt.*wrong --src-world-size"):
        cv.convert(saved["root"] / "ids", tmp_path / "b", dst, src=src)


# -- the command line, once, in a fresh interpreter ----------------------------------------
def test_cli_subprocess(saved, tmp_path):
    out = tmp_path / "out"
    cmd = [PYTHON, "-m", "fsdp_conformance", "reshard", str(saved["root"] / "ids"),
           "--out", str(out), "--model", "mlp", "--plan", "nested", "--dst-plan", "block",
           "--dst-world-size", "2", "--dst-use-orig-params", "true"]
    if saved["uop"]:
        cmd.append("--use-orig-params")
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env_for_subprocess(),
                       timeout=120)
    assert p.returncode == 0, p.stderr
    for word in ("params 8", "elements", "bytes", "time"):
        assert word in p.stdout, p.stdout
    dst = cv.LayoutSpec("mlp", "block", 2, use_orig_params=True)
    layout = cv.build_layout_for(dst)
    got = ref.gather_full(layout, cv.load_rank_files(out, layout))
    assert_same_full(saved["gathered"], got)
    assert sorted(os.listdir(out)) == ["manifest.json", "optim_rank0.pt", "optim_rank1.pt"]


# -- a user's model factory, no pool needed -------------------------------------------------
FACTORY = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(13, 5)
        self.body = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
        self.head = nn.Linear(3, 2)


def make():
    return Net().to(torch.float32)
'''


def test_user_factory_and_fqn_plan(tmp_path, monkeypatch):
    """``--model module:callable`` with a plan given as FQNs; per-rank input with
    use_orig_params=True (fp32 alignment read from the checkpoint) to a flat destination."""
    (tmp_path / "user_models.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    src = cv.LayoutSpec("user_models:make", "body,body.2", 3, use_orig_params=True)
    layout = cv.build_layout_for(src, torch.float32)
    assert sorted(u.name for u in layout.units) == ["", "body", "body.2"]
    g = torch.Generator().manual_seed(0)
    full = {"state": {f: {"step": torch.tensor(4.0),
                          "exp_avg": torch.randn(layout.find(f)[1].shape, generator=g),
                          "exp_avg_sq": torch.rand(layout.find(f)[1].shape, generator=g)}
                      for f in layout.fqns()},
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "params": layout.fqns()}]}
    inp = tmp_path / "in"
    inp.mkdir()
    for r in range(3):
        local = ref.shard_full(layout, full, r)
        torch.save(ref.to_ids(local, layout.optimizer_keys()), inp / f"optim_rank{r}.pt")
    assert cli.main(["reshard", str(inp), "--out", str(tmp_path / "out"), "--model",
                     "user_models:make", "--plan", "body,body.2", "--use-orig-params",
                     "--dst-plan", "emb,head", "--dst-world-size", "2",
                     "--dst-use-orig-params", "false"]) == 0
    dst = cv.LayoutSpec("user_models:make", "emb,head", 2)
    dst_layout = cv.build_layout_for(dst, torch.float32)
    got = ref.gather_full(dst_layout, cv.load_rank_files(tmp_path / "out", dst_layout))
    assert_same_full(full, got)
