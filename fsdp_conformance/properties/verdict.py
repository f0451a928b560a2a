"""Verdict of one property on one case: pass, fail (with the diff), known (a recorded torch
limitation), n/a (with the reason), error (harness or unexpected exception)."""
from __future__ import annotations

from dataclasses import dataclass

STATUSES = ("pass", "fail", "known", "n/a", "error")


@dataclass(frozen=True)
class Verdict:
    status: str
    detail: str = ""
    known: str = ""  # key of the matching KnownLimitation (status "known", or "pass" = fixed upstream?)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    @property
    def ok(self) -> bool:
        return self.status in ("pass", "known", "n/a")

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
        return d


def passed(detail: str = "") -> Verdict:
    return Verdict("pass", detail)


def fail(detail: str) -> Verdict:
    return Verdict("fail", detail)


def na(reason: str) -> Verdict:
    return Verdict("n/a", reason)


def error(detail: str) -> Verdict:
    return Verdict("error", detail)
