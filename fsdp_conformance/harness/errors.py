"""Errors raised by rank pools. Each one carries what a user needs to find the fault:
which rank, its traceback or stack, its exit code."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankFailure:
    """What one rank reported (or what was observed of it) for a failed call."""

    rank: int
    kind: str  # "exception" | "died" | "hung" | "stuck-after-error"
    detail: str  # traceback, exit description or Python stack
    log_tail: str = ""

    def render(self) -> str:
        head = f"--- rank {self.rank}: {self.kind} ---"
        parts = [head, self.detail.rstrip()]
        if self.log_tail.strip():
            parts += ["  [rank log, last lines]", _indent(self.log_tail.rstrip())]
        return "\n".join(parts)


def _indent(text: str, prefix: str = "  | ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


class RankError(RuntimeError):
    """A call failed on at least one rank. ``failures`` holds one entry per failing rank;
    ``str()`` shows every failing rank's traceback."""

    def __init__(self, summary: str, failures: list[RankFailure]):
        self.summary = summary
        self.failures = list(failures)
        body = "\n".join(f.render() for f in self.failures)
        super().__init__(f"{summary}\n{body}" if body else summary)

    @property
    def ranks(self) -> list[int]:
        return [f.rank for f in self.failures]


class RankDied(RankError):
    """A rank process exited during a call (segfault, os._exit, OOM kill). The pool is rebuilt."""


class RankTimeout(RankError):
    """A call exceeded its timeout. ``failures`` holds every unfinished rank's Python stack
    at the moment of the hang. The pool is torn down and rebuilt."""


class PoolClosed(RuntimeError):
    """The pool was closed (explicitly, or after Ctrl-C) and cannot run calls."""
