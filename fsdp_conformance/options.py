"""The options every way of running cases shares (the CLI, the plugin, the Python API, the
pools), written once: their defaults and the record that carries them (``RunOptions``).
Imports nothing heavy (the plugin loads it without torch).
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TIMEOUT_S = 120.0
"""Seconds a rank call (a save, a load) may take before it is a hang (``--timeout``,
``--fsdp-timeout``, ``timeout=``)."""

DEFAULT_FAULT_TIMEOUT_S = 30.0
"""Seconds a fault case's load may take: a bad input must raise on some rank well before a
healthy call's timeout, and the ranks it leaves waiting are the finding (P15)."""


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
    fault_timeout: float = DEFAULT_FAULT_TIMEOUT_S
    """Seconds a fault case's load may take before it is a hang (P15); a user's round trips
    (``for_user``) never wait longer than their ``timeout``."""
    calibration: str | None = None
    """Bounds calibration file for P13/P14 (None: the packaged one; ``--calibration``)."""
    lanes: int | None = None
    """Cases run side by side, each lane on pools of its own (None: ``default_lanes``;
    ``--lanes``)."""

    @classmethod
    def for_user(cls, *, backend: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S) -> "RunOptions":
        """A user's round trips (``check``, ``check_zoo``, the plugin): their backend and
        timeout; a fault case's load never waits longer than their timeout."""
        return cls(backend=backend, timeout=timeout,
                   fault_timeout=min(timeout, DEFAULT_FAULT_TIMEOUT_S))
