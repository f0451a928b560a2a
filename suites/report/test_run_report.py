"""The run report: schema, summary counts, ok flag, Markdown and terminal rendering, JSON
round trip, schema check, atomic writing. Synthetic results (real Cases, real Verdicts);
no rank pool."""
from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from fsdp_conformance.cases import Case
from fsdp_conformance.known.entries import KNOWN
from fsdp_conformance.properties.verdict import Verdict, error, fail, na, passed
from fsdp_conformance.report.run_report import (SCHEMA, CaseResult, ReportFormatError,
                                                build_report, load_report, render_markdown,
                                                render_table, summary_rows, write_run_report)

KEY = KNOWN[0].key
FAIL_DETAIL = "state['fc1.weight']['exp_avg'][3:5] differs on rank 1: 0.25 != 0.5"


def _build(results, **kw):
    args = dict(tier="quick", backend="gloo", seed=0, world_sizes=[2, 1], wall_time_s=12.5,
                argv=["fsdp-conformance", "run"],
                tolerances={"fp64": {"rtol": 1e-12, "atol": 1e-14}})
    args.update(kw)
    return build_report(results, **args)


def _results() -> list[CaseResult]:
    """Four cases on two paths: all pass; one fail; one known + fixed upstream; n/a."""
    a = Case(api="fsdp1.full")
    b = Case(api="fsdp1.full", optimizer="sgd", world_size=1)
    c = Case(api="fsdp2.sharded", use_orig_params=True, world_size=3)
    d = Case(api="fsdp2.sharded", optimizer="adagrad")
    return [
        CaseResult(b, {"P0": passed(), "P1": passed(), "P10": passed()}, {"save": 0.1, "total": 0.3}),
        CaseResult(a, {"P0": passed(), "P1": fail(FAIL_DETAIL), "P2": passed()},
                   {"save": 0.2, "load": 0.1, "total": 0.5}),
        CaseResult(c, {"P0": passed(), "P1": Verdict("known", "exp_avg == exp_avg_sq", KEY),
                       "P4": Verdict("pass", "", KEY)}, {"total": 1.0}),
        CaseResult(d, {"P0": passed(), "P1": na("no full dict on this path"),
                       "P4": na("no full dict on this path"), "P5": na("rekey: FSDP1 only")}, {}),
    ]


def test_schema_cases_and_summary_counts():
    r = _build(_results(), selection="fsdp1")
    assert r["schema"] == SCHEMA == "fsdp-conformance/run/1"
    assert r["backend"] == "gloo" and r["tier"] == "quick" and r["seed"] == 0
    assert r["world_sizes"] == [1, 2] and r["selection"] == "fsdp1"
    assert r["tolerances"]["fp64"]["rtol"] == 1e-12
    assert "node" in r["machine_info"] and r["torch_version"]
    assert r["started"] < r["finished"]
    ids = [c["id"] for c in r["cases"]]
    assert ids == sorted(ids) and len(ids) == 4
    first = next(c for c in r["cases"] if c["id"] == Case(api="fsdp1.full").id)
    assert first["api"] == "fsdp1.full" and first["optimizer"] == "adam"
    assert first["world_size"] == 2 and first["timings"]["load"] == 0.1
    assert first["properties"]["P1"] == {"status": "fail", "detail": FAIL_DETAIL}

    s = r["summary"]
    assert s["cases"] == 4
    assert s["by_status"] == {"pass": 8, "fail": 1, "known": 1, "n/a": 3, "error": 0, "removed": 0}
    assert s["by_path"]["fsdp1.full"]["P0"] == {"pass": 2}
    assert s["by_path"]["fsdp1.full"]["P1"] == {"pass": 1, "fail": 1}
    assert s["by_path"]["fsdp2.sharded"]["P4"] == {"pass": 1, "n/a": 1}
    assert list(s["by_path"]["fsdp1.full"]) == ["P0", "P1", "P2", "P10"]  # numeric order
    assert s["failing_cases"] == [Case(api="fsdp1.full").id]
    assert s["known"] == {KEY: 1}
    assert r["ok"] is False


def test_fixed_upstream_listed():
    r = _build(_results())
    cid = Case(api="fsdp2.sharded", use_orig_params=True, world_size=3).id
    assert r["summary"]["fixed_upstream"] == [[cid, "P4", KEY]]
    assert r["cases"][[c["id"] for c in r["cases"]].index(cid)]["properties"]["P4"][
        "fixed_upstream"] is True
    md = render_markdown(r)
    assert f"- `{cid}` P4: {KEY}" in md.split("## Fixed upstream?")[1]


def test_ok_flag():
    case = Case(api="fsdp1.full")
    assert _build([CaseResult(case, {"P0": passed(), "P1": na("x"),
                                     "P3": Verdict("known", "d", KEY)})])["ok"] is True
    assert _build([CaseResult(case, {"P0": passed(), "P1": fail("diff")})])["ok"] is False
    r = _build([CaseResult(case, {"P0": passed(), "P1": error("RankTimeout: ...")})])
    assert r["ok"] is False and r["summary"]["failing_cases"] == [case.id]


def test_summary_rows_matrix():
    header, rows = summary_rows(_build(_results()))
    assert header == ["path", "cases", "P0", "P1", "P2", "P4", "P5", "P10"]
    assert [row[0] for row in rows] == ["fsdp1.full", "fsdp2.sharded"]
    full = dict(zip(header, rows[0]))
    assert full["cases"] == "2" and full["P0"] == "2✓" and full["P1"] == "1✓ 1✗"
    assert full["P4"] == ""  # not run on this path
    sharded = dict(zip(header, rows[1]))
    assert sharded["P1"] == "1k 1–" and sharded["P4"] == "1✓ 1–"


def test_markdown_failures_known_na_tolerances():
    r = _build(_results())
    md = render_markdown(r)
    cid = Case(api="fsdp1.full").id
    assert md.startswith(f"# fsdp-conformance run: torch {r['torch_version']}, gloo, tier quick")
    assert "FAILED" in md and "| path | cases | P0 |" in md and "Legend:" in md
    failures = md.split("## Failures (1)")[1].split("## Known torch limitations")[0]
    assert cid in failures and FAIL_DETAIL in failures
    assert f"fsdp-conformance run --case '{cid}'" in failures
    known = md.split("## Known torch limitations")[1].split("## Fixed upstream?")[0]
    assert f"**{KEY}**: 1 case (P1)" in known
    assert KNOWN[0].reason in known and KNOWN[0].upstream in known
    na_part = md.split("## Not applicable")[1].split("## Tolerances")[0]
    assert "| no full dict on this path | 2 | P1, P4 |" in na_part
    assert "| rekey: FSDP1 only | 1 | P5 |" in na_part
    assert "| fp64 | 1e-12 | 1e-14 |" in md.split("## Tolerances")[1]


def test_markdown_fence_survives_backticks_in_detail():
    detail = "```\nnested fence\n```"
    md = render_markdown(_build([CaseResult(Case(), {"P1": fail(detail)})]))
    assert "````\n" + detail + "\n````" in md


def test_render_table_terminal():
    buf = io.StringIO()
    render_table(_build(_results()), Console(file=buf, width=200, color_system=None))
    out = buf.getvalue()
    assert "fsdp1.full" in out and "1✓ 1✗" in out
    assert Case(api="fsdp1.full").id in out and FAIL_DETAIL in out
    assert "Fixed upstream?" in out and KEY in out and "FAILED" in out


def test_json_round_trip(tmp_path):
    r = _build(_results())
    jp, mp = write_run_report(r, tmp_path / "a" / "run.json", tmp_path / "b" / "run.md")
    assert load_report(jp) == json.loads(json.dumps(r))
    assert mp.read_text(encoding="utf-8") == render_markdown(r)
    assert render_markdown(load_report(jp)) == render_markdown(r)


def test_minor_schema_version_accepted(tmp_path):
    p = tmp_path / "r.json"
    p.write_text(json.dumps({**_build([]), "schema": "fsdp-conformance/run/1.3"}))
    assert load_report(p)["schema"] == "fsdp-conformance/run/1.3"


@pytest.mark.parametrize("payload", [
    {"schema": "fsdp-conformance/bench-harness/1"},
    {"schema": "fsdp-conformance/run/2"},
    {"no": "schema"},
    [1, 2],
])
def test_wrong_schema_names_file(tmp_path, payload):
    p = tmp_path / "other.json"
    p.write_text(json.dumps(payload))
    with pytest.raises(ReportFormatError, match=r"other\.json.*expected schema "
                                                r"'fsdp-conformance/run/1'"):
        load_report(p)


def test_invalid_json_names_file(tmp_path):
    p = tmp_path / "broken.json"
    p.write_text('{"schema": "fsdp-conformance/run/1", ')
    with pytest.raises(ReportFormatError, match=r"broken\.json: not valid JSON"):
        load_report(p)


def test_atomic_write_leaves_no_temp_files(tmp_path):
    r = _build(_results())
    write_run_report(r, tmp_path / "run.json", tmp_path / "run.md")
    write_run_report(r, tmp_path / "run.json", tmp_path / "run.md")  # overwrite in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json", "run.md"]


def test_reports_are_readable_like_any_user_file(tmp_path):
    """mkstemp makes 0600 files; a report must get the usual 0666 minus the umask."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        write_run_report(_build(_results()), tmp_path / "run.json", tmp_path / "run.md")
    finally:
        os.umask(old)
    for name in ("run.json", "run.md"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name


def _bounds_case(p13: Verdict, correct: Verdict | None = None) -> list[CaseResult]:
    b = Case(api="fsdp1.full", model="scaled400000", world_size=2, steps=1, bounds=True)
    rt = Case(api="fsdp1.full")
    from suites.bounds.test_rules import _m

    meas = {ph: {**_m([1, 1]), "speed": sp} for ph, sp in (("save", 1.0), ("load", 2.5))}
    return [CaseResult(b, {"P13": p13, "P14": passed()}, {}, meas),
            CaseResult(rt, {"P0": passed(), "P1": correct or passed()}, {})]


def test_correctness_and_bounds_are_two_verdicts_with_their_own_exit_status():
    """Issue 32: a bound over on this machine never reads as a correctness failure. Exit 0
    both hold; 3 only the bounds failed (gate); advisory bounds exit 0; 1 correctness
    failed whatever the bounds."""
    from fsdp_conformance.report.run_report import exit_code, headline, verdict_lines

    ok = _build(_bounds_case(passed()))
    assert ok["ok"] and ok["correctness_ok"] and ok["bounds_ok"] and exit_code(ok) == 0
    lines = verdict_lines(ok)
    assert lines[0].startswith("correctness OK: 2 cases; 0 fail, 0 error")
    assert lines[1].startswith("bounds OK: 2 P13/P14 verdicts of 1 bounds cases")
    assert "judged at speed 1.00-2.50" in lines[1]
    assert ok["summary"]["bounds"]["speed_max"] == 2.5
    assert "bounds_calibration" in ok and ok["bounds_calibration"]["source"]

    over = _build(_bounds_case(fail("work (CPU) 5 ms > bound 3 ms")))
    assert not over["ok"] and over["correctness_ok"] and not over["bounds_ok"]
    assert exit_code(over) == 3
    assert headline(over).startswith("FAILED (bounds only): 2 cases")
    assert verdict_lines(over)[0].startswith("correctness OK")
    assert verdict_lines(over)[1].startswith("bounds 1 over on this machine")
    md = render_markdown(over)
    assert "- correctness OK: 2 cases" in md and "- bounds 1 over on this machine" in md

    advisory = _build(_bounds_case(fail("over")), bounds_mode="advisory")
    assert advisory["ok"] and exit_code(advisory) == 0
    assert "(advisory: does not fail the run)" in verdict_lines(advisory)[1]

    both = _build(_bounds_case(fail("over"), fail(FAIL_DETAIL)), bounds_mode="advisory")
    assert not both["ok"] and not both["correctness_ok"] and exit_code(both) == 1
    assert verdict_lines(both)[0].startswith("correctness FAILED: 2 cases; 1 fail")


def test_the_report_records_the_command_as_typed_and_the_machine_fingerprint(monkeypatch):
    from fsdp_conformance.report.run_report import machine_line
    from fsdp_conformance.run.cli import command_line

    monkeypatch.setattr("sys.argv", ["/x/bin/fsdp-conformance", "run", "-k", "fsdp1.full"])
    assert command_line() == ["fsdp-conformance", "run", "-k", "fsdp1.full"]
    # python -m fsdp_conformance.cli (how the gate runs its steps) is the same command
    monkeypatch.setattr("sys.argv", ["/x/site-packages/fsdp_conformance/cli.py", "run"])
    assert command_line() == ["python -m fsdp_conformance", "run"]
    r = _build(_results())
    m = r["machine_info"]
    assert len(m["fingerprint"]) == 12 and m["cpu_model"]
    assert m["fingerprint"] in machine_line(r) and m["cpu_model"] in machine_line(r)


def test_a_case_rerun_after_a_rank_died_is_listed_in_every_report_without_failing_it(tmp_path):
    """run/lifecycle.py reruns a case whose rank died; the reports name it, keep the first
    death's text, and the verdicts (the second attempt's) decide the run."""
    from fsdp_conformance.report.run_report import exit_code, verdict_lines

    a = Case(api="fsdp1.full")
    death = "save side failed: rank(s) [0] died during the call\nkilled by SIGABRT"
    r = _build([CaseResult(a, {"P0": passed(), "P1": passed()}, {"total": 1.0}, rerun=death)])
    assert r["correctness_ok"] and exit_code(r) == 0
    assert r["summary"]["rerun"] == [a.id]
    assert [c["rerun"] for c in r["cases"]] == [death]
    assert verdict_lines(r)[-1] == (f"rerun: 1 case where a rank died in the first attempt "
                                    f"(verdicts from the second; see \"Reruns\"): {a.id}")
    md = render_markdown(r)
    assert "## Reruns (1)" in md and f"### `{a.id}`" in md and "killed by SIGABRT" in md
    path = tmp_path / "r.json"
    write_run_report(r, path, tmp_path / "r.md")
    assert load_report(path)["cases"][0]["rerun"] == death
    once = _build([CaseResult(a, {"P0": passed()}, {})])
    assert once["summary"]["rerun"] == [] and "rerun" not in once["cases"][0]
    assert "## Reruns" not in render_markdown(once)


def test_a_limitation_the_users_tests_declared_is_reported_as_theirs_with_their_reason():
    from fsdp_conformance.user.limitations import Limitation, apply_declared

    lim = Limitation.of("P2,P6", reason="our bf16 head drifts (team issue 12)")
    v = apply_declared({"P2": fail("differs")}, [lim])["P2"]
    md = render_markdown(_build([CaseResult(Case(api="fsdp1.full"), {"P2": v}, {})]))
    assert "- **P2,P6**: 1 case (P2)" in md
    assert ("declared by your tests (fsdp_known marker or known=): our bf16 head drifts "
            "(team issue 12)") in md
    assert "no longer recorded" not in md


def test_the_rerun_line_of_a_case_only_a_users_test_makes_is_a_pytest_command():
    from fsdp_conformance.report.run_report import rerun_command

    zoo = Case(api="fsdp1.full").id
    assert rerun_command(zoo) == f"fsdp-conformance run --case '{zoo}'"
    custom = "fsdp2.custom:manual_save/make_optimizer/Decoder.root/dtensor/ws2/fp64"
    assert rerun_command(custom) == f"pytest --fsdp-case '{custom}'"
    user = "fsdp2.full/make_optimizer/TinyTransformerish.root/dtensor/ws2->3/fp64"
    assert rerun_command(user) == f"pytest --fsdp-case '{user}'"


def test_the_matrix_names_its_property_columns():
    md = render_markdown(_build(_results()))
    assert "Properties: P0 layout, P1 gather, P2 vs one process," in md


def test_a_run_that_did_not_pass_says_what_to_do_next():
    from fsdp_conformance.report.run_report import next_steps

    assert next_steps(_build([CaseResult(Case(api="fsdp1.full"), {"P1": passed()}, {})])) == []
    failed = _build(_results())
    steps = next_steps(failed)
    assert any("rerun one case alone: fsdp-conformance run --case" in s for s in steps), steps
    assert "next: read each failure's detail" in render_markdown(failed)
    bounds_only = _build(_bounds_case(fail("work (CPU) 5 ms > bound 3 ms")))
    assert any("fsdp-conformance bounds calibrate" in s and "--bounds advisory" in s
               for s in next_steps(bounds_only))


def test_a_report_names_files_as_a_reader_elsewhere_finds_them(tmp_path, monkeypatch):
    """Tracebacks in details name torch's files from torch/, this package's from
    fsdp_conformance/, the run directory's relative to it: not the writer's directories
    (report/paths.py); the argv stays as typed."""
    import fsdp_conformance
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    own = Path(fsdp_conformance.__file__).resolve().parent
    tb = (f'Traceback (most recent call last):\n  File "{own}/sut/paths.py", line 9, in save\n'
          f'  File "/opt/x/.venv/lib/python3.11/site-packages/torch/optim/adam.py", line 4\n'
          f'  File "{tmp_path}/tests/test_mine.py", line 2\n'
          f'  File "/usr/lib/python3.11/threading.py", line 1\nKeyError: 3')
    rep = _build([CaseResult(Case(api="fsdp1.full"), {"P1": fail(tb)})],
                 argv=["fsdp-conformance", "run", "--out", f"{tmp_path}/r.json"])
    detail = rep["cases"][0]["properties"]["P1"]["detail"]
    assert 'File "fsdp_conformance/sut/paths.py", line 9, in save' in detail
    assert 'File "torch/optim/adam.py", line 4' in detail
    assert 'File "tests/test_mine.py", line 2' in detail
    assert 'File "/usr/lib/python3.11/threading.py", line 1' in detail  # elsewhere: kept
    assert str(own) not in json.dumps(rep["cases"]) and "site-packages" not in detail
    assert rep["argv"][-1] == f"{tmp_path}/r.json"


@pytest.mark.parametrize("text", [
    ".venv/lib/python3.11/site-packages/torch/x.py",  # relative: no writer's directory
    "https://example.com/a/site-packages/torch/x.py",  # a URL
    "(/[^/]+)+/site-packages/torch",  # a regular expression
    "file:///opt/run/reports/latest.html", "mlp/opt/run/x", "id.root/opt/run"])
def test_report_paths_rewrite_only_where_an_absolute_path_starts(text):
    from fsdp_conformance.report.paths import portable_text

    prefixes = [("/opt/run/fsdp_conformance/", "fsdp_conformance/"), ("/opt/run/", ""),
                ("/home/u/", "~/")]
    assert portable_text(text, prefixes) == text
    # the same text made absolute, where a path starts, is rewritten (torch's file from torch/)
    short = "torch/x.py" if text.startswith(".venv/") else text
    assert portable_text(f'see "/opt/run/{text}"', prefixes) == f'see "{short}"'


def test_a_detail_reads_cause_first_each_rank_once_and_cut_between_lines():
    """report/detail.py: the scheduler and lr blocks before the per-param diffs they cause,
    identical per-rank blocks as one naming the ranks, a known limitation's header first and
    the raw observation after everything, whole lines only."""
    from fsdp_conformance.report.detail import first_lines, readable

    params = "params after resuming differ from uninterrupted training:\n" + "\n".join(
        f"  ['p{i}']: value" for i in range(18))
    groups = "param_groups after loading differ:\n  [0]['lr']: value; expected 0.1, got 0.2"
    detail = "\n\n".join([params, "losses after resuming differ: step 1: 0.5, 0.6",
                          *(f"rank {r}: {groups}" for r in range(3)),
                          "rank 0: scheduler after resuming vs the uninterrupted run: x"])
    out = readable(detail)
    assert out.index("ranks 0, 1, 2: param_groups") < out.index("rank 0: scheduler") \
        < out.index("params after resuming") < out.index("losses after")
    assert out.count("param_groups after loading differ") == 1
    residual = f"known limitation 'k' (m) explains part of this; what it does not explain:\n" \
               f"{params}\n\nrank 0: {groups}\n\nas observed:\n{detail}"
    out = readable(residual)
    assert out.startswith("known limitation 'k'") and out.endswith(detail)
    lines, more = first_lines(out, 5)
    assert len(lines) == 5 and more == len(out.splitlines()) - 5
    info = "rank 0: scheduler after resuming: '_step_count': 5 vs 3 (information: not read)"
    out = readable("\n\n".join([info, params, f"rank 0: {groups}"]))
    assert out.index("param_groups") < out.index("params after") < out.index("(information:")
