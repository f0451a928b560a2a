"""Markers, options and the report, through inner pytest sessions run in this process
(``pytest.main``): they share this session's rank pools, which they leave open."""
from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest

from fsdp_conformance.harness import live_pools
from fsdp_conformance.harness.probes import whoami

_files = itertools.count()


class Outcomes:
    """Counts test outcomes of an inner session, as pytester's ``assert_outcomes`` does."""

    def __init__(self):
        self.counts = Counter()

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or (report.when == "setup" and not report.passed):
            if hasattr(report, "wasxfail"):
                self.counts["xfailed" if report.skipped else "xpassed"] += 1
            else:
                self.counts[report.outcome] += 1


class Inner:
    def __init__(self, ret, outcomes, out, err):
        self.ret, self.outcomes, self.out, self.err = ret, outcomes, out, err

    def assert_outcomes(self, **want):
        got = {k: v for k, v in self.outcomes.items() if v}
        assert got == want, (got, self.out[-3000:])


@pytest.fixture
def run(tmp_path, capsys):
    """Run an inner pytest session on a new test file (pytester's in-process runs would
    restore ``sys.modules`` afterwards, which torch does not survive)."""
    def go(source: str, *args: str) -> Inner:
        f = tmp_path / f"test_inner{next(_files)}.py"
        f.write_text(source)
        capsys.readouterr()
        outcomes = Outcomes()
        ret = pytest.main([str(f), "-p", "no:cacheprovider", "--rootdir", str(tmp_path), *args],
                          plugins=[outcomes])
        cap = capsys.readouterr()
        return Inner(ret, outcomes.counts, cap.out, cap.err)

    return go


MARKED = """
import pytest

@pytest.mark.fsdp(world_sizes=[1, 2, "2->4"])
def test_sizes(fsdp_world_size, fsdp_pool):
    n = fsdp_world_size if isinstance(fsdp_world_size, int) else fsdp_world_size[0]
    assert fsdp_pool.world_size == n
    assert [r[0] for r in fsdp_pool.run(whoami)] == list(range(n))

from fsdp_conformance.harness.probes import whoami

@pytest.mark.fsdp_known("P1", reason="torch gets P1 wrong here", strict=True)
def test_known_plain():
    assert False, "fails as declared"

@pytest.mark.fsdp_known("P1", reason="stale declaration", strict=True)
def test_known_but_passes():
    pass
"""


def test_fsdp_marker_ids_world_size_filter_and_known_marker(run, rank_pool):
    outer = rank_pool(1)
    outer.run(whoami)  # this session's pool, started before the inner session
    res = run(MARKED, "-v", "--fsdp-world-sizes", "1,2", "-rsxX")
    out = res.out
    assert "test_sizes[ws1] PASSED" in out and "test_sizes[ws2] PASSED" in out
    assert "test_sizes[ws2to4] SKIPPED" in out
    assert "world size 2->4 not in --fsdp-world-sizes 1,2" in out
    assert "test_known_plain XFAIL" in out and "known torch limitation P1: torch gets P1 wrong" in out
    assert "test_known_but_passes FAILED" in out  # strict: XPASS(strict) fails
    res.assert_outcomes(passed=2, skipped=1, xfailed=1, failed=1)
    assert outer.alive and outer in live_pools(), "the inner session closed this session's pool"
    assert outer.run(whoami) == [(0, 1, 0)]


ROUNDTRIP = """
from examples.my_model import GatedNet, batch, loss, make_optimizer

def test_rt(fsdp_roundtrip):
    fsdp_roundtrip(GatedNet, batch, plan=["body", "head"], optimizer=make_optimizer,
                   loss=loss, world_sizes=[1, "1->2"], fsdp_version=1)
"""


def test_fsdp_case_reruns_one_case_and_report_is_the_cli_schema(run, tmp_path):
    report = tmp_path / "r.json"
    from examples.my_model import GatedNet, batch, loss, make_optimizer
    from fsdp_conformance.user import user_model

    opt = user_model(GatedNet, batch, plan=["body", "head"], optimizer=make_optimizer,
                     loss=loss).optimizer_name  # make_optimizer, or ~N if another took it
    one = f"fsdp1.sharded/{opt}x2g/GatedNet.body+head/flat/ws1->2/fp64/links2"
    res = run(ROUNDTRIP, "--fsdp-case", one, "--fsdp-report", str(report))
    res.assert_outcomes(passed=1)
    data = json.loads(report.read_text())
    assert data["schema"] == "fsdp-conformance/run/1" and data["ok"] is True
    assert [c["id"] for c in data["cases"]] == [one]
    assert data["world_sizes"] == [1, 2] and data["argv"][0] == "pytest"
    assert data["cases"][0]["properties"]["P3"]["status"] == "pass"
    assert (tmp_path / "r.md").read_text().startswith("#")
    res = run(ROUNDTRIP, "--fsdp-case", "no/such/case")  # a typo does not pass CI
    res.assert_outcomes(skipped=1)
    assert res.ret == 4, res.out[-2000:]
    assert "--fsdp-case matched nothing" in res.out, res.out[-2000:]
    assert "ERROR --fsdp-case 'no/such/case': no case of the tests that ran has this id" \
        in res.out, res.out[-2000:]
    res = run(ROUNDTRIP, "--fsdp-case", one[:-1])  # ...links2 -> ...links
    assert res.ret == 4 and f"did you mean '{one}'" in res.out, res.out[-2000:]


def test_options_are_validated(run):
    for bad, why in ((("--fsdp-world-sizes", "0"), "must be positive"),
                     (("--fsdp-world-sizes", "a"), "comma-separated integers"),
                     (("-o", "fsdp_tier=nightly"), "quick or full")):
        res = run("def test_x(): pass", *bad)
        assert res.ret == pytest.ExitCode.USAGE_ERROR, (bad, res.ret)
        assert why in res.err + res.out, res.err


CONFORMANCE = """
def test_conformance(fsdp_conformance_case, fsdp_case):
    fsdp_case(fsdp_conformance_case)
"""


def test_conformance_matrix_as_pytest_items(run, tmp_path):
    report = tmp_path / "c.json"
    res = run(CONFORMANCE, "--collect-only", "-q", "--fsdp-world-sizes", "1,2")
    ids = [ln for ln in res.out.splitlines() if "::test_conformance[" in ln]
    assert len(ids) > 100 and all("ws3" not in i and "ws4" not in i for i in ids)
    assert any(i.endswith("::test_conformance[fsdp1.full/sgd_momentum/mlp.nested/orig/ws1->2/fp64]")
               for i in ids)
    # golden cases (P12) also match "fsdp1.full and sgd_momentum": keep to the round trips
    res = run(CONFORMANCE, "-k", "fsdp1.full and sgd_momentum and not golden",
              "--fsdp-world-sizes", "1,2",
              "--fsdp-report", str(report))
    res.assert_outcomes(passed=2)
    data = json.loads(report.read_text())
    assert data["summary"]["cases"] == 2 and data["ok"] is True


STEP_TRAINER = """
from examples.crash_consistency import data, make_model, step_load, step_save

def test_trainer(fsdp_roundtrip):
    fsdp_roundtrip(make_model, data, fsdp_version=2, plan=["0"], save_fn=step_save,
                   load_fn=step_load, world_sizes=["2"], links=1)
"""


def test_fsdp_crash_adds_the_crash_cases_to_a_check_of_your_own_save(run, tmp_path):
    """``--fsdp-crash`` is ``crash=True`` for every check of a user's save_fn: one crash case
    (P16) per default kill point beside the round trip; without it, the round trip alone."""
    from fsdp_conformance.user.cases import DEFAULT_CRASHES

    report = tmp_path / "crash.json"
    res = run(STEP_TRAINER, "--fsdp-crash", "--fsdp-report", str(report))
    res.assert_outcomes(passed=1)
    cases = json.loads(report.read_text())["cases"]
    crashed = {c["crash"]: c["properties"]["P16"] for c in cases if c["crash"]}
    assert set(crashed) == set(DEFAULT_CRASHES), sorted(crashed)
    assert all(v["status"] == "pass" and "restored save 1 exactly" in v["detail"]
               for v in crashed.values()), crashed
    plain = [c for c in cases if not c["crash"]]
    assert len(plain) == 1 and plain[0]["properties"]["P16"]["status"] == "n/a"
    report.unlink()
    run(STEP_TRAINER, "--fsdp-report", str(report)).assert_outcomes(passed=1)
    assert [c["crash"] for c in json.loads(report.read_text())["cases"]] == [""]
