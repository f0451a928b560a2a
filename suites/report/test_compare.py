"""``fsdp-conformance compare``: every verdict classification, timings against the threshold
and the noise of both runs, memory growth, scaling, benchmark reports, schema errors and the
exit codes through ``fsdp_conformance.cli.main``. Synthetic reports (real Cases, real
Verdicts, ``build_report``) and the committed baseline; no rank pool."""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from fsdp_conformance.cases import Case
from fsdp_conformance.cli import main as cli_main
from fsdp_conformance.known.entries import KNOWN
from fsdp_conformance.properties.verdict import Verdict, error, fail, na, passed
from fsdp_conformance.report.diff import (BENCH_SCHEMA, MIN_MEMORY_DELTA_BYTES, Thresholds,
                                          classify_status, compare_benches, compare_files,
                                          compare_runs, render_markdown, render_text)
from fsdp_conformance.report.run_report import CaseResult, ReportFormatError, build_report

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "reports" / "baseline-quick-torch2.13.0-cpu.json"
KEY, KEY2 = KNOWN[0].key, KNOWN[1].key
MiB = 1 << 20

A = Case(api="fsdp1.full")
B = Case(api="fsdp1.full", optimizer="sgd", world_size=1)
C = Case(api="fsdp2.sharded", use_orig_params=True, world_size=3)
D = Case(api="fsdp2.sharded", optimizer="adagrad")


def make_report(results: list[CaseResult]) -> dict:
    return build_report(results, tier="quick", backend="gloo", seed=0, world_sizes=[1, 2, 3],
                        wall_time_s=3.0, argv=["fsdp-conformance", "run"])


def base_results() -> list[CaseResult]:
    return [
        CaseResult(A, {"P0": passed(), "P1": passed(), "P2": fail("lr off"), "P3": passed(),
                       "P4": Verdict("known", "aliasing", KEY), "P5": passed(),
                       "P6": passed(), "P7": na("n/a reason"), "P8": Verdict("known", "x", KEY),
                       "P9": error("boom"), "P10": passed()}),
        CaseResult(B, {"P0": passed(), "P1": passed()}),
        CaseResult(C, {"P0": passed()}),
    ]


def new_results() -> list[CaseResult]:
    return [
        CaseResult(A, {"P0": passed(), "P1": fail("exp_avg differs"), "P2": passed(),
                       "P3": Verdict("known", "aliasing", KEY), "P4": Verdict("pass", "", KEY),
                       "P5": na("skipped now"), "P6": error("harness"), "P7": passed(),
                       "P8": Verdict("known", "y", KEY2), "P9": fail("still bad"),
                       "P11": passed()}),
        CaseResult(B, {"P0": passed(), "P1": passed()}),
        CaseResult(D, {"P0": passed()}),
    ]


def _by(cmp, subject: str, item: str):
    got = [c for c in cmp.changes if c.subject == subject and c.item == item]
    assert len(got) == 1, (subject, item, cmp.changes)
    return got[0]


@pytest.mark.parametrize("base,new,label", [
    ("pass", "fail", "newly failing"), ("known", "error", "newly failing"),
    ("n/a", "fail", "newly failing"), ("pass", "known", "newly known"),
    ("pass", "n/a", "no longer checked"), ("fail", "pass", "newly passing"),
    ("error", "pass", "newly passing"), ("known", "pass", "known fixed"),
    ("n/a", "pass", "newly checked"), ("n/a", "known", "newly checked"),
    ("fail", "error", "changed"), ("fail", "known", "changed"), ("known", "n/a", "changed"),
    ("pass", "pass", None), ("fail", "fail", None), ("n/a", "n/a", None),
])
def test_classify_status_table(base, new, label):
    assert classify_status({"status": base, "known": KEY if base == "known" else ""},
                           {"status": new, "known": KEY if new == "known" else ""}) == label


def test_known_with_another_key_is_newly_known():
    assert classify_status({"status": "known", "known": KEY},
                           {"status": "known", "known": KEY2}) == "newly known"
    assert classify_status({"status": "known", "known": KEY},
                           {"status": "known", "known": KEY}) is None


def test_run_reports_every_classification_and_regression_flag():
    cmp = compare_runs(make_report(base_results()), make_report(new_results()))
    expect = {
        (A.id, "P1"): ("newly failing", True), (A.id, "P2"): ("newly passing", False),
        (A.id, "P3"): ("newly known", True), (A.id, "P4"): ("known fixed", False),
        (A.id, "P5"): ("no longer checked", True), (A.id, "P6"): ("newly failing", True),
        (A.id, "P7"): ("newly checked", False), (A.id, "P8"): ("newly known", True),
        (A.id, "P9"): ("changed", False), (A.id, "P10"): ("missing in NEW", True),
        (A.id, "P11"): ("added in NEW", False), (C.id, ""): ("missing in NEW", True),
        (D.id, ""): ("added in NEW", False),
    }
    got = {(c.subject, c.item): (c.label, c.regression) for c in cmp.changes}
    assert got == expect
    assert cmp.regressed and len(cmp.regressions) == 7
    assert _by(cmp, A.id, "P1").detail == "exp_avg differs"
    assert _by(cmp, A.id, "P8").base == f"known ({KEY})" and _by(cmp, A.id, "P8").new == f"known ({KEY2})"
    # regressions first, then improvements, known fixed, info
    cats = [c.category for c in cmp.changes]
    assert cats == sorted(cats, key=["regression", "improvement", "known fixed", "info"].index)
    text = render_text(cmp)
    assert text.splitlines()[-1].startswith("REGRESSION: 7 regressions (")
    assert "Known limitations fixed (1):" in text and "known fixed: " + A.id + "  P4" in text


def test_a_property_added_since_base_ran_is_one_note_where_it_is_na():
    """A property the catalogue gained after BASE ran (P16) is n/a in every case both runs
    have: one note, not a change per case; where NEW decides it, it is listed."""
    base = make_report([CaseResult(A, {"P0": passed()}), CaseResult(B, {"P0": passed()})])
    new = make_report([CaseResult(A, {"P0": passed(), "P16": na("not a crash case")}),
                       CaseResult(B, {"P0": passed(), "P16": fail("a mix")})])
    cmp = compare_runs(base, new)
    assert [(c.subject, c.item, c.label) for c in cmp.changes] == [
        (B.id, "P16", "added in NEW")]
    assert ("P16 is not in BASE's run (added since): n/a in 1 case(s) both runs have, not "
            "listed") in cmp.notes


def test_same_report_no_changes():
    r = make_report(base_results())
    cmp = compare_runs(r, copy.deepcopy(r))
    assert cmp.changes == () and not cmp.regressed
    assert cmp.verdict_line() == "OK: no changes"


# --- timings -------------------------------------------------------------------------------

def meas(time_s: float, floor_s: float, spread: float = 0.0, *, peaks=(4 * MiB, 2 * MiB),
         repeats: int = 5) -> dict:
    """A contract-1 measurement whose repeats lie in [min, min * (1 + spread)]."""
    times = [time_s * (1 + spread * i / (repeats - 1)) for i in range(repeats)]
    floors = [floor_s * (1 + spread * i / (repeats - 1)) for i in range(repeats)]
    return {"time_s": time_s, "times_s": times, "floor_s": floor_s, "floor_times_s": floors,
            "floor": "all_gather + copy", "ratio": time_s / floor_s, "time_bound_s": 10 * time_s,
            "peak_bytes": list(peaks), "mem_bound_bytes": [64 * MiB] * len(peaks),
            "state_bytes": 4 * MiB, "world_size": len(peaks)}


def with_measurements(report: dict, case_id: str, **phases: dict) -> dict:
    r = copy.deepcopy(report)
    next(c for c in r["cases"] if c["id"] == case_id)["measurements"] = phases
    return r


def _timing_cmp(base_m: dict, new_m: dict, **th) -> list:
    r = make_report([CaseResult(A, {"P0": passed()})])
    cmp = compare_runs(with_measurements(r, A.id, save=base_m),
                       with_measurements(r, A.id, save=new_m), Thresholds(**th))
    return [(c.label, c.item) for c in cmp.changes]


def test_three_times_slower_ratio_is_flagged_even_with_noise():
    assert _timing_cmp(meas(0.020, 0.010, 0.2), meas(0.060, 0.010, 0.2)) == [("slower", "save time")]


def test_slowdown_within_noise_is_not_flagged():
    # 1.2x slower with a 1.1 threshold: repeats spread 20% on both sides -> within noise
    assert _timing_cmp(meas(0.020, 0.010, 0.2), meas(0.024, 0.010, 0.2), max_slowdown=1.1) == []
    # the same 1.2x with tight repeats is beyond noise and threshold
    assert _timing_cmp(meas(0.020, 0.010), meas(0.024, 0.010), max_slowdown=1.1) == [
        ("slower", "save time")]
    # and under the default 1.5 threshold it is not a regression at all
    assert _timing_cmp(meas(0.020, 0.010), meas(0.024, 0.010)) == []


def test_tiny_absolute_slowdown_is_not_flagged():
    # 3x the ratio, but 0.5 ms -> 1.5 ms: below MIN_TIME_DELTA_S
    assert _timing_cmp(meas(0.0005, 0.0005), meas(0.0015, 0.0005)) == []


def test_slower_machine_is_not_a_slowdown():
    # time and floor both 3x: the ratio to the floor is unchanged
    assert _timing_cmp(meas(0.020, 0.010), meas(0.060, 0.030)) == []


def test_faster_is_an_improvement():
    cmp_labels = _timing_cmp(meas(0.060, 0.010), meas(0.020, 0.010))
    assert cmp_labels == [("faster", "save time")]


def test_memory_growth_threshold_and_absolute_floor():
    assert _timing_cmp(meas(0.02, 0.01, peaks=(10 * MiB, 2 * MiB)),
                       meas(0.02, 0.01, peaks=(25 * MiB, 2 * MiB))) == [("more memory", "save memory")]
    # 10% growth: under the 1.2 threshold
    assert _timing_cmp(meas(0.02, 0.01, peaks=(10 * MiB,)), meas(0.02, 0.01, peaks=(11 * MiB,))) == []
    # 6x but only 500 KiB more: under the absolute floor
    small = MIN_MEMORY_DELTA_BYTES // 2
    assert _timing_cmp(meas(0.02, 0.01, peaks=(100_000,)),
                       meas(0.02, 0.01, peaks=(100_000 + small,))) == []
    # a looser threshold lets 2.5x pass
    assert _timing_cmp(meas(0.02, 0.01, peaks=(10 * MiB,)), meas(0.02, 0.01, peaks=(25 * MiB,)),
                       max_memory_growth=3.0) == []


def test_memory_detail_names_the_rank():
    r = make_report([CaseResult(A, {"P0": passed()})])
    cmp = compare_runs(with_measurements(r, A.id, load=meas(0.02, 0.01, peaks=(2 * MiB, 2 * MiB))),
                       with_measurements(r, A.id, load=meas(0.02, 0.01, peaks=(2 * MiB, 8 * MiB))))
    (c,) = cmp.changes
    assert c.label == "more memory" and c.item == "load memory" and c.regression
    assert "rank 1: 2.00 MiB -> 8.00 MiB (x4.00)" in c.detail and "rank 0" not in c.detail


def _calibrated(exponent: float, status: str = "pass") -> dict:
    s = _scaling(exponent, status=status)
    s["fsdp1.full/save"]["allowed_excess"] = 1.5
    return s


def _scaling(exponent: float, floor_exponent: float = 1.0, status: str = "pass") -> dict:
    return {"fsdp1.full/save": {"world_sizes": [1, 2, 3, 4], "times_s": [0.01] * 4,
                                "floor_times_s": [0.01] * 4, "exponent": exponent,
                                "floor_exponent": floor_exponent, "status": status,
                                "detail": f"exponent {exponent}"}}


@pytest.mark.parametrize("base,new,labels", [
    (_scaling(1.0), _scaling(1.05), []),                              # noise
    (_scaling(1.0), _scaling(2.0), ["scaling worse"]),                # 4**1 = 4x at ws 4
    (_scaling(1.0), _scaling(1.1, status="fail"), ["scaling worse"]),  # P13 decided fail
    (_scaling(2.0), _scaling(1.0), ["scaling better"]),
    (_scaling(1.0), {}, ["missing in NEW"]),
    # calibrated (bounds): the status decides, a move within the allowance is information
    (_calibrated(1.0), _calibrated(2.0), ["scaling changed"]),
    (_calibrated(1.0), _calibrated(2.0, status="fail"), ["scaling worse"]),
])
def test_scaling(base, new, labels):
    r = make_report([CaseResult(A, {"P0": passed()})])
    b, n = copy.deepcopy(r), copy.deepcopy(r)
    b["scaling"], n["scaling"] = base, new
    cmp = compare_runs(b, n)
    assert [c.label for c in cmp.changes] == labels
    assert cmp.regressed == any(lab in ("scaling worse", "missing in NEW") for lab in labels)


# --- benchmark reports ---------------------------------------------------------------------

def bench(entries: dict[str, tuple[float, float, float | None, list[int] | None]]) -> dict:
    """A contract-2 benchmark report: name -> (min, median, floor_median_s, peak_bytes)."""
    benchmarks = []
    for name, (mn, med, floor, peaks) in entries.items():
        extra = {"path": "fsdp1.full", "phase": "save", "world_size": 2}
        if floor is not None:
            extra["floor_median_s"] = floor
        if peaks is not None:
            extra["peak_bytes"] = peaks
        benchmarks.append({"name": name, "fullname": f"bench::{name}", "group": "g", "params": {},
                           "stats": {"min": mn, "max": med * 1.5, "mean": med, "median": med,
                                     "stddev": 0.0, "rounds": 5, "iqr": 0.0, "q1": mn, "q3": med,
                                     "ops": 1 / med}, "extra_info": extra})
    return {"schema": BENCH_SCHEMA, "machine_info": {"node": "vm", "torch_version": "2.13.0+cpu"},
            "commit_info": {"id": "abc"}, "datetime": "2026-01-01T00:00:00+00:00",
            "version": "0.1.0", "benchmarks": benchmarks}


def test_bench_reports_matched_by_name():
    base = bench({"a": (0.010, 0.011, 0.005, [10 * MiB]), "b": (0.010, 0.011, 0.005, None),
                  "c": (0.010, 0.011, None, None), "gone": (0.01, 0.01, None, None)})
    new = bench({"a": (0.010, 0.011, 0.005, [30 * MiB]), "b": (0.035, 0.036, 0.005, None),
                 "c": (0.035, 0.036, None, None), "new": (0.01, 0.01, None, None)})
    cmp = compare_benches(base, new)
    got = {(c.subject, c.label) for c in cmp.changes}
    assert got == {("a", "more memory"), ("b", "slower"), ("c", "slower"),
                   ("gone", "missing in NEW"), ("new", "added in NEW")}
    assert cmp.regressed and cmp.kind == "bench"
    assert "time / floor" in _by(cmp, "b", "time").detail
    assert "no floor" in _by(cmp, "c", "time").detail


def test_bench_floor_normalises_and_noise_hides():
    base = bench({"a": (0.010, 0.011, 0.005, None)})
    # everything (floor too) 3.5x slower: a slower machine, not a slower path
    assert compare_benches(base, bench({"a": (0.035, 0.036, 0.0175, None)})).changes == ()
    # 2x but the base's median was 2x its min: within noise
    assert compare_benches(bench({"a": (0.010, 0.020, 0.005, None)}),
                           bench({"a": (0.020, 0.022, 0.005, None)})).changes == ()


# --- files, schemas, exit codes ------------------------------------------------------------

def _write(tmp_path: Path, name: str, data) -> str:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(p)


def test_cli_exit_codes_and_outputs(tmp_path, capsys):
    base = _write(tmp_path, "base.json", make_report(base_results()))
    new = _write(tmp_path, "new.json", make_report(new_results()))
    md, js = tmp_path / "out" / "cmp.md", tmp_path / "out" / "cmp.json"
    assert cli_main(["compare", base, new, "--out", str(tmp_path / "out" / "cmp")]) == 1
    out = capsys.readouterr().out
    assert "Regressions (7):" in out and f"newly failing: {A.id}  P1: pass -> fail" in out
    data = json.loads(js.read_text())
    assert data["schema"] == "fsdp-conformance/compare/1" and data["regression"] is True
    assert data["counts"]["newly failing"] == 2 and data["base"]["path"] == base
    assert md.read_text().startswith("# fsdp-conformance compare: run reports")
    assert "**REGRESSION: 7 regressions" in md.read_text()
    # a dotted name keeps its dots: --out cmp-2.13.0-to-2.15.0 -> cmp-2.13.0-to-2.15.0.{json,md}
    assert cli_main(["compare", base, new, "--out", str(tmp_path / "cmp-2.13.0-to-2.15.0")]) == 1
    capsys.readouterr()
    assert {p.name for p in tmp_path.glob("cmp-2.13*")} == {"cmp-2.13.0-to-2.15.0.json",
                                                           "cmp-2.13.0-to-2.15.0.md"}
    # improvements only -> exit 0
    assert cli_main(["compare", new, new]) == 0
    r = make_report([CaseResult(A, {"P0": fail("x")})])
    fixed = make_report([CaseResult(A, {"P0": passed()})])
    assert cli_main(["compare", _write(tmp_path, "f1.json", r), _write(tmp_path, "f2.json", fixed)]) == 0
    assert "newly passing" in capsys.readouterr().out


def test_comparison_is_deterministic(tmp_path):
    base = _write(tmp_path, "base.json", make_report(base_results()))
    new = _write(tmp_path, "new.json", make_report(new_results()))
    a, b = compare_files(base, new), compare_files(base, new)
    assert a.to_json() == b.to_json() and render_markdown(a) == render_markdown(b)


def test_baseline_against_itself(capsys):
    assert cli_main(["compare", str(BASELINE), str(BASELINE)]) == 0
    out = capsys.readouterr().out
    cases = json.loads(BASELINE.read_text())["summary"]["cases"]
    assert out.rstrip().endswith("OK: no changes") and f"{cases} cases" in out


@pytest.mark.parametrize("content,message", [
    ({"schema": "fsdp-conformance/bench-reference/1", "benchmarks": []},
     "got schema 'fsdp-conformance/bench-reference/1'"),
    ({"schema": "something/else/1"}, "expected a run report"),
    ("not json {", "not valid JSON"),
    ([1, 2], "got a JSON list"),
    ({"schema": "fsdp-conformance/run/2", "cases": []}, "got schema 'fsdp-conformance/run/2'"),
    ({"schema": "fsdp-conformance/run/1", "cases": []}, "missing key 'torch_version'"),
    ({"schema": BENCH_SCHEMA, "benchmarks": [{"name": "a", "stats": {"min": 1.0}}]},
     "benchmark 'a': stats: missing key 'median'"),
])
def test_bad_input_is_a_usage_error_naming_the_file(tmp_path, capsys, content, message):
    bad = _write(tmp_path, "bad.json", content)
    assert cli_main(["compare", str(BASELINE), bad]) == 2
    err = capsys.readouterr().err
    assert bad in err and message in err


def test_malformed_case_is_named(tmp_path, capsys):
    r = make_report(base_results())
    r["cases"][1]["properties"]["P1"]["status"] = "weird"
    bad = _write(tmp_path, "bad.json", r)
    assert cli_main(["compare", bad, bad]) == 2
    assert f"{bad}: case {B.id!r}: P1: status 'weird' is not one of" in capsys.readouterr().err
    del r["cases"][0]["api"]
    bad = _write(tmp_path, "bad2.json", r)
    assert cli_main(["report", bad]) == 2
    assert f"{bad}: case {r['cases'][0]['id']!r}: missing key 'api'" in capsys.readouterr().err


def test_run_against_bench_and_missing_file_and_threshold(tmp_path, capsys):
    b = _write(tmp_path, "bench.json", bench({"a": (0.01, 0.01, None, None)}))
    assert cli_main(["compare", str(BASELINE), b]) == 2
    err = capsys.readouterr().err
    assert "is a benchmark report" in err and "compare two run reports or two benchmark" in err
    assert cli_main(["compare", str(BASELINE), str(tmp_path / "nope.json")]) == 2
    assert "nope.json: cannot read the report" in capsys.readouterr().err
    assert cli_main(["compare", str(BASELINE), str(BASELINE), "--max-slowdown", "0.9"]) == 2
    assert "max_slowdown must be a finite number >= 1.0" in capsys.readouterr().err
    with pytest.raises(ReportFormatError, match="nope.json"):
        compare_files(BASELINE, tmp_path / "nope.json")


def test_refuses_to_write_over_an_input(tmp_path, capsys):
    base = tmp_path / "base.json"
    shutil.copy(BASELINE, base)
    before = base.read_bytes()
    assert cli_main(["compare", str(base), str(BASELINE), "--out", str(base)]) == 2
    err = capsys.readouterr().err
    assert f"--out (.json) {base}: is the input" in err and "refusing to write over it" in err
    # the earlier spellings still work, with a note naming --out
    assert cli_main(["compare", str(BASELINE), str(base), "--json", str(base)]) == 2
    err = capsys.readouterr().err
    assert "--json is an earlier spelling" in err and f"--json {base}: is the input" in err
    assert base.read_bytes() == before


def test_rich_rendering_lists_every_change():
    import io

    from rich.console import Console

    from fsdp_conformance.report.diff import render_rich

    cmp = compare_runs(make_report(base_results()), make_report(new_results()))
    buf = io.StringIO()
    render_rich(cmp, Console(file=buf, width=200, color_system=None))
    out = buf.getvalue()
    assert "Regressions (7)" in out and "Known limitations fixed (1)" in out
    # two table rows and the verdict line
    assert out.count("newly failing") == 3 and "REGRESSION: 7 regressions" in out


def test_a_slice_is_compared_with_the_cases_of_base_its_selection_picks():
    """NEW ran `-k 'fsdp2.sharded and sgd' --bounds off` against the committed full quick
    baseline: BASE's other cases and the bounds fits are outside the slice (one note), not
    hundreds of "missing in NEW"; a case of the slice that NEW lacks is still missing, and
    --case ids and fewer world sizes slice alike. A run of the whole tier says nothing of
    slices."""
    from fsdp_conformance.api_paths import PATH_NAMES
    from fsdp_conformance.selection import compile_keyword

    base = json.loads(BASELINE.read_text())
    pick = compile_keyword("fsdp2.sharded and sgd", PATH_NAMES)
    new = {**copy.deepcopy(base), "selection": "fsdp2.sharded and sgd", "bounds_mode": "off",
           "scaling": {}, "cases": [c for c in base["cases"] if pick(c["id"])
                                    and not c.get("bounds")]}
    cmp = compare_runs(base, new)
    assert not cmp.regressed, render_text(cmp)[:2000]
    assert any(n.startswith("NEW is a slice (-k 'fsdp2.sharded and sgd'") and
               f"{len(base['cases']) - len(new['cases'])} of BASE's" in n for n in cmp.notes)
    gone = new["cases"].pop()
    cmp = compare_runs(base, new)
    assert [(c.label, c.subject) for c in cmp.regressions] == [("missing in NEW", gone["id"])]
    one = {**copy.deepcopy(base), "selected_ids": [gone["id"]], "cases": [gone],
           "bounds_mode": "off", "scaling": {}}
    assert not compare_runs(base, one).regressed
    small = {**copy.deepcopy(base), "world_sizes": [1, 2], "bounds_mode": "off", "scaling": {},
             "cases": [c for c in base["cases"] if not c.get("bounds") and
                       {c["world_size"], c["load_world_size"] or c["world_size"]} <= {1, 2}]}
    assert not compare_runs(base, small).regressed
    assert not any("slice" in n for n in compare_runs(base, base).notes)


def test_the_harness_benchmark_is_comparable_and_another_benchmark_is_refused(tmp_path):
    """bench harness writes the contract compare reads (one benchmark per quantity beside its
    own table); a harness report against a scaling one is refused, naming both."""
    from fsdp_conformance.bench.harness import SCHEMA, benchmarks_of
    from fsdp_conformance.bench.stats import summarize

    def harness(scale: float) -> dict:
        results = [{"world_size": ws, "backend": "gloo",
                    **{k: summarize([scale * 0.001 * (i + 1) for i in range(5)])
                       for k in ("noop_roundtrip", "record_roundtrip", "fsdp_task_pool",
                                 "fsdp_task_spawn_per_task")}} for ws in (1, 2)]
        wire = {"pickle": summarize([0.002] * 3)}
        return {"schema": SCHEMA, "bench": "harness", "machine_info": {"node": "vm"},
                "benchmarks": benchmarks_of(results, wire), "results": results}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(harness(1.0)))
    b.write_text(json.dumps(harness(1.0)))
    cmp = compare_files(a, b)
    assert cmp.kind == "bench" and not cmp.regressed
    assert any("9 benchmark(s) in both reports compared" in n for n in cmp.notes), cmp.notes
    scaling = json.loads(b.read_text())
    del scaling["bench"]  # the scaling benchmark's reports before the field
    b.write_text(json.dumps(scaling))
    with pytest.raises(ReportFormatError, match="is the scaling benchmark but BASE .* the "
                                                "harness one"):
        compare_files(a, b)
