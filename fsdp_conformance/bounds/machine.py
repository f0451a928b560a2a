"""Which machine this is, as the bounds see it: its fingerprint (what sets the speed of the
paths' work) and its CPU model. The calibration is keyed by the fingerprint (bounds/rules.py)
and a report records it (report/io.py ``machine_info``).

Rules
- The fingerprint is a digest of ``FINGERPRINT_FIELDS`` only: the CPU, how many cores, the
  architecture, the OS, the interpreter; never the node's name or the time.
"""
from __future__ import annotations

import os
import platform


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


FINGERPRINT_FIELDS = ("cpu_model", "cpu_count", "machine", "system", "python_version")
"""What a machine fingerprint is made of: what sets the speed of the paths' work (the CPU,
how many cores, the architecture, the OS, the interpreter), not the node's name or the
time."""


def machine_fingerprint() -> str:
    """This machine's fingerprint (``fingerprint`` of its FINGERPRINT_FIELDS), computed once
    per process: the run asks for it on every bounds case, and the full ``machine_info``
    starts git twice."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        _FINGERPRINT = fingerprint({"cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
                                    "machine": platform.machine(), "system": platform.system(),
                                    "python_version": platform.python_version()})
    return _FINGERPRINT


_FINGERPRINT: str | None = None


def fingerprint(info: dict) -> str:
    """A short stable digest of ``info``'s FINGERPRINT_FIELDS: two reports with the same
    fingerprint come from machines whose timings are comparable."""
    import hashlib

    text = "|".join(str(info.get(k)) for k in FINGERPRINT_FIELDS)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
