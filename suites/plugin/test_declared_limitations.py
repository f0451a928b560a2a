"""Declared limitations follow the run's rules for known ones (issue 15): an error only by a
declared exception pattern, a known entry only where its predicate applies, a suite failure
never. Unit level: no ranks."""
from __future__ import annotations

import pytest

from fsdp_conformance.cases import Case
from fsdp_conformance.properties.verdict import Verdict, error, fail, suite_error
from fsdp_conformance.user.limitations import Limitation, apply_declared

ALIASED = Case(api="fsdp1.full", optimizer="adam", use_orig_params=True, world_size=2)


def _status(declared, verdicts, case=None):
    return {p: v.status for p, v in apply_declared(verdicts, declared, case=case).items()}


def test_an_error_is_covered_only_by_a_declared_pattern():
    wide = Limitation.of("P3", reason="our loader is wrong on P3")
    assert _status([wide], {"P3": fail("state['w']: differs")}) == {"P3": "known"}
    crash = {"P3": error("load side failed: RuntimeError: brand-new crash")}
    assert _status([wide], crash) == {"P3": "error"}  # a crash is not "wrong values"
    pattern = Limitation.of("P3", reason="x", symptom="KeyError: 'lr' || ValueError: bad")
    assert _status([pattern], {"P3": error("... KeyError: 'lr'")}) == {"P3": "known"}
    assert _status([pattern], {"P3": error("... ValueError: bad group")}) == {"P3": "known"}
    assert _status([pattern], crash) == {"P3": "error"}


def test_a_suite_failure_is_never_covered():
    lim = Limitation.of("P3", reason="x", symptom="KeyError")
    assert _status([lim], {"P3": suite_error("the suite failed: KeyError")}) == {"P3": "error"}


def test_a_declared_known_entry_keeps_its_predicate():
    lim = Limitation.of("orig-params-full-osd-aliasing")
    v = {"P1": fail("exp_avg differs")}
    assert _status([lim], v, case=ALIASED) == {"P1": "known"}
    flat = Case(api="fsdp1.full", optimizer="adam", use_orig_params=False, world_size=2)
    assert _status([lim], v, case=flat) == {"P1": "fail"}  # the entry does not apply there
    sgd = Case(api="fsdp1.full", optimizer="sgd", use_orig_params=True, world_size=2)
    assert _status([lim], v, case=sgd) == {"P1": "fail"}


def test_passing_and_na_verdicts_stay_as_they_are():
    lim = Limitation.of("P3", reason="x")
    v = {"P3": Verdict("pass", "fine"), "P4": Verdict("n/a", "why")}
    assert _status([lim], v) == {"P3": "pass", "P4": "n/a"}


def test_a_limitation_needs_a_reason_or_a_known_key():
    with pytest.raises(ValueError, match="needs reason"):
        Limitation.of("P3")
    with pytest.raises(ValueError, match="neither a key"):
        Limitation.of("no-such-entry")
