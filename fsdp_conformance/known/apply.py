"""Known torch limitations applied to a case's verdicts (entries: known/entries.py).

Rules, per property:
- a "fail" is "known" when an entry applies to the case and property and its symptom (if
  any) is in the detail;
- an "error" (an exception, a dead or stuck rank) is "known" only when an entry's symptom
  names it, so a new crash is never hidden behind an entry about wrong values;
- a failure of the suite itself (``Verdict.origin == "suite"``) never is;
- a pass of an entry's primary property is marked "fixed upstream?" (retire the entry).
Then every other property that failed with the very same detail (one root cause: the save
or the load raised) is "known" under the entry of the primary property.
"""
from __future__ import annotations

from ..cases import Case
from ..properties.verdict import Verdict
from .entries import known_all


def apply_known(case: Case, verdicts: dict[str, Verdict]) -> dict[str, Verdict]:
    """``verdicts`` with the known torch limitations applied (module rules)."""
    out = {}
    for prop, v in verdicts.items():
        suite_bug = v.origin == "suite"
        k = next((e for e in known_all(case, prop)
                  if v.status == "pass" or (v.status == "fail" and e.matches(v.detail))
                  or (v.status == "error" and e.symptom and e.matches(v.detail))), None)
        if k is not None and v.status in ("fail", "error") and not suite_bug:
            v = Verdict("known", f"{k.reason}\nupstream: {k.upstream}\n\n{v.detail}", k.key)
        elif k is not None and v.status == "pass" and k.primary(prop):
            v = Verdict("pass", f"fixed upstream? known limitation {k.key!r} did not "
                                f"reproduce. {v.detail}", k.key)
        out[prop] = v
    primary = {p: v.status == "known" and any(e.key == v.known and e.primary(p)
                                             for e in known_all(case, p))
               for p, v in out.items()}
    root: dict[str, Verdict] = {}
    for p, v in out.items():  # P0..P15 in order; an entry's primary property names the cause
        if primary[p]:
            root.setdefault(verdicts[p].detail, v)
    for p, v in verdicts.items():
        k = root.get(v.detail)
        if k is not None and v.status in ("fail", "error") and not primary[p] and v.origin != "suite":
            out[p] = Verdict("known", k.detail, k.known)
    return out
