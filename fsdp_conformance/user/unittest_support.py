"""The plugin's round trips for ``unittest`` users: a ``TestCase`` base class and
``parameterized`` helpers. Runs under ``python -m unittest`` and under pytest alike.

    import unittest
    from fsdp_conformance.unittest_support import FSDPTestCase, world_sizes

    class TestMyModel(FSDPTestCase):
        @world_sizes(1, 2, "2->4")                      # test_roundtrip_ws1, _ws2, _ws2_to_4
        def test_roundtrip(self, ws):
            self.assertRoundtrip("mypkg.model:Net", "mypkg.model:batch", plan=["body"],
                                 world_sizes=[ws])

Rules
- Pools are the process's shared pools (``harness.get_pool``): every TestCase of a run uses
  the same ranks; they close at interpreter exit.
- ``assertRoundtrip`` takes every argument of ``check`` and raises
  ``self.failureException`` with the same message the pytest plugin prints (property,
  key/param/rank, expected vs got, a standalone reproducer).
- Class attributes set the defaults: ``fsdp_backend``, ``fsdp_timeout``, ``fsdp_tier``
  (environment ``FSDPC_BACKEND`` / ``FSDPC_TIMEOUT`` / ``FSDPC_TIER`` override them).
"""
from __future__ import annotations

import os
import re
import unittest
from typing import Any, Sequence

from ..harness import get_pool
from .driver import check, run_checked
from .failures import RoundtripFailure
from .spec import pair_text, world_size_pair
from ..options import DEFAULT_TIMEOUT_S, RunOptions


def _parameterized():
    try:
        from parameterized import parameterized
    except ImportError:  # pragma: no cover - exercised only without the test extra
        raise ImportError("fsdp_conformance.unittest_support's helpers need the "
                          "'parameterized' package: pip install parameterized") from None
    return parameterized


def _safe(text: str) -> str:
    return re.sub(r"\W+", "_", text.replace("->", "_to_")).strip("_")


def world_sizes(*sizes):
    """``parameterized.expand`` over world sizes (ints or "N->M"): one test method per size,
    named ``<test>_ws2`` / ``<test>_ws2_to_4``; the size is the method's argument."""
    def name(func, num, param):
        return f"{func.__name__}_{_safe('ws' + pair_text(world_size_pair(param.args[0])))}"

    return _parameterized().expand([(s,) for s in sizes], name_func=name)


def conformance_cases(cases: Sequence):
    """``parameterized.expand`` over ``Case`` objects (e.g. ``matrix.quick(...)``), one test
    method per case, named after the case id."""
    def name(func, num, param):
        return f"{func.__name__}_{num}_{_safe(param.args[0].id)}"

    return _parameterized().expand([(c,) for c in cases], name_func=name)


class FSDPTestCase(unittest.TestCase):
    """Base class: ``rank_pool(ws)``, ``assertRoundtrip(model, data, ...)`` and
    ``assertCaseConforms(case)``."""

    fsdp_backend: str | None = None
    fsdp_timeout: float = DEFAULT_TIMEOUT_S
    fsdp_tier: str = "quick"

    def _settings(self) -> dict[str, Any]:
        return {"backend": os.environ.get("FSDPC_BACKEND") or self.fsdp_backend,
                "timeout": float(os.environ.get("FSDPC_TIMEOUT") or self.fsdp_timeout)}

    def rank_pool(self, world_size: int):
        """The process's shared pool of ``world_size`` ranks."""
        s = self._settings()
        return get_pool(world_size, s["backend"], timeout=s["timeout"])

    def _rerun(self, case) -> str:
        return (f"python -m unittest {type(self).__module__}.{type(self).__qualname__}."
                f"{self._testMethodName}  (case {case.id})")

    def assertRoundtrip(self, model, data, **kwargs) -> list:
        """``check(model, data, **kwargs)``; a failing property fails the test."""
        kwargs.setdefault("tier", os.environ.get("FSDPC_TIER") or self.fsdp_tier)
        kwargs.setdefault("rerun", self._rerun)
        try:
            return check(model, data, **self._settings(), **kwargs)
        except RoundtripFailure as exc:
            raise self.failureException(str(exc)) from None

    def assertCaseConforms(self, case, user=None, custom=None, known: Sequence = ()):
        """Run one ``Case`` (optionally a user model / custom path); fail on any failing
        property. Returns the CaseResult."""
        try:
            return run_checked([case], user, custom, RunOptions.for_user(**self._settings()),
                               known=known, rerun=self._rerun)[0]
        except RoundtripFailure as exc:
            raise self.failureException(str(exc)) from None
