"""API removal is a verdict, not an error (run/removal.py): against a torch in which the five
legacy FSDP1 optimizer-state functions raise ``NotImplementedError`` (pytorch#191712; patched
into the ranks by ``FSDPC_RANK_SETUP``, removed_api.py), the run says "removed" for the four
paths that call them, lists them and the fixtures only they read, and ``compare`` reports
"API removed: 4 paths", not a regression per verdict."""
from __future__ import annotations

import json
import subprocess

import pytest

from fsdp_conformance.cases import Case
from fsdp_conformance.properties.verdict import Verdict, suite_error
from fsdp_conformance.run.removal import mark_removed, removal_in

from suites.conftest import PYTHON, ROOT, env_for_subprocess

LEGACY_PATHS = ["fsdp1.legacy_full", "fsdp1.legacy_scatter", "fsdp1.legacy_sharded", "fsdp1.rekey"]
SELECTION = "sgd_momentum/mlp.nested/flat"  # every FSDP1 path, 5 golden loads per release


def _tb(func: str, line: str) -> str:
    return ("Traceback (most recent call last):\n"
            '  File "/x/sut/paths.py", line 125, in save_path\n'
            "    return FSDP.full_optim_state_dict(model, optim)\n"
            f'  File "/x/torch/distributed/fsdp/fully_sharded_data_parallel.py", line 9, in {func}\n'
            "    raise ...\n" + line + "\n")


CALLS = ("full_optim_state_dict", "shard_full_optim_state_dict")


@pytest.mark.parametrize("detail, call", [
    (_tb("full_optim_state_dict", "NotImplementedError: use optim_state_dict"),
     "full_optim_state_dict"),
    (_tb("stub", "NotImplementedError: FSDP.shard_full_optim_state_dict has been removed"),
     "shard_full_optim_state_dict"),
    ("AttributeError: type object 'FullyShardedDataParallel' has no attribute "
     "'full_optim_state_dict'", "full_optim_state_dict"),
    ("ImportError: cannot import name 'shard_full_optim_state_dict' from 'x'",
     "shard_full_optim_state_dict"),
    (_tb("full_optim_state_dict", "RuntimeError: full_optim_state_dict was removed in 2.16"),
     "full_optim_state_dict"),
])
def test_a_removal_is_recognised_by_the_paths_own_calls(detail, call):
    r = removal_in(detail, CALLS)
    assert r is not None and r.call == call


@pytest.mark.parametrize("detail", [
    _tb("full_optim_state_dict", "RuntimeError: shape mismatch for 'inp.weight'"),
    _tb("optim_state_dict", "NotImplementedError: a layout this torch does not handle"),
    "AttributeError: 'NoneType' object has no attribute 'full_optim_state_dict_x'",
    _tb("_flatten_optim_state", "KeyError: 'exp_avg' was removed from the dict"),
])
def test_any_other_failure_of_the_same_call_is_not_a_removal(detail):
    assert removal_in(detail, CALLS) is None


def test_only_verdicts_that_show_the_removal_change():
    case = Case(model="mlp", plan="nested", optimizer="adam", world_size=2, api="fsdp1.legacy_full")
    gone = _tb("full_optim_state_dict", "NotImplementedError: removed")
    out = mark_removed(case, {"P1": Verdict("pass"), "P3": Verdict("error", gone),
                              "P6": Verdict("fail", "exp_avg differs"),
                              "P7": suite_error(gone)})
    assert out["P1"].status == "pass" and out["P6"].status == "fail"
    assert out["P7"].status == "error"  # the suite's own failure is never excused
    assert out["P3"].status == "removed"
    assert "fsdp1.legacy_full calls torch's `full_optim_state_dict`" in out["P3"].detail
    user = Case(model="mlp", plan="nested", optimizer="adam", world_size=2, api="custom:mine")
    assert mark_removed(user, {"P3": Verdict("error", gone)})["P3"].status == "error"


def _run(tmp_path, name: str, removed: bool) -> dict:
    env = env_for_subprocess()
    if removed:
        env["FSDPC_RANK_SETUP"] = "suites.conformance.removed_api:install"
    out = tmp_path / f"{name}.json"
    p = subprocess.run([PYTHON, "-m", "fsdp_conformance", "run", "-k", SELECTION,
                        "--out", str(out)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(out.read_text())


def _statuses(report: dict) -> dict:
    return {c["id"]: {p: v["status"] for p, v in c["properties"].items()} for c in report["cases"]}


def test_a_torch_without_the_legacy_functions_is_reported_removed(tmp_path):
    clean = _run(tmp_path, "clean", removed=False)
    gone = _run(tmp_path, "gone", removed=True)
    s = gone["summary"]
    assert sorted(s["removed"]) == LEGACY_PATHS
    assert s["by_status"]["fail"] == s["by_status"]["error"] == 0
    versions = sorted(d.name for d in (ROOT / "fixtures").iterdir() if d.is_dir())
    assert s["removed_fixtures"] == sorted(  # of every stored release: only removed paths read
        f"{v}/{name}" for v in versions  # per-rank files and PARAM_ID dicts
        for name in ("fsdp1.legacy_sharded-sgd_momentum-mlp.nested-flat-ws2-bf16",
                     "fsdp1.rekey-sgd_momentum-mlp.nested-flat-ws3-bf16"))
    assert len(versions) >= 3
    before, after = _statuses(clean), _statuses(gone)
    assert before.keys() == after.keys()
    for c in gone["cases"]:
        decided = {p for p, st in before[c["id"]].items() if st != "n/a"}
        if c["api"] in LEGACY_PATHS:  # nothing of these paths ran: every decided verdict,
            # except where the load failed before the removed call (a 2.15 per-rank file
            # 2.13 cannot unpickle: known in both runs)
            for p in decided:
                got, was = after[c["id"]][p], before[c["id"]][p]
                assert got == "removed" or got == was == "known", (c["id"], p, was, got)
        else:  # the other paths (golden loads of legacy fixtures too) are untouched
            assert after[c["id"]] == before[c["id"]], c["id"]
    assert "API removed: 4 paths" in (tmp_path / "gone.md").read_text()

    cmd = [PYTHON, "-m", "fsdp_conformance", "compare", str(tmp_path / "clean.json"),
           str(tmp_path / "gone.json"), "--out", str(tmp_path / "cmp.json")]
    p = subprocess.run(cmd, cwd=ROOT, env=env_for_subprocess(), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 1, p.stdout
    cmp = json.loads((tmp_path / "cmp.json").read_text())
    assert cmp["regression"] is False and sorted(cmp["api_removed"]) == LEGACY_PATHS
    assert cmp["verdict"].startswith("API REMOVED: 4 paths (fsdp1.legacy_full, "
                                     "fsdp1.legacy_scatter, fsdp1.legacy_sharded, fsdp1.rekey)")
    assert {c["label"] for c in cmp["changes"]} == {"API removed"}
    p = subprocess.run(cmd[:-2] + ["--allow-removed"], cwd=ROOT, env=env_for_subprocess(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "API REMOVED: 4 paths" in p.stdout, p.stdout
