"""Verdict of one property on one case: pass, fail (with the diff), known (a recorded torch
limitation), n/a (with the reason), error (harness or unexpected exception), removed (the
path's torch API is gone from the torch under test: run/removal.py).

Rule: a verdict carries where it came from (``origin``): ``"torch"`` for what the system
under test did, ``"suite"`` for a failure of this package itself. A known torch limitation
never turns a suite failure into "known" (known/apply.py reads the field, not the text)."""
from __future__ import annotations

from dataclasses import dataclass

STATUSES = ("pass", "fail", "known", "n/a", "error", "removed")
ORIGINS = ("torch", "suite")


@dataclass(frozen=True)
class Verdict:
    """One property's verdict on one case."""

    status: str
    """One of ``STATUSES``."""
    detail: str = ""
    """What was seen: the diff, the reason for n/a, the traceback."""
    known: str = ""
    """Key of the matching known limitation (status "known", or "pass" = fixed upstream?)."""
    origin: str = "torch"
    """``"suite"`` when this package failed (a bug of the suite, never "known")."""
    digest: str = ""
    """Status "known": a stable digest of what was observed (known/model.py
    ``observation_digest``), so the gate sees a known pair whose effect changed."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")
        if self.origin not in ORIGINS:
            raise ValueError(f"origin must be one of {ORIGINS}, got {self.origin!r}")

    @property
    def ok(self) -> bool:
        """Nothing wrong was found: pass, known, n/a, or removed (an API that is gone is a
        change of torch's surface, reported on its own, not a wrong result)."""
        return self.status in ("pass", "known", "n/a", "removed")

    @property
    def fixed_upstream(self) -> bool:
        """A recorded torch limitation that no longer reproduces: retire its entry."""
        return self.status == "pass" and bool(self.known)

    def to_json(self) -> dict:
        d = {"status": self.status, "detail": self.detail}
        if self.known:
            d["known"] = self.known
        if self.fixed_upstream:
            d["fixed_upstream"] = True
        if self.origin != "torch":
            d["origin"] = self.origin
        if self.digest:
            d["digest"] = self.digest
        return d


def passed(detail: str = "") -> Verdict:
    return Verdict("pass", detail)


def fail(detail: str) -> Verdict:
    return Verdict("fail", detail)


def na(reason: str) -> Verdict:
    return Verdict("n/a", reason)


def error(detail: str) -> Verdict:
    return Verdict("error", detail)


def suite_error(detail: str) -> Verdict:
    """An error of this package itself (origin "suite")."""
    return Verdict("error", detail, origin="suite")


class Findings:
    """What a property that compares many (path, rank) observations has found so far, and the
    verdict that follows (the rule of P1 and P3): the differences of every observation are
    reported together; an observation that raised is an error, and one beside a difference
    elsewhere makes the verdict a failure that shows both (a second bug never hides behind
    an error); nothing compared is "n/a" with the first reason given, never a pass."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.compared: set[tuple[str, int]] = set()
        self._error: Verdict | None = None
        self._na: Verdict | None = None

    def skipped(self, why: Verdict) -> None:
        """An observation with nothing to compare: it raised ("error") or did not run."""
        if why.status == "error" and self._error is None:
            self._error = why
        elif why.status == "n/a" and self._na is None:
            self._na = why

    def verdict(self, detail: str, nothing: str) -> Verdict:
        """The verdict: ``detail`` of a pass, ``nothing``: the n/a reason when no
        observation was compared and none gave one."""
        if self.problems:
            tail = f"\n\n{self._error.detail}" if self._error is not None else ""
            return fail("\n\n".join(self.problems) + tail)
        if self._error is not None:
            return self._error
        if not self.compared:
            return self._na or na(nothing)
        return passed(detail)

    def ranks(self) -> int:
        """How many ranks had an observation compared."""
        return len({r for _, r in self.compared})
