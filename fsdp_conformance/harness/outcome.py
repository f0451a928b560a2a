"""A rank's own word that the call it is running failed on it, although the call returns.

Rules
- A rank function that catches an exception and returns it as a value (``sut.common.guarded``
  records a ``sut.records.RecordedError``) calls ``mark_failed(exc, detail)``; it still returns its
  value as usual.
- The worker clears the marks when a call starts (``start_call``) and sends those of the call
  with its reply (``take_marks``). The pool treats a rank that returned with marks like a rank
  that raised as far as waiting goes (pool.py's rules): the other ranks get the short error
  grace to finish; if they all do, every result is returned exactly as without marks.
- Outside a pool call (a direct call, a test, an attached torchrun rank) ``mark_failed`` only
  records; nothing reads the marks but ``take_marks``.
"""
from __future__ import annotations

from dataclasses import dataclass

_marks: list["FailureMark"] = []


@dataclass(frozen=True, kw_only=True)
class FailureMark:
    """One failure a rank caught during a call and returned as a value."""

    exc_type: str
    """The exception's class name, e.g. ``"RuntimeError"``."""
    detail: str
    """What the rank recorded: the traceback as ``traceback.format_exc()`` wrote it."""


def start_call() -> None:
    """Forget the marks of the previous call (the worker calls this before each call)."""
    _marks.clear()


def mark_failed(exc: BaseException, detail: str) -> None:
    """Say that the running call failed on this rank with ``exc`` (its traceback: ``detail``),
    though the call goes on and returns a value."""
    _marks.append(FailureMark(exc_type=type(exc).__name__, detail=detail))


def failed() -> bool:
    """Whether the running call has marked a failure so far."""
    return bool(_marks)


def take_marks() -> tuple[FailureMark, ...]:
    """The marks of the call that just ended, in the order they were made; clears them."""
    out = tuple(_marks)
    _marks.clear()
    return out
