"""The differential tests' one verdict check: pass, or a known torch limitation that fails
exactly as its entry models it (the run's own rules, known/apply.py)."""
from __future__ import annotations

import dataclasses
import json
import os

from fsdp_conformance.known.apply import explain_one
from fsdp_conformance.known.entries import known_all
from fsdp_conformance.properties.expectation import EXACT


def assert_ok(verdict, what, case=None, prop=None, allow_na=False):
    """Pass, or a recorded torch limitation that fails exactly as its model says.

    - A known pair that starts passing fails here as "fixed upstream?", so the record
      cannot go stale; a different failure on a known pair fails as itself.
    - ``verdict`` may be a function that judges the property against the expectation it is
      given (properties/expectation.py): an ``Effect`` model needs it judged again under
      the model.
    - ``allow_na``: "n/a" is accepted (not observable here: another failure stopped the
      path), neither known nor fixed.
    """
    judge = verdict if callable(verdict) else None
    verdict = judge(EXACT) if judge is not None else verdict
    if verdict.status == "n/a" and allow_na:
        return
    entries = known_all(case, prop) if case is not None else []
    if entries:
        keys = [e.key for e in entries]
        assert verdict.status in ("fail", "error"), (
            f"{what}: known limitation(s) {keys} now {verdict.status}: fixed upstream? "
            f"Retire them from fsdp_conformance/known/entries.py\n{verdict.detail}")
        judged = explain_one(case, prop, verdict, judge)
        assert judged.status == "known", (
            f"{what}: fails, but not as known limitation(s) {keys} model it (a second bug "
            f"on the same configuration?):\n{judged.detail}")
        _record(judged.known, case, prop, verdict.detail)
        return
    assert verdict.status == "pass", f"{what} ({prop}): {verdict.status}\n{verdict.detail}"


def _record(key: str, case, prop: str, detail: str) -> None:
    """With ``FSDPC_RECORD_KNOWN=<file>``, append the observation a known entry explained
    (one JSON line: key, case, prop, detail), the source of
    suites/conformance/known_observations.json for the entries only these tests reach."""
    out = os.environ.get("FSDPC_RECORD_KNOWN")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps({"key": key, "case": dataclasses.asdict(case), "prop": prop,
                                "detail": detail}) + "\n")
