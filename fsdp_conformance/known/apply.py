"""Known torch limitations applied to a case's verdicts (entries: known/entries.py; models:
known/model.py).

Rules, per property whose verdict is "fail" or "error" (never one of the suite's own,
``Verdict.origin == "suite"``):
- an entry that applies to the case and property and whose model explains the verdict
  makes it "known": a ``Raises`` / ``Outcome`` model by the detail; an
  ``Effect`` model when the property passes once the case is judged again under it
  (``modelled``, computed by the case's kind with :func:`rejudge`);
- when several ``Effect`` entries apply, their composition is tried too ("a+b");
- an ``Effect`` entry under which the property still fails leaves a "fail" whose detail is
  the residual diff and names the entry (``Verdict.known``): the entry explained the rest,
  not this; unless another entry that applies there explains that residual by its own
  model (two bugs meet on one case; every applicable effect's residual is tried), when it
  is "known";
- an error explained by a ``Raises`` entry of a primary property carries to every other
  property that failed with the very same detail (one root cause: the save or the load
  raised);
- a pass of an entry's primary property is marked "fixed upstream?" (retire the entry).

A user's own save/load code (:func:`recognise`) goes through torch's APIs by a path the
suite does not know; there ``Effect`` and ``Raises`` entries count (not ``Outcome``), and
only as a whole, seen as one of the built-in paths the code could have taken:
- an ``Effect`` entry (or a composition) under which every failing property passes (or
  fails with exactly a ``Raises`` entry's exception, raised in its torch function: two bugs
  meet) and every other decided one stays pass (or n/a) makes the failing ones "known" (its
  exact effect and nothing more);
- else a ``Raises`` entry that names its raising torch functions (``where``) makes them
  "known" when every failing property's detail is that entry's exception (its type,
  message and a traceback frame in one of those functions; one save or load that raised
  fails every later property with the same detail), the entry applying to at least one
  property that failed with it;
anything else stays a fail.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

from ..cases import Case
from ..properties.expectation import Expectation
from ..properties.verdict import Verdict
from .entries import KnownLimitation, known_all
from .model import Effect, Raises, observation_digest

Judge = Callable[[Expectation], Mapping[str, Verdict]]
"""Judges the case's recorded observations again, against the expectation it is given
(properties/expectation.py; ``EXACT``: the correct result)."""


def _effects(case: Case, verdicts: Mapping[str, Verdict]) -> list[KnownLimitation]:
    """Entries with an ``Effect`` model that apply to a property that failed."""
    out: list[KnownLimitation] = []
    for p, v in verdicts.items():
        if v.status not in ("fail", "error") or v.origin == "suite":
            continue
        for e in known_all(case, p):
            if isinstance(e.model, Effect) and e not in out:
                out.append(e)
    return out


def expectation_of(case: Case, entries: list[KnownLimitation]) -> Expectation:
    """The expectation under the entries' effects, each channel composed in the order given
    (properties/expectation.py ``Expectation``)."""
    return Expectation(key="+".join(e.key for e in entries),
                       effects=tuple(e.model for e in entries), case=case)


def rejudge(case: Case, verdicts: Mapping[str, Verdict], judge: Judge
            ) -> dict[str, dict[str, Verdict]]:
    """The verdicts under each applicable ``Effect`` entry, and under all of them composed
    when there are several: ``{expectation key: {prop: verdict}}``. A judge that raises
    under a model (the model does not fit what was observed) gives no verdicts for it."""
    entries = _effects(case, verdicts)
    tries = [[e] for e in entries] + ([entries] if len(entries) > 1 else [])
    out: dict[str, dict[str, Verdict]] = {}
    for group in tries:
        exp = expectation_of(case, group)
        try:
            out[exp.key] = dict(judge(exp))
        except Exception:  # noqa: BLE001  (the model cannot even be applied: explains nothing)
            continue
    return out


def _known(k: KnownLimitation, detail: str) -> Verdict:
    return Verdict("known", f"{k.reason}\nmodel: {k.model.describe()}\nupstream: {k.upstream}"
                            f"\n\n{detail}", k.key, digest=observation_digest(detail, k.model))


def _explain(prop: str, v: Verdict, entries: list[KnownLimitation],
             modelled: Mapping[str, Mapping[str, Verdict]]) -> Verdict:
    """``v`` (a torch fail or error) as the module rules judge it."""
    residuals: list[tuple[KnownLimitation, Verdict]] = []
    for k in entries:
        if isinstance(k.model, Effect):
            mv = modelled.get(k.key, {}).get(prop)
            if mv is None:
                continue
            if mv.status == "pass":
                return _known(k, v.detail)
            if mv.status in ("fail", "error"):
                residuals.append((k, mv))
        elif k.model.explains(v.detail):
            return _known(k, v.detail)
    effects = [k for k in entries if isinstance(k.model, Effect)]
    for key, mvs in modelled.items():  # several effects together
        mv = mvs.get(prop)
        if "+" in key and effects and mv is not None and mv.status == "pass":
            k = next((e for e in effects if e.key in key.split("+")), effects[0])
            return _known(k, v.detail + f"\n(explained by {key} together)")
    for k, mv in residuals:  # two bugs meet: what one leaves is exactly another's
        other = next((e for e in entries if e is not k and not isinstance(e.model, Effect)
                      and e.model.explains(mv.detail)), None)
        if other is not None:
            return _known(k, v.detail + f"\n(what {k.key!r} leaves is exactly {other.key!r}: "
                                        f"{other.model.describe()})")
    if residuals:
        k, mv = residuals[0]
        return Verdict(v.status if mv.status == "error" else "fail",
                       f"known limitation {k.key!r} ({k.model.describe()}) explains part of "
                       f"this; what it does not explain:\n{mv.detail}\n\nas observed:\n"
                       f"{v.detail}", k.key)
    return v


def apply_known(case: Case, verdicts: dict[str, Verdict],
                modelled: Mapping[str, Mapping[str, Verdict]] | None = None
                ) -> dict[str, Verdict]:
    """``verdicts`` with the known torch limitations applied (module rules); ``modelled``:
    :func:`rejudge`'s verdicts (none: ``Effect`` entries explain nothing)."""
    modelled = modelled or {}
    out = {}
    for prop, v in verdicts.items():
        entries = known_all(case, prop)
        if v.status in ("fail", "error") and v.origin != "suite" and entries:
            v = _explain(prop, v, entries, modelled)
        elif v.status == "pass":
            k = next((e for e in entries if e.primary(prop)), None)
            if k is not None:
                v = Verdict("pass", f"fixed upstream? known limitation {k.key!r} did not "
                                    f"reproduce. {v.detail}", k.key)
        out[prop] = v
    primary = {p: v.status == "known" and any(
                   e.key == v.known and e.primary(p) and not isinstance(e.model, Effect)
                   for e in known_all(case, p))
               for p, v in out.items()}
    root: dict[str, Verdict] = {}
    for p, v in out.items():  # P0..P16 in order; an entry's primary property names the cause
        if primary[p]:
            root.setdefault(verdicts[p].detail, v)
    for p, v in verdicts.items():
        k = root.get(v.detail)
        if k is not None and v.status in ("fail", "error") and not primary[p] and v.origin != "suite":
            out[p] = Verdict("known", k.detail, k.known, digest=k.digest)
    return out


def explain_one(case: Case, prop: str, verdict: Verdict,
                judge: Callable[[Expectation], Verdict] | None = None) -> Verdict:
    """One property's verdict with the known limitations applied by the module rules
    (``judge``: judges that property again against the expectation it is given; without it
    an ``Effect`` entry explains nothing). The differential tests use it."""
    single = {prop: verdict}
    modelled = rejudge(case, single, lambda exp: {prop: judge(exp)}) if judge is not None else {}
    return apply_known(case, single, modelled)[prop]


def _raises_in_torch(view: Case, props: Sequence[str], detail: str) -> KnownLimitation | None:
    """The first ``Raises`` entry of ``props`` on ``view`` that explains ``detail`` and names
    the torch function raising (``where``): the same message from a user's own code is the
    user's."""
    return next((e for p in props for e in known_all(view, p)
                 if isinstance(e.model, Raises) and e.model.where
                 and e.model.explains(detail)), None)


def _left_by(view: Case, verdicts: Mapping[str, Verdict], failing: Sequence[str],
             modelled: Mapping[str, Verdict]) -> dict[str, KnownLimitation] | None:
    """Whether an ``Effect`` model explains a user's verdicts (``modelled``: them judged
    again under it): every failing property passes under it (one that errored may be n/a
    there: the model leaves it nothing to judge, as a broken tie leaves a param with no
    partial state), or fails there with exactly a ``Raises`` entry's exception raised in
    its torch function (two bugs meet: what one leaves is the other's), and every other
    decided property stays pass or n/a. The
    ``Raises`` entries that explain what is left, by property; None: not explained. An
    effect under which every failing property fails exactly as observed explains nothing
    (what is left is all the other entry's, which the ``Raises`` rule names on its own)."""
    if not any(modelled.get(p) is not None and (modelled[p].status == "pass"
                                                or modelled[p].detail != verdicts[p].detail)
               for p in failing):
        return None
    rest: dict[str, KnownLimitation] = {}
    for p in verdicts:
        if verdicts[p].status == "n/a":
            continue
        m = modelled.get(p)
        if m is None:
            return None
        if m.status == "pass" or (m.status == "n/a" and (
                p not in failing or verdicts[p].status == "error")):
            continue  # an error where the model has nothing to judge: the effect's doing
        other = _raises_in_torch(view, (p,), m.detail) \
            if p in failing and m.status in ("fail", "error") else None
        if other is None:
            return None
        rest[p] = other
    return rest


def recognise(case: Case, apis: Sequence[str], verdicts: Mapping[str, Verdict], judge: Judge
              ) -> dict[str, Verdict]:
    """A user's own path's ``verdicts`` with a known torch limitation recognised by its
    model (module rules): for each built-in path in ``apis``, the ``Effect`` entries that
    apply to the case seen as that path are tried; the first under which every property of
    ``verdicts`` passes makes the failing ones "known", naming it and the path. Failing
    that, the first path whose ``Raises`` entries explain every failing detail does."""
    failing = [p for p, v in verdicts.items()
               if v.status in ("fail", "error") and v.origin != "suite"]
    if not failing:
        return dict(verdicts)
    for api in apis:
        view = dataclasses.replace(case, api=api)
        for key, mv in rejudge(view, verdicts, judge).items():
            rest = _left_by(view, verdicts, failing, mv)
            if rest is None:
                continue
            k = next(e for e in _effects(view, verdicts) if e.key == key.split("+")[0])
            together = f" ({key})" if "+" in key else ""
            meets = "".join(sorted({f"; what it leaves is exactly {o.key!r}: {o.model.describe()}"
                                    for o in rest.values()}))
            why = (f"\n(your code's effect is exactly this entry's{together}, as through the "
                   f"built-in path {api}{meets})")
            return {p: _known(k, v.detail + why) if p in failing else v
                    for p, v in verdicts.items()}
    for api in apis:
        view = dataclasses.replace(case, api=api)
        by_detail: dict[str, KnownLimitation] = {}
        for detail in {verdicts[p].detail for p in failing}:
            props = [p for p in failing if verdicts[p].detail == detail]
            k = _raises_in_torch(view, props, detail)
            if k is None:
                break
            by_detail[detail] = k
        else:
            why = (f"\n(your code raised exactly this entry's exception, as through the "
                   f"built-in path {api})")
            return {p: _known(by_detail[v.detail], v.detail + why) if p in failing else v
                    for p, v in verdicts.items()}
    return dict(verdicts)
