"""``fsdp-conformance inspect``: the human view, ``--json`` (a round trip through
``Summary.from_json``; ``-`` for stdout), ``--all``, ``--strict`` and the exit codes
(0 read, 1 strict and a warning, 2 unreadable input naming the file), and one run of the
installed command in a subprocess."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fsdp_conformance import cli
from fsdp_conformance.inspection import SCHEMA, Summary, inspect_path
from fsdp_conformance.inspection import DEFAULT_LIMIT, render_text
from suites.conftest import ROOT, env_for_subprocess
from suites.inspect.made import fqn_osd, named, save, trained
from suites.inspect.test_fixtures import FIXTURES

MULTI_GROUP = FIXTURES / "fsdp1.full-adamx2g+sched-mlp.nested-flat-ws4-fp64" / "optim.pt"
DCP = FIXTURES / "fsdp1.sharded-adam-mlp.root-orig-ws3-fp64" / "dcp"
LEGACY_SHARDED = FIXTURES / "fsdp1.legacy_sharded-adam-mlp.root-orig-ws3-fp64"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["inspect", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def test_human_view_of_a_two_group_fixture(capsys):
    rc, out, err = _run(capsys, MULTI_GROUP)
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[1] == ("torch.save'd optimizer dict; world size not recorded; optimizer Adam; "
                        "8 of 8 params with state; 5.2 KiB of state")
    for fqn, shape, group in (("inp.weight", "[13, 7]", "0"), ("head.bias", "[2]", "1")):
        row = next(line for line in lines if f" {fqn} " in line)
        assert shape in row and "float64" in row and "2.0 (tensor)" in row
        assert row.rstrip(" │").endswith(group)
    assert "param groups (2)" in out and "initial_lr=0.005" in out
    assert "a full dict, loadable at any world size" in out
    assert "findings (0 warnings, 0 notes)" in out


def test_findings_are_listed_warnings_first(tmp_path):
    osd = fqn_osd("sgd")  # stateless: a note
    osd["param_groups"].append({**osd["param_groups"][0], "params": []})  # a warning
    path = save(osd, tmp_path / "sgd.pt")
    text = render_text(inspect_path(path))
    warning, note = text.index("warning [empty-group]"), text.index("note [empty-state]")
    assert warning < note
    assert "findings (1 warnings, 1 notes)" in text


def test_long_param_lists_are_cut_unless_all(tmp_path, capsys):
    model, optim = trained("adam", n_layers=30)  # 31 Linear layers (last: 31.bias): 62 params
    path = save(named(model, optim.state_dict()), tmp_path / "big.pt")
    rc, out, _ = _run(capsys, path)
    assert rc == 0 and f"... {62 - DEFAULT_LIMIT} more params (--all" in out
    assert " 24.weight " in out and " 31.bias " not in out
    rc, out, _ = _run(capsys, path, "--all")
    assert rc == 0 and " 31.bias " in out and "more params" not in out


def test_json_round_trip_and_stdout(tmp_path, capsys):
    out_path = tmp_path / "reports" / "dcp.json"
    rc, out, _ = _run(capsys, DCP, "--out", out_path, "--values")
    assert rc == 0 and f"wrote {out_path}" in out and "params (8, fqn keys)" in out
    doc = json.loads(out_path.read_text(), parse_constant=lambda c: pytest.fail(f"JSON has {c}"))
    assert doc["schema"] == SCHEMA and doc["counts"]["with_state"] == 8
    assert Summary.from_json(doc) == inspect_path(DCP, values=True)
    assert not list(out_path.parent.glob(".*tmp"))  # written atomically: no temp file left
    rc, out, _ = _run(capsys, DCP, "--out", "-")
    assert rc == 0 and json.loads(out)["world_size"] == 3  # stdout holds the JSON alone
    with pytest.raises(ValueError, match="schema"):
        Summary.from_json({**doc, "schema": "fsdp-conformance/run/1"})


def test_json_keeps_nan_out_of_the_file(tmp_path, capsys):
    osd = fqn_osd("adam")
    osd["state"]["0.bias"]["step"] = torch.tensor(float("nan"))
    rc, out, _ = _run(capsys, save(osd, tmp_path / "nan.pt"), "--out", "-")
    doc = json.loads(out, parse_constant=lambda c: pytest.fail(f"JSON has {c}"))
    assert rc == 0 and doc["params"][1]["step"] == "nan"
    assert Summary.from_json(doc) == inspect_path(tmp_path / "nan.pt")


def test_strict_exit_codes(tmp_path, capsys):
    assert _run(capsys, MULTI_GROUP, "--strict")[0] == 0
    stateless = FIXTURES / "fsdp1.full-sgd-mlp.nested-flat-ws4-fp64" / "optim.pt"
    rc, out, _ = _run(capsys, stateless, "--strict")  # a note only
    assert rc == 0 and "note [empty-state]" in out
    model, optim = trained("adam", freeze="0.bias")
    frozen = save(named(model, optim.state_dict()), tmp_path / "frozen.pt")
    rc, out, _ = _run(capsys, frozen)
    assert rc == 0 and "warning [no-state]" in out
    rc, _, err = _run(capsys, frozen, "--strict")
    assert rc == 1 and "--strict: 1 warning(s): no-state" in err


def test_usage_errors_exit_2_naming_the_file(tmp_path, capsys):
    good = save(fqn_osd("adam"), tmp_path / "good.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(good[:200])
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    for bad, why in ((tmp_path / "cut.pt", "truncated"), (tmp_path / "notes.txt",
                                                          "not a torch.save file")):
        rc, out, err = _run(capsys, bad)
        assert rc == 2 and out == ""
        assert err.startswith(f"fsdp-conformance inspect: error: {bad}: ") and why in err
    rc, _, err = _run(capsys, LEGACY_SHARDED)
    assert rc == 2 and "optim_rank0.pt" in err and "--unsafe-load" in err
    rc, _, err = _run(capsys, MULTI_GROUP, "--out", MULTI_GROUP)
    assert rc == 2 and "refusing to write over it" in err
    rc, _, err = _run(capsys, MULTI_GROUP, "--json", MULTI_GROUP)  # the earlier spelling
    assert rc == 2 and "refusing to write over it" in err and "earlier spelling" in err
    rc, _, err = _run(capsys, tmp_path, "--pattern", "optim.pt")
    assert rc == 2 and "must contain '{rank}'" in err


def test_pattern_and_unsafe_load_on_rank_files(tmp_path, capsys):
    for r in range(3):
        (tmp_path / f"shard-{r}.bin").write_bytes((LEGACY_SHARDED / f"optim_rank{r}.pt").read_bytes())
    rc, out, _ = _run(capsys, tmp_path, "--pattern", "shard-{rank}.bin", "--unsafe-load")
    assert rc == 0 and "3 per-rank files (shard-{rank}.bin): world size 3" in out
    assert "[11, 13] (ShardedTensor)" in out and "read with --unsafe-load" in out


def test_installed_command_in_a_subprocess():
    exe = Path(sys.executable).with_name("fsdp-conformance")
    res = subprocess.run([str(exe), "inspect", str(DCP), "--out", "-", "--strict"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=env_for_subprocess())
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert (doc["format"], doc["world_size"], doc["optimizer"]) == ("dcp", 3, "Adam")
    assert doc["findings"] == []
