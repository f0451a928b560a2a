"""What a comparison of BASE and NEW yields: :class:`Change` (one difference, labelled),
:class:`Comparison` (all of them, JSON schema ``fsdp-conformance/compare/1``), the
:class:`Thresholds` a caller may set, and the schemas of the reports compared.

Labels and their categories (:data:`LABELS`): regression, API removed, improvement, known
fixed, information; which transition gets which label is report/diff_runs.py's table (verdicts,
scaling) and report/diff_measure.py's rules (timings, memory). A comparison has regressed
when any change is in the regression category. An API removal (run/removal.py) is not a
regression: NEW's torch no longer has a path at all, and the comparison says so once per path
(``removed_paths``: "API removed: 4 paths") instead of one failure per verdict; it still
blocks (``blocked``) unless the caller accepts it.

Output order is deterministic: regressions, then improvements, known fixed, information;
within each, by subject and item.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Sequence

from .diff_measure import MIN_MEMORY_DELTA_BYTES, MIN_SCALING_EXPONENT_DELTA, MIN_TIME_DELTA_S
from .run_report import prop_key

COMPARE_SCHEMA = "fsdp-conformance/compare/1"
RUN_SCHEMA = "fsdp-conformance/run/1"
BENCH_SCHEMA = "fsdp-conformance/bench/1"

# label -> category; categories in output order.
CATEGORIES = ("regression", "removed", "improvement", "known fixed", "info")
LABELS: dict[str, str] = {
    "newly failing": "regression",
    "newly known": "regression",
    "known changed": "regression",
    "no longer checked": "regression",
    "missing in NEW": "regression",
    "slower": "regression",
    "more memory": "regression",
    "scaling worse": "regression",
    "API removed": "removed",
    "newly passing": "improvement",
    "faster": "improvement",
    "less memory": "improvement",
    "scaling better": "improvement",
    "known fixed": "known fixed",
    "newly checked": "info",
    "changed": "info",
    "scaling changed": "info",
    "bounds changed": "info",
    "added in NEW": "info",
    "API restored": "info",
}


@dataclass(frozen=True)
class Thresholds:
    """Ratios NEW / BASE beyond which a timing or a peak is a regression (each >= 1)."""

    max_slowdown: float = 1.5
    max_memory_growth: float = 1.2

    def __post_init__(self) -> None:
        for name in ("max_slowdown", "max_memory_growth"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 1.0):
                raise ValueError(f"{name} must be a finite number >= 1.0, got {v!r}")


@dataclass(frozen=True)
class Change:
    """One difference between BASE and NEW. ``subject``: a case id, a benchmark name or a
    scaling key ("path/phase"); ``item``: a property ("P3"), "save time", "load memory", ...
    or "" for the whole subject."""

    label: str
    subject: str
    item: str
    base: str
    new: str
    detail: str = ""

    @property
    def category(self) -> str:
        return LABELS[self.label]

    @property
    def regression(self) -> bool:
        return self.category == "regression"


@dataclass(frozen=True)
class Comparison:
    """The outcome of comparing two reports of one ``kind`` ("run" or "bench")."""

    kind: str
    base_path: str
    new_path: str
    base_facts: dict
    new_facts: dict
    thresholds: Thresholds
    changes: tuple[Change, ...]
    notes: tuple[str, ...] = ()

    @property
    def regressions(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.regression)

    @property
    def regressed(self) -> bool:
        return bool(self.regressions)

    @property
    def removed_paths(self) -> dict[str, str]:
        """{path: NEW's "removed" detail} for every path NEW's torch removed that BASE's had
        (the run report's ``summary.removed``, minus BASE's)."""
        base = self.base_facts.get("removed") or {}
        return {api: d for api, d in (self.new_facts.get("removed") or {}).items()
                if api not in base}

    @property
    def removed_fixtures(self) -> list[str]:
        """Golden fixtures only NEW's removed paths read (NEW cannot load them)."""
        return list(self.new_facts.get("removed_fixtures") or [])

    def blocked(self, allow_removed: bool = False) -> bool:
        """Whether this comparison fails a gate: a regression, or (unless ``allow_removed``)
        a path whose API NEW removed."""
        return self.regressed or (bool(self.removed_paths) and not allow_removed)

    def counts(self) -> dict[str, int]:
        """Changes per label, labels in LABELS order (non-zero only)."""
        n = Counter(c.label for c in self.changes)
        return {label: n[label] for label in LABELS if n[label]}

    def verdict_line(self) -> str:
        """"REGRESSION: ..." or "OK: ..." with the counts, or "OK: no changes"."""
        if not self.changes:
            return "OK: no changes"
        counts = ", ".join(f"{n} {label}" for label, n in self.counts().items())
        nreg = len(self.regressions)
        head = (f"REGRESSION: {nreg} regression{'s' if nreg != 1 else ''}" if nreg
                else "OK: no regressions")
        removed = self.removed_paths
        if removed:
            fx = self.removed_fixtures
            gone = (f"API REMOVED: {len(removed)} path{'s' if len(removed) != 1 else ''} "
                    f"({', '.join(removed)})"
                    + (f", fixtures only they read: {', '.join(fx)}" if fx else ""))
            head = f"{gone}; {head if nreg else 'no regressions'}"
        return f"{head} ({counts})"

    def to_json(self) -> dict:
        return {
            "schema": COMPARE_SCHEMA,
            "kind": self.kind,
            "base": {"path": self.base_path, **self.base_facts},
            "new": {"path": self.new_path, **self.new_facts},
            "thresholds": {**asdict(self.thresholds), "min_time_delta_s": MIN_TIME_DELTA_S,
                           "min_memory_delta_bytes": MIN_MEMORY_DELTA_BYTES,
                           "min_scaling_exponent_delta": MIN_SCALING_EXPONENT_DELTA},
            "regression": self.regressed,
            "api_removed": self.removed_paths,
            "removed_fixtures": self.removed_fixtures,
            "verdict": self.verdict_line(),
            "counts": self.counts(),
            "notes": list(self.notes),
            "changes": [{"category": c.category, **asdict(c)} for c in self.changes],
        }


_ORDER = {c: i for i, c in enumerate(CATEGORIES)}


def sorted_changes(changes: list[Change]) -> tuple[Change, ...]:
    return tuple(sorted(changes, key=lambda c: (_ORDER[c.category], c.subject,
                                                prop_key(c.item), c.label)))


def facts_notes(bf: dict, nf: dict, keys: Sequence[str]) -> list[str]:
    """A note per fact that differs between the reports (``None``, never printed: "none
    recorded")."""
    def said(v) -> str:
        return "none recorded" if v is None else str(v)
    return [f"{k} differs: {said(bf.get(k))} -> {said(nf.get(k))} (expected when gating an "
            "upgrade; compared anyway)" for k in keys if bf.get(k) != nf.get(k)]
