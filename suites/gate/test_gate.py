"""The gate's own mechanics (fsdp_conformance/gate/upgrade.py): specs, its directory rule, step
limits and errors, the pip-constraint diagnosis. The end-to-end gate is in test_gate_e2e.py."""
from __future__ import annotations

import sys
import time

import pytest

from fsdp_conformance.gate import upgrade as gate
from fsdp_conformance.cli import main


@pytest.mark.parametrize("spec", ["torch==2.15.0", "torch>=2.14", "torch == 2.13.0"])
def test_check_spec_accepts_torch_requirements(spec):
    assert gate.check_spec(spec).startswith("torch")


@pytest.mark.parametrize("spec", ["numpy==1.0", "torch", "torch==", "torch==2.15.0; rm -rf /"])
def test_check_spec_rejects_anything_else(spec):
    with pytest.raises(ValueError, match="torch==2.15.0"):
        gate.check_spec(spec)


def test_cli_usage_errors_exit_2(capsys, tmp_path):
    assert main(["gate", "--candidate", "numpy==1"]) == 2
    assert "torch spec" in capsys.readouterr().err
    assert main(["gate", "--candidate-python", str(tmp_path / "nope")]) == 2
    assert "not an executable interpreter" in capsys.readouterr().err


def test_never_writes_into_an_existing_directory(tmp_path, capsys):
    out = tmp_path / "earlier-gate"
    out.mkdir()
    (out / "gate.md").write_text("earlier results")
    rc = main(["gate", "--candidate-python", sys.executable, "--out", str(out), "--bench", "none"])
    assert rc == 2
    assert "exists" in capsys.readouterr().err
    assert (out / "gate.md").read_text() == "earlier results"


def test_step_past_its_limit_is_killed_and_named(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(gate.GateError, match=r"step 'sleeper' ran past its limit of 1 s"):
        gate.run_step("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"],
                      tmp_path / "sleep.log", timeout=1)
    assert time.monotonic() - t0 < 30


def test_failed_step_names_its_log_and_shows_its_end(tmp_path):
    with pytest.raises(gate.GateError) as e:
        gate.run_step("bad", [sys.executable, "-c", "print('the reason'); raise SystemExit(3)"],
                      tmp_path / "bad.log", timeout=60)
    assert "exited 3" in str(e.value) and "the reason" in str(e.value)
    assert str(tmp_path / "bad.log") in str(e.value)
    assert gate.run_step("finds failures", [sys.executable, "-c", "raise SystemExit(1)"],
                         tmp_path / "one.log", timeout=60, ok_codes=(0, 1)) == 1


def test_pip_constraint_is_diagnosed(tmp_path, monkeypatch):
    fake = tmp_path / "setup-env"
    fake.write_text("#!/bin/sh\necho 'The user requested (constraint) torch<=2.14.1'\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(gate, "SETUP_ENV", fake)
    with pytest.raises(gate.GateError, match="pip constraint"):
        gate.ensure_env("torch==2.15.0", tmp_path / "venvs", tmp_path / "logs", timeout=60)


def test_one_environment_per_spec(tmp_path):
    a = gate.venv_dir(tmp_path, "torch==2.15.0")
    assert a == gate.venv_dir(tmp_path, "torch==2.15.0")
    assert a != gate.venv_dir(tmp_path, "torch==2.14.1")
    assert a.parent == tmp_path


def test_demote_puts_an_embedded_report_under_the_gates_section():
    from fsdp_conformance.gate.upgrade import demote

    assert demote("# A\ntext #1\n## B") == "### A\ntext #1\n#### B"


def _compare_json(path, changes):
    import json
    path.write_text(json.dumps({"changes": [
        {"category": cat, "label": label, "subject": subject, "item": item}
        for cat, label, subject, item in changes]}))


def test_flagged_splits_noisy_from_other_regressions(tmp_path):
    p = tmp_path / "c.json"
    _compare_json(p, [("regression", "slower", "fsdp1.full/save/ws2/1e5", "time"),
                      ("regression", "more memory", "fsdp2.full/load/ws4/1e6", "memory"),
                      ("regression", "missing in NEW", "fsdp1.sharded/load/ws2/1e6", ""),
                      ("improvement", "faster", "fsdp1.rekey/save/ws1/1e5", "time")])
    flagged, other = gate._flagged(p)
    assert flagged == {"fsdp1.full/save/ws2/1e5", "fsdp2.full/load/ws4/1e6"}
    assert other == ["missing in NEW: fsdp1.sharded/load/ws2/1e6"]


def test_recheck_measures_the_flagged_benchmarks_again_on_both_sides(tmp_path):
    """A flagged benchmark's grid runs again on each side (here this interpreter on both)
    and the second comparison decides; the same torch twice must not confirm a 3x
    slowdown threshold."""
    out = tmp_path / "g"
    (out / "logs").mkdir(parents=True)
    name = "fsdp2.sharded/save/ws1/1e5"
    _compare_json(out / "compare-bench.json", [("regression", "slower", name, "time")])
    sides = [gate.Side("baseline", None, sys.executable),
             gate.Side("candidate", None, sys.executable)]
    cfg = gate.GateConfig(candidate_python=sys.executable, out=out, step_timeout=300)
    res = gate.recheck("bench", cfg, out, sides, ["--max-slowdown", "3", "--max-memory-growth",
                                                  "3"], out / "logs")
    assert res["flagged"] == [name] and res["confirmed"] == [] and res["other"] == []
    import json
    for side in ("baseline", "candidate"):
        names = [b["name"] for b in
                 json.loads((out / side / "bench-recheck.json").read_text())["benchmarks"]]
        assert sorted(names) == ["fsdp2.sharded/load/ws1/1e5", name]
    assert "reproduced when measured again (regressions): none" in gate.recheck_text(res)


def test_recheck_measures_the_flagged_bounds_cases_again_and_verdicts_stand(tmp_path):
    """A bounds case flagged slower in the run comparison runs again on each side (its path's
    bounds cases, here at world size 1 only) and the second comparison decides; a verdict
    regression in the same comparison is not rechecked and stays."""
    out = tmp_path / "g"
    (out / "logs").mkdir(parents=True)
    cid = "fsdp2.full/adam/scaled500000.nested/dtensor/ws1/fp32/steps1+2/bounds"
    _compare_json(out / "compare-run.json", [
        ("regression", "slower", cid, "save time"),
        ("regression", "newly failing", "fsdp1.full/sgd/mlp.nested/flat/ws2/fp64", "P2")])
    sides = [gate.Side("baseline", None, sys.executable),
             gate.Side("candidate", None, sys.executable)]
    cfg = gate.GateConfig(candidate_python=sys.executable, out=out, step_timeout=300,
                          world_sizes="1")
    res = gate.recheck("run", cfg, out, sides, ["--max-slowdown", "3", "--max-memory-growth",
                                                "3"], out / "logs")
    assert res["flagged"] == [cid] and res["confirmed"] == []
    assert res["other"] == ["newly failing: fsdp1.full/sgd/mlp.nested/flat/ws2/fp64 P2"]
    import json
    for side in ("baseline", "candidate"):
        run = json.loads((out / side / "run-recheck.json").read_text())
        assert [c["id"] for c in run["cases"]] == [cid]
        assert run["cases"][0]["measurements"]["save"]["time_s"] > 0
    text = gate.recheck_text(res)
    assert "bounds cases flagged slower or bigger" in text and "they stand" in text


def test_fixture_directions_count_who_read_whose_checkpoints(tmp_path, monkeypatch):
    """The gate's both-directions table: each side's P12 verdicts per torch release that
    wrote the fixtures (here two runs reading 2.13.0's and 2.15.0's)."""
    import json

    import fsdp_conformance.report.run_report as rr
    from fsdp_conformance.gate.upgrade import fixture_directions, release

    def run(torch_version, verdicts):
        cases = [{"id": f"c{i}", "golden": f"{w}/fx{i}", "properties": {"P12": {"status": s}}}
                 for i, (w, s) in enumerate(verdicts)]
        p = tmp_path / f"{torch_version}.json"
        p.write_text(json.dumps({"torch_version": torch_version, "cases": cases}))
        return p

    base = run("2.13.0+cpu", [("2.13.0", "pass"), ("2.15.0", "known"), ("2.15.0", "pass")])
    cand = run("2.15.0+cu128", [("2.13.0", "pass"), ("2.15.0", "pass")])
    monkeypatch.setattr(rr, "load_report", lambda p: json.loads(p.read_text()))
    md = fixture_directions({"baseline": base, "candidate": cand})
    assert "| baseline | 2.13.0+cpu | 2.13.0 (its own) | pass 1 |" in md
    assert "| baseline | 2.13.0+cpu | 2.15.0 | known 1, pass 1 |" in md
    assert "| candidate | 2.15.0+cu128 | 2.13.0 | pass 1 |" in md
    assert release("2.15.0+cu128") == "2.15.0" and release("2.8.0") == "2.8.0"
    assert release("2.16.0.dev20250601+cpu") == "2.16.0.dev20250601"  # as generate names it
    assert release("2.15.0rc1") == "2.15.0rc1"


def test_the_upgrade_comparison_leaves_out_the_candidates_fixtures_and_rollbacks_are_named(
        tmp_path):
    """The baseline reads the candidate's fixtures as a rollback, the candidate as its own
    files: no before/after pair, so the upgrade comparison leaves them out
    (``upgrade_view``); a candidate's checkpoint the baseline fails to load is a rollback
    failure (a known limitation there is not)."""
    import json

    from fsdp_conformance.gate.upgrade import rollback_failures, upgrade_view

    def case(golden, status):
        return {"id": f"x/golden:{golden}", "golden": golden,
                "properties": {"P12": {"status": status, "detail": f"{status} detail"}}}

    run = tmp_path / "baseline" / "run.json"
    run.parent.mkdir()
    run.write_text(json.dumps({"cases": [case("2.13.0/a", "pass"), case("2.15.0/a", "known"),
                                         case("2.15.0/b", "fail"), {"id": "rt", "properties": {}}]}))
    view = upgrade_view(run, "2.15.0")
    assert view.name == "run-upgrade.json"
    assert [c["id"] for c in json.loads(view.read_text())["cases"]] == ["x/golden:2.13.0/a", "rt"]
    assert upgrade_view(run, None) == run  # one release wrote every fixture: as it is
    assert rollback_failures(run, "2.15.0") == [
        {"case": "x/golden:2.15.0/b", "status": "fail", "detail": "fail detail"}]
    assert rollback_failures(run, None) == []


def test_a_rollback_a_known_limitation_breaks_is_the_gates_headline(tmp_path):
    """torch 2.13 cannot read the DCP metadata 2.15 writes: a known limitation, so no
    rollback failure, but the person deciding the upgrade must read it first
    (``rollback_known``: entry -> cases; the gate's verdict starts NO ROLLBACK)."""
    import json

    from fsdp_conformance.gate.upgrade import rollback_known

    def case(golden, status, known=None):
        return {"id": f"x/golden:{golden}", "golden": golden,
                "properties": {"P12": {"status": status, "known": known}}}

    run = tmp_path / "run.json"
    run.write_text(json.dumps({"torch_version": "2.13.0+cpu", "cases": [
        case("2.15.0/a", "known", "dcp-strides"), case("2.13.0/a", "pass"),
        case("2.15.0/b", "known", "dcp-strides"),  # no fixture of its own: counted
        case("2.15.0/t", "known", "tuple-to-list"),  # the baseline's own load shows it too
        case("2.13.0/t", "known", "tuple-to-list"),
        case("2.15.0/u", "known", "tuple-to-list"),  # no twin, but seen on its own files
        case("2.13.0/c", "known", "other"), case("2.15.0/d", "pass")]}))
    assert rollback_known(run, "2.15.0") == {"dcp-strides": ["x/golden:2.15.0/a",
                                                             "x/golden:2.15.0/b"]}
    assert rollback_known(run, None) == {}


def test_a_selection_of_nothing_stops_the_gate_before_any_environment(tmp_path, capsys):
    out = tmp_path / "g"
    assert main(["gate", "--candidate", "torch==2.15.0", "-k", "fsdp2.shardd", "--out",
                 str(out), "--venvs", str(tmp_path / "venvs")]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'fsdp2.sharded'" in err, err
    assert not out.exists() and not (tmp_path / "venvs").exists()
    assert main(["gate", "--candidate", "torch==2.15.0", "--world-sizes", "64", "--out",
                 str(out)]) == 2
    assert "the tier's cases use world sizes [1, 2, 3, 4]" in capsys.readouterr().err
