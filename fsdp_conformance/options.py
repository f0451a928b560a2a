"""The options every way of running cases shares (the CLI, the plugin, the Python API, the
pools), written once: their defaults and the record that carries them (``RunOptions``).
Imports nothing heavy (the plugin loads it without torch).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_FAULT_TIMEOUT_S", "DEFAULT_TIMEOUT_S", "RunOptions", "fault_timeout_for"]

DEFAULT_TIMEOUT_S = 120.0
"""Seconds a rank call (a save, a load) may take before it is a hang (``--timeout``,
``--fsdp-timeout``, ``timeout=``)."""

DEFAULT_FAULT_TIMEOUT_S = 30.0
"""The least seconds a fault case's load may take, unless the run's own timeout is shorter
(``fault_timeout_for``): a bad input must raise on some rank well before a healthy call's
timeout, and the ranks it leaves waiting are the finding (P15)."""


def fault_timeout_for(timeout: float) -> float:
    """The seconds a fault case's load may take in a run whose calls time out after
    ``timeout``: a quarter of it, at least ``DEFAULT_FAULT_TIMEOUT_S``, and never more than
    ``timeout`` itself (no call of a run waits longer than the timeout it was given)."""
    return min(timeout, max(DEFAULT_FAULT_TIMEOUT_S, timeout / 4))


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How cases run: one record, built once where the user's choices come in (the CLI's
    flags, the plugin's options, the keywords of ``run_cases`` / ``check``) and passed whole
    to the run, each case's environment and the kinds."""

    backend: str | None = None
    """Process-group backend of the rank pools: ``"gloo"``, ``"nccl"``; None: gloo on CPU
    (``--backend``, ``--fsdp-backend``)."""
    timeout: float = DEFAULT_TIMEOUT_S
    """Seconds a rank call (a save, a load) may take before it is a hang (``--timeout``,
    ``--fsdp-timeout``)."""
    fault_timeout: float | None = None
    """Seconds a fault case's load may take before it is a hang (P15); None:
    ``fault_timeout_for(timeout)``, set when the record is made."""
    calibration: str | None = None
    """Bounds calibration file for P13/P14 (None: the packaged one; ``--calibration``)."""
    lanes: int | None = None
    """Cases run side by side, each lane on pools of its own (None: ``default_lanes``;
    ``--lanes``)."""

    def __post_init__(self) -> None:
        if self.fault_timeout is None:
            object.__setattr__(self, "fault_timeout", fault_timeout_for(self.timeout))

    @classmethod
    def for_user(cls, *, backend: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S) -> "RunOptions":
        """A user's round trips (``check``, ``check_zoo``, the plugin): their backend and
        timeout, the fault timeout derived from it (``fault_timeout_for``)."""
        return cls(backend=backend, timeout=timeout)
