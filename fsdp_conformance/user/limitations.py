"""Torch limitations a caller declares for a test (``Limitation``, the plugin's
``fsdp_known`` marker, ``check(known=...)``), and how verdicts meet them.

Rules
- Verdicts go through ``known/entries.py`` first (a user optimizer counts as the zoo
  optimizer of the same class for matching: ``known_view``), then through the declared
  limitations, by the rules of known/apply.py: a "fail" is covered when its detail shows
  the declared symptom (any of its ``" || "``-separated parts) and the symptom explains
  every difference in it (``unexplained``: each line that says what was expected names it,
  or stands under a heading that does); one the symptom explains only in part stays a
  failure that lists what the declaration does not explain, so a second bug never hides
  behind a declared one. No symptom declared: any failure of the declared properties. An
  "error" (an exception, a dead or stuck rank) is covered only when a declared symptom names
  it, so a new crash is never hidden behind a limitation about wrong values; a failure of
  the suite itself never. A limitation taken from a known entry keeps
  the entry's predicate: it covers only the configurations the entry applies to.
- A covered verdict becomes "known"; a strict limitation that matches nothing fails the
  check ("fixed upstream?").

No torch at import: the plugin reads ``fsdp_known`` markers while it collects.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..properties.verdict import Verdict
from .spec import PROPERTY_NAMES
from ..known.declared import DECLARED


def symptom_matches(symptom: str, detail: str) -> bool:
    """Whether ``detail`` shows a user-declared ``symptom``: any of its ``" || "``-separated
    parts occurs in it; an empty symptom matches every detail (``covers`` decides what that
    may cover)."""
    return not symptom or any(part in detail for part in symptom.split(" || "))


def unexplained(symptom: str, detail: str) -> list[str]:
    """The differences in a failure's ``detail`` that a declared ``symptom`` does not name:
    every line that says what was expected (a diff item, a scheduler field, a step) is a
    difference, explained when it or the heading it stands under shows the symptom. A
    heading is an unindented line that ends with ':'; the lines under it are the indented
    ones that follow it (after the difference count; a blank or another unindented line
    ends it), so a heading never explains a later line of its own. Information and likely causes are no differences. An
    empty symptom explains everything (the declaration is that wide)."""
    if not symptom:
        return []
    parts = symptom.split(" || ")
    out, heading = [], ""
    for line in detail.splitlines():
        text = line.strip()
        if re.fullmatch(r"\d+ differences?:", text):
            continue  # the count under a heading: the block goes on
        indented = line[:1].isspace()
        if not indented:
            heading = ""  # an unindented line (or a blank one) ends the heading's block
        if not text or text.startswith("likely cause:") or "(information:" in text:
            continue
        if "expected" in text.lower() and not any(p in line or p in heading for p in parts):
            out.append(text)
        if not indented and text.endswith(":"):
            heading = line
    return out

if TYPE_CHECKING:
    from ..cases import Case
    from .model import UserModel


@dataclass(frozen=True)
class Limitation:
    """A torch limitation declared by the caller for a test. Build it with
    :meth:`Limitation.of`."""

    key: str
    """A key of ``known/entries.py``, or the declared property ids joined by commas."""
    props: tuple[str, ...]
    """The property ids whose failing (or erroring) verdicts it covers."""
    _: KW_ONLY
    reason: str = ""
    """What torch gets wrong (and the upstream issue, if there is one)."""
    symptom: str = ""
    """A text the verdict's detail must contain to be covered; ``" || "`` separates
    alternatives ("": any failure, but never an error)."""
    strict: bool = True
    """A check in which it matches nothing fails ("fixed upstream?")."""
    applies: Callable[["Case"], bool] | None = dataclasses.field(default=None, compare=False)
    """The configurations it covers (a known entry's predicate); None: every one."""
    model: Any = dataclasses.field(default=None, compare=False)
    """A known entry's model of its bug (known/model.py): it alone decides what is covered;
    None for a limitation the user declares (``symptom`` decides)."""

    def covers(self, prop: str, v: Verdict, case: "Case | None" = None) -> bool:
        """Whether this limitation turns ``v`` (property ``prop`` of ``case``) "known"
        (module rules)."""
        if prop not in self.props or v.status not in ("fail", "error") or v.origin == "suite":
            return False
        if self.applies is not None and case is not None and not self.applies(case):
            return False
        if self.model is not None:  # an Effect needs the case judged again: not here
            from ..known.model import Effect

            return not isinstance(self.model, Effect) and self.model.explains(v.detail)
        if v.status == "error" and not self.symptom:
            return False
        return symptom_matches(self.symptom, v.detail) and not (
            v.status == "fail" and unexplained(self.symptom, v.detail))

    @classmethod
    def of(cls, key_or_props, *, reason: str = "", symptom: str = "", props=None,
           strict: bool = True) -> "Limitation":
        """A key of ``known/entries.py`` (its properties, reason and symptom), or property ids
        ("P1", "P1,P6", ["P1", "P6"]) with a ``reason``."""
        from ..known.entries import KNOWN

        if isinstance(key_or_props, Limitation):
            return key_or_props
        entry = next((k for k in KNOWN if k.key == key_or_props), None)
        if entry is not None:
            return cls(entry.key, tuple(props or entry.props + entry.also),
                       reason=reason or entry.reason, symptom=symptom,
                       strict=strict, applies=entry.applies, model=entry.model)
        ids = key_or_props.split(",") if isinstance(key_or_props, str) else list(key_or_props)
        ids = [p.strip() for p in ids]
        if not ids or any(p not in PROPERTY_NAMES for p in ids):
            raise ValueError(f"fsdp_known: {key_or_props!r} is neither a key of "
                             f"fsdp_conformance/known/entries.py ({sorted(k.key for k in KNOWN)}) nor "
                             f"property ids like 'P1' or 'P1,P6'")
        if not reason:
            raise ValueError(f"fsdp_known({key_or_props!r}) needs reason=... (what torch gets "
                             f"wrong, and the upstream issue if there is one)")
        return cls(",".join(ids), tuple(props or ids), reason=reason, symptom=symptom,
                   strict=strict)


def apply_declared(verdicts: dict[str, Verdict], declared: Sequence[Limitation],
                   hits: set | None = None, case: "Case | None" = None) -> dict[str, Verdict]:
    """Failing verdicts covered by a declared limitation become "known" (module rules;
    ``case``: the configuration, as known entries see it; ``hits`` collects the keys that
    matched)."""
    out = {}
    for p, v in verdicts.items():
        if v.status in ("fail", "error"):
            lim = next((d for d in declared if d.covers(p, v, case)), None)
            if lim is not None:
                v = Verdict("known", f"{DECLARED}{lim.key!r}: {lim.reason}\n\n{v.detail}",
                            lim.key)
                if hits is not None:
                    hits.add(lim.key)
            else:
                part = next((d for d in declared if d.model is None and d.symptom
                             and p in d.props and v.status == "fail"
                             and symptom_matches(d.symptom, v.detail)), None)
                if part is not None:  # it explains some differences, not all: still a failure
                    rest = "\n".join(unexplained(part.symptom, v.detail))
                    v = Verdict("fail", f"{DECLARED}{part.key!r} (symptom {part.symptom!r}) "
                                        f"explains part of this; what it does not explain:\n"
                                        f"{rest}\n\n{v.detail}")
                    if hits is not None:
                        hits.add(part.key)
        out[p] = v
    return out


def known_view(case: Case, user: UserModel | None) -> Case:
    """The case known/entries.py sees: a user optimizer counts as the zoo optimizer of its class."""
    if user is not None and user.optimizer_kind and user.optimizer_kind != case.optimizer:
        return dataclasses.replace(case, optimizer=user.optimizer_kind)
    return case
