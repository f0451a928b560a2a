"""What the one round trip (``sut.roundtrip``) and the observers share:
how a path's call is timed, and how a call that raised is recorded.

Rules
- ``timed`` runs the call with warnings silenced and returns ``(result, seconds)``.
- ``guarded`` is ``timed`` for a call that may raise: an exception (DCP's
  ``CheckpointException`` too, a ``BaseException`` subclass that ``except Exception`` misses)
  is recorded as ``(RecordedError(traceback=..., exc_type=...), 0.0)`` (``sut.records``):
  the controller's verdict shows the traceback. The rank also marks the call failed
  (``harness.outcome.mark_failed``), so when it returns while other ranks wait in a
  collective it never joins, the pool decides the call within its short error grace
  instead of at the timeout (harness/pool.py's rules).
- ``guard`` records an exception as the dict ``{"error": traceback}`` and neither times nor
  marks the call: the differential observers (sut/fsdp1.py, fsdp2.py, rekey.py) call one
  path after another on the same ranks and judge each failure themselves (they keep their
  dicts; typing them is a separate job).
- ``is_error`` tells a ``RecordedError`` (what ``guarded`` records) from a value.
"""
from __future__ import annotations

import time
import traceback
import warnings
from typing import Any

from ..harness.outcome import mark_failed
from .records import RecordedError


def timed(fn, *args, **kwargs) -> tuple[Any, float]:
    """``(fn(*args, **kwargs), seconds it took)``, warnings silenced."""
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def guarded(fn, *args, **kwargs) -> tuple[Any, float]:
    """``timed``, with an exception recorded as ``(RecordedError, 0.0)`` and marked on this
    rank (module rules)."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        return timed(fn, *args, **kwargs)
    except (Exception, CheckpointException) as exc:  # noqa: BLE001  (the verdict shows it)
        detail = traceback.format_exc()
        mark_failed(exc, detail)
        return RecordedError(traceback=detail, exc_type=type(exc).__name__), 0.0


def is_error(obj: Any) -> bool:
    """Whether ``obj`` is what ``guarded`` records for a call that raised."""
    return isinstance(obj, RecordedError)


def guard(fn, *args, **kwargs) -> Any:
    """``fn(*args, **kwargs)`` with warnings silenced; an exception (DCP's
    ``CheckpointException`` too) is returned as ``{"error": traceback}`` (module rules)."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*args, **kwargs)
    except (Exception, CheckpointException):  # noqa: BLE001  (the verdict shows the traceback)
        return {"error": traceback.format_exc()}
