"""``bounds calibrate``: on real ranks, a bounds case whose path raises is listed, with
torch's error, under ``unmeasured``, and every other case is still calibrated; ``--add`` adds
a selection's fits to a file of this machine, keeps the rest and refuses another machine's."""
from __future__ import annotations

import argparse
import json
import re
from importlib import resources

import pytest

from fsdp_conformance.run import bounds_cli as cli
from fsdp_conformance.run import matrix


def test_calibrate_lists_a_case_whose_path_raises_and_fits_the_others(tmp_path, monkeypatch):
    # torch 2.13's dcp-zero-local-shard-falls-back-to-old-keys: the bounds model's 3-row last
    # layer leaves rank 3 of 4 without a shard, and fsdp1.dsd_sharded's load raises there
    cases = [c for c in matrix.quick(matrix.default_paths())
             if c.bounds and c.api == "fsdp1.dsd_sharded" and c.world_size in (1, 4)]
    assert [c.world_size for c in cases] == [1, 4]
    monkeypatch.setattr(cli, "_cases", lambda args: cases)
    out = tmp_path / "cal.json"
    args = argparse.Namespace(runs=1, out=str(out), refit=False, backend=None, timeout=120.0,
                              tier="quick", world_sizes=None, keyword=None, add=False)
    assert cli.calibrate(args) == 0
    data = json.loads(out.read_text())
    [(case_id, error)] = data["unmeasured"].items()
    assert case_id == cases[1].id
    assert re.fullmatch(r"rank \d: RuntimeError: Missing key in checkpoint state_dict: "
                        r"optim\.param_groups\.", error), error
    assert set(data["work"]) == {"fsdp1.dsd_sharded/save/ws1/scaled500000",
                                 "fsdp1.dsd_sharded/load/ws1/scaled500000"}


def _packaged() -> dict:
    return json.loads(resources.files("fsdp_conformance").joinpath("data/bounds.json")
                      .read_text(encoding="utf-8"))


def test_add_replaces_the_selected_keys_and_keeps_every_other_entry():
    base = _packaged()
    key = next(iter(base["work"]))
    new = {"rules": base["rules"], "command": "fsdp-conformance bounds calibrate -k x --add",
           "created": "2026-11-27T00:00:00Z", "runs": 2, "cases": ["new/case"],
           "time": {"new.path/save/ws1/m": {"a": 1.0}}, "work": {key: {"a": 9.0}},
           "memory": {}, "scaling": {}, "unmeasured": {"new/case2": "rank 0: E: x"}}
    out = cli.add_to(base, new)
    assert out["work"][key] == {"a": 9.0}
    assert out["time"]["new.path/save/ws1/m"] == {"a": 1.0}
    assert {k: v for k, v in out["time"].items() if k != "new.path/save/ws1/m"} == base["time"]
    assert {k: v for k, v in out["work"].items() if k != key} == \
        {k: v for k, v in base["work"].items() if k != key}
    assert out["memory"] == base["memory"] and out["scaling"] == base["scaling"]
    assert out["unmeasured"]["new/case2"] == "rank 0: E: x"
    assert set(out["cases"]) == set(base["cases"]) | {"new/case"}
    assert out["added"][-1]["command"] == new["command"]
    assert out["machine_info"] == base["machine_info"]


def test_add_refuses_rules_it_was_not_fitted_under():
    base = _packaged()
    new = {"rules": {**base["rules"], "time_margin": 99.0}, "cases": []}
    with pytest.raises(Exception, match="other rules.*--refit"):
        cli.add_to(base, new)


def test_add_refuses_a_file_of_another_machine(tmp_path):
    base = _packaged()
    base["machine_info"] = {**base["machine_info"], "fingerprint": "0123456789ab"}
    f = tmp_path / "cal.json"
    f.write_text(json.dumps(base))
    with pytest.raises(Exception, match="measured on machine 0123456789ab, this is .*mix two "
                                        "machines"):
        cli._existing_for_add(f)
    with pytest.raises(Exception, match="needs an existing calibration file"):
        cli._existing_for_add(tmp_path / "absent.json")


def test_a_keyword_that_selects_no_bounds_case_is_an_error():
    args = argparse.Namespace(runs=1, tier="quick", world_sizes="1,2,3,4", keyword="no_such_path")
    with pytest.raises(ValueError, match="no bounds case .* selected by -k 'no_such_path'"):
        cli._cases(args)
