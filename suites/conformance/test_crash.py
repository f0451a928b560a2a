"""P16, crash consistency (run/crash_kind.py, properties/crash_props.py): a second save killed
at a chosen point, then the load.

- The rules of the judgement on hand-made states (no ranks): one save's state, the other's,
  a mix by key, a tensor whose elements come from both, a value from neither.
- The quick tier's crash slice on real ranks: each case's verdict, and the harness deciding
  a case whose killed rank left the others waiting in a collective by the death, not by a
  timeout (the verdict's status tells them apart: no wall-clock bound).
- A planted DCP writer that commits ``.metadata`` before its data (suites/conformance/
  crash_plants.py) fails P16, and the known entry of torch's own writer does not explain it.
"""
from __future__ import annotations

import json
import subprocess

import pytest
import torch

from fsdp_conformance.cases import Case, crash_parts
from fsdp_conformance.properties.crash_props import classify, p16_verdict
from fsdp_conformance.sut.crash_points import plan_of
from suites.conformance.crash_plants import SETUP
from suites.conftest import PYTHON, ROOT, env_for_subprocess

CLI = [PYTHON, "-m", "fsdp_conformance"]


def _state(exp_avg, step=2.0) -> dict:
    return {"state": {"fc.weight": {"exp_avg": torch.tensor(exp_avg, dtype=torch.float64),
                                    "step": torch.tensor(step)}}}


# -- the judgement --------------------------------------------------------------------------

def test_classify_names_which_save_each_entry_came_from():
    one, two = _state([1.0, 1.0]), _state([2.0, 2.0], step=3.0)
    assert classify(_state([1.0, 1.0]), one, two)[0] == "save 1"
    assert classify(_state([2.0, 2.0], step=3.0), one, two)[0] == "save 2"
    kind, keys = classify(_state([2.0, 2.0]), one, two)  # save 2's moment, save 1's step
    assert kind == "mix"
    assert keys["save 1"] == ["state['fc.weight']['step']"]
    assert keys["save 2"] == ["state['fc.weight']['exp_avg']"]
    kind, keys = classify(_state([1.0, 2.0]), one, two)  # elements of both in one tensor
    assert kind == "mix" and keys["both"] == ["state['fc.weight']['exp_avg']"]
    kind, keys = classify(_state([1.0, 7.0]), one, two)  # an element no save has
    assert kind == "neither" and keys["neither"] == ["state['fc.weight']['exp_avg']"]
    missing = {"state": {"fc.weight": {"step": torch.tensor(2.0)}}}
    assert classify(missing, one, two)[0] == "neither"


def test_a_silent_load_passes_only_as_save_1_on_every_rank():
    class Rec:
        def __init__(self, rank, loaded):
            self.rank, self.loaded = rank, loaded

    one, two = _state([1.0]), _state([2.0], step=3.0)

    def views(rec):
        return one, two, rec.loaded

    gone = "x.pt is missing"
    ones = [Rec(0, _state([1.0])), Rec(1, _state([1.0]))]
    twos = [Rec(0, _state([2.0], 3.0)), Rec(1, _state([2.0], 3.0))]
    ok = p16_verdict("kill", ones, views, 2, incomplete=gone)
    assert ok.status == "pass" and ok.detail == (
        "kill: restored save 1 exactly on every rank (2 rank(s), bitwise); save 2 is not "
        "complete on disk (x.pt is missing)")
    both = p16_verdict("kill", twos, views, 2, incomplete=gone)
    assert both.status == "fail" and both.detail.startswith(
        "kill: loaded silently save 2 on every rank, although save 2 is not complete on disk "
        "(x.pt is missing):")
    mixed = p16_verdict("kill", [ones[0], twos[1]], views, 2, incomplete=gone)
    assert mixed.status == "fail" and mixed.detail.startswith(
        "kill: loaded silently a mix of save 1 and save 2 (save 1 on rank(s) [0], save 2 on "
        "rank(s) [1]); save 2 is not complete on disk (x.pt is missing):")
    # save 2 whole on disk (the killed rank had nothing left to write): it is the newest
    assert p16_verdict("kill", twos, views, 2, incomplete="").status == "pass"
    stale = p16_verdict("kill", ones, views, 2, incomplete="")
    assert stale.status == "fail" and stale.detail.startswith(
        "kill: loaded save 1 on every rank, although save 2 is complete on disk")


def test_crash_values_are_checked_where_the_case_is_made():
    assert crash_parts("commit.rank0.over", 2) == ("commit", (0,), "over")
    assert crash_parts("own_file.all.fresh", 3) == ("own_file", (0, 1, 2), "fresh")
    for bad, words in (("commit.rank1.over", "coordinator"), ("own_file.rank2.over", "r < 2"),
                       ("late.rank0.over", "crash point"), ("start.rank0.latest", "layout"),
                       ("start.rank0", "<point>.<who>.<layout>")):
        with pytest.raises(ValueError, match=words.replace("<", ".").replace(">", ".")):
            Case(api="fsdp2.sharded", crash=bad)
    with pytest.raises(ValueError, match="kind of its own"):
        Case(api="fsdp2.sharded", crash="start.rank0.over", fault="shape")


def test_a_torn_kill_lands_where_the_seed_says():
    a, b = plan_of("torn.rank0.over", 2, 0), plan_of("torn.rank0.over", 2, 0)
    assert a == b and 0.2 <= a.fraction <= 0.8
    assert plan_of("torn.rank0.over", 2, 1).fraction != a.fraction


# -- real ranks -----------------------------------------------------------------------------

def _run(tmp_path, name: str, *args: str, plant: bool = False) -> dict:
    out = tmp_path / f"{name}.json"
    env = {**env_for_subprocess(), **({"FSDPC_RANK_SETUP": SETUP} if plant else {})}
    p = subprocess.run([*CLI, "run", *args, "--bounds", "off", "--out", str(out)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode in (0, 1), p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(out.read_text())


def _p16(report: dict) -> dict[str, dict]:
    return {c["id"].rsplit("/crash:", 1)[1] + (" async" if "/async_save/" in c["id"] else "")
            + f" {c['id'].split('/')[0]}": c for c in report["cases"]}


@pytest.mark.slow
def test_the_quick_crash_slice(tmp_path):
    """Every crash case of the quick tier, as torch 2.13 does it: the DCP overwrite killed
    after the plan exchange is the known entry (a mix, or the killed save whole); every
    other point restores save 1 or refuses with an error that says so; a killed rank never
    leaves the case waiting."""
    report = _run(tmp_path, "quick", "-k", "crash")
    cases = _p16(report)
    assert len(cases) == 10, sorted(cases)
    statuses = {k: c["properties"]["P16"]["status"] for k, c in cases.items()}
    known = {k for k, s in statuses.items() if s == "known"}
    assert known == {"commit.rank0.over fsdp1.sharded", "own_file.all.over fsdp2.sharded",
                     "own_file.rank1.over async fsdp2.sharded",
                     "before_file.rank1.over fsdp2.sharded"}, statuses
    assert all(s == "pass" for k, s in statuses.items() if k not in known), statuses
    for k in known:
        assert cases[k]["properties"]["P16"]["known"] == "dcp-overwrite-reads-uncommitted-data"
    detail = {k: c["properties"]["P16"]["detail"] for k, c in cases.items()}
    assert "restored save 1 exactly on every rank (3 rank(s), bitwise)" in \
        detail["start.rank0.over fsdp2.sharded"]
    assert "EOFError" in detail["torn.rank0.over fsdp2.sharded"]
    assert "No such file" in detail["own_file.rank0.fresh fsdp1.full"]
    assert "a mix of save 1 and save 2" in detail["before_file.rank1.over fsdp2.sharded"]
    # rank 1 killed after its file: rank 0 waits in DCP's gather. The pool decides the call
    # by the death (RankDied, within its error grace); a call left to its timeout would be
    # a RankTimeout, which run/crash_kind.after_kill makes an error: the status says which,
    # on a machine of any speed. No planned death is rerun as a machine's would be.
    killed = cases["own_file.rank1.over async fsdp2.sharded"]
    assert killed["properties"]["P16"]["status"] == "known", killed["properties"]["P16"]
    assert not killed.get("rerun"), killed.get("rerun")


@pytest.mark.slow
def test_a_writer_that_commits_metadata_before_its_data_fails(tmp_path):
    """The planted writer commits ``.metadata`` before any data file. Rank 1 killed as it
    opens its data file, over save 1: rank 0's data is save 2's, rank 1's still save 1's,
    under save 2's own metadata, and the load mixes them silently. torch's own writer fails
    there too, as its known entry models (save 1's metadata over the new data); the plant's
    mix has another cause (a data file, not the metadata, is what save 2 lacks), so it is
    no known limitation: it fails."""
    case = "fsdp2.sharded/adam/mlp.nested/dtensor/ws2/fp64/crash:before_file.rank1.over"
    clean = _run(tmp_path, "clean", "--tier", "full", "--case", case)["cases"][0]
    assert clean["properties"]["P16"]["status"] == "known", clean["properties"]["P16"]
    planted = _run(tmp_path, "planted", "--tier", "full", "--case", case, plant=True)
    c = planted["cases"][0]
    p16 = c["properties"]["P16"]
    assert p16["status"] == "fail", p16
    assert p16["detail"].startswith(
        "save 2 (step 3) killed at 'before_file' on rank 1, written into save 1's directory: "
        "loaded silently a mix of save 1 and save 2 ("), p16["detail"]
    assert "save 2 is not complete on disk (dcp/__1_0.distcp holds other bytes than this " \
        "save writes)" in p16["detail"], p16["detail"]
    assert not c.get("rerun"), c.get("rerun")  # the kill was decided as planned, not retried
