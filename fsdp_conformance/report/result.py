"""The record of one decided case (what the run returns and the report stores)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..cases import Case
from ..properties.verdict import Verdict


@dataclass(frozen=True)
class CaseResult:
    """One case of a run: its verdict per property, its timings and its measurements."""

    case: Case
    """The case."""
    properties: dict[str, Verdict]
    """Verdict per property, "P0".."P15"."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds by step ("save", "load", "total")."""
    measurements: dict[str, dict] = field(default_factory=dict)
    """A bounds case's measurements ({phase: measurement}, bounds.rules.annotate)."""
    rerun: str = ""
    """Why the case ran twice: the first attempt's failure when a rank process died in it
    (run/lifecycle.py rules); the verdicts are the second attempt's. "" = it ran once."""
    setup: dict = field(default_factory=dict)
    """A user's case (the plugin): the user's setup as it is, what the case's fields cannot
    say (user/run.py ``describe_setup``: their factories and functions, what their
    checkpoint holds, when the scheduler is built); empty for the run's own cases."""
