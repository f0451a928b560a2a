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


def test_a_declared_known_entry_keeps_its_predicate_and_its_model():
    from fsdp_conformance.properties.verdict import error

    lim = Limitation.of("dcp-drops-empty-optimizer-state")
    raised = 'ValueError: `optim_state_dict` must have the keys "state"to be a valid one'
    sgd = Case(api="fsdp1.sharded", optimizer="sgd", world_size=2)
    assert _status([lim], {"P3": error(raised)}, case=sgd) == {"P3": "known"}
    adam = Case(api="fsdp1.sharded", optimizer="adam", world_size=2)
    assert _status([lim], {"P3": error(raised)}, case=adam) == {"P3": "error"}  # not there
    other = {"P3": error("KeyError: 'brand-new'")}
    assert _status([lim], other, case=sgd) == {"P3": "error"}  # not this entry's exception
    # a wrong-value entry (an Effect model) needs the case judged again, which a declared
    # limitation cannot do: a failure's text alone is never "known" by it
    aliasing = Limitation.of("orig-params-full-osd-aliasing")
    assert _status([aliasing], {"P1": fail("exp_avg differs")}, case=ALIASED) == {"P1": "fail"}


def test_passing_and_na_verdicts_stay_as_they_are():
    lim = Limitation.of("P3", reason="x")
    v = {"P3": Verdict("pass", "fine"), "P4": Verdict("n/a", "why")}
    assert _status([lim], v) == {"P3": "pass", "P4": "n/a"}


def test_a_limitation_needs_a_reason_or_a_known_key():
    with pytest.raises(ValueError, match="needs reason"):
        Limitation.of("P3")
    with pytest.raises(ValueError, match="neither a key"):
        Limitation.of("no-such-entry")


STEP_COUNT_INFO = ("rank 0: scheduler after the load vs at the save: '_step_count': expected 3, "
                   "got 1 (information: LambdaLR does not read it: with it, every group's lr "
                   "over the next 100 steps and every other field are the same)")
LAST_EPOCH = ("rank 0: scheduler after the load vs at the save: 'last_epoch': expected 2, got 1 "
              "(LambdaLR reads it: the lr of group 0 after 1 step(s) would be 0.01 instead of "
              "0.0094)")


def test_a_declaration_explains_only_the_differences_it_names():
    """Declarations are exact models (issue 45): a planted lr off by one step under a
    '_step_count' declaration still fails, naming what the declaration does not explain."""
    lim = Limitation.of("P6,P11", reason="torchtune rebuilds its scheduler",
                        symptom="'_step_count'")
    planted = fail("2 group(s); the scheduler restored\n\n" + LAST_EPOCH + "\n\n"
                   + STEP_COUNT_INFO)
    [v] = apply_declared({"P11": planted}, [lim]).values()
    assert v.status == "fail", v.detail
    assert v.detail.startswith("declared known limitation 'P6,P11' (symptom \"'_step_count'\") "
                               "explains part of this; what it does not explain:\n"
                               + LAST_EPOCH), v.detail
    only = fail("rank 0: scheduler after the load vs at the save: '_step_count': expected 3, "
                "got 1")
    assert _status([lim], {"P11": only}) == {"P11": "known"}


def test_a_symptom_in_a_heading_explains_the_differences_under_it():
    lim = Limitation.of("P7", reason="x", symptom="the save function changed the optimizer state")
    detail = ("rank 0: the save function changed the optimizer state (expected: the state "
              "before saving; got: after):\n1 difference:\n  state['w']: unexpected; expected "
              "<absent>, got {'step': tensor(1.)}")
    assert _status([lim], {"P7": fail(detail)}) == {"P7": "known"}
    other = detail + "\n\nrank 1: loading the same checkpoint twice gives different states:\n" \
        "1 difference:\n  state['w']['exp_avg']: value; expected 0.1, got 0.2"
    assert _status([lim], {"P7": fail(other)}) == {"P7": "fail"}
    # a heading explains only the indented lines under it, not a later line of its own
    later = detail + ("\n\nrank 0: scheduler after the load vs at the save: 'last_epoch': "
                      "expected 2, got 1")
    assert _status([lim], {"P7": fail(later)}) == {"P7": "fail"}
