"""The defaults every way of running cases shares (the CLI, the plugin, the Python API, the
pools), written once. Imports nothing (the plugin loads it without torch).
"""
from __future__ import annotations

DEFAULT_TIMEOUT_S = 120.0
"""Seconds a rank call (a save, a load) may take before it is a hang (``--timeout``,
``--fsdp-timeout``, ``timeout=``)."""

DEFAULT_FAULT_TIMEOUT_S = 30.0
"""Seconds a fault case's load may take: a bad input must raise on some rank well before a
healthy call's timeout, and the ranks it leaves waiting are the finding (P15)."""
