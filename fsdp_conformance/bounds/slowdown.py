"""A slower interpreter on demand: the simulation behind the claim that P13's bounds are
portable (bounds/rules.py, "Portable bounds").

Rule: ``install()`` hooks a profile function into the rank's interpreter
(``sys.setprofile``, every thread started after it too via ``threading.setprofile``) that
spins ``FSDPC_SLOWDOWN_LOOPS`` (default 12) empty loop iterations on every Python call,
return and C call. Python-heavy work then runs several times slower (here the paths' work
1-4x, the pure-Python probe about 5x) while memcpy and the collectives keep their speed:
the shape of a machine whose interpreter is slower relative to its memory than the
calibrating machine's. It changes no result, only speed.

Use it in every rank of a run through the harness's rank set-up hook::

    FSDPC_RANK_SETUP=fsdp_conformance.bounds.slowdown:install fsdp-conformance run

(``bounds stability --slow-python`` does the same). Test and demonstration only: never on
by default.
"""
from __future__ import annotations

import os
import sys
import threading

LOOPS_ENV = "FSDPC_SLOWDOWN_LOOPS"
SETUP = "fsdp_conformance.bounds.slowdown:install"
"""The ``FSDPC_RANK_SETUP`` value that installs it."""


def install() -> None:
    """Slow this interpreter down (module rules)."""
    loops = range(int(os.environ.get(LOOPS_ENV, "12")))

    def _hook(frame, event, arg):  # noqa: ARG001 - the profile protocol
        for _ in loops:
            pass

    sys.setprofile(_hook)
    threading.setprofile(_hook)


__all__ = ["LOOPS_ENV", "SETUP", "install"]
