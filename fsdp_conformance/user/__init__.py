"""Testing your own model's optimizer-state checkpointing under FSDP: the library behind the
pytest plugin (``fsdp_conformance.plugin``), ``FSDPTestCase`` and the hypothesis strategies.

    from fsdp_conformance.user import check
    check("mypkg.models:make_model", "mypkg.models:batch", plan=["encoder", "head"])

Modules (each one job):
  spec         defaults per tier, property names, world-size pairs (no torch)
  refs         ``Ref``: how a user's callables reach the ranks
  app_state    ``TrainState``: what a user's ``save_fn(state, directory)`` checkpoints
  model        ``UserModel`` / ``user_model``, ``CustomPath`` (the user's save/load)
  cases        the cases of one round trip, checked before any rank runs
  rank_side    what runs on the ranks: the save/load sides, the custom stages
  verdicts     properties of a user round trip, from the ranks' observations
  limitations  ``Limitation``: torch limitations a test declares (no torch)
  run          one case on the shared pools -> CaseResult (never raises)
  failures     ``RoundtripFailure``, failure messages, reproducer scripts (no torch)
  driver       ``check`` / ``run_checked`` / ``reproduce``
  protocols    one Protocol per role a user's code plays
  session      the pytest plugin's implementation (no torch at import)
  strategies   hypothesis strategies (imports hypothesis and torch)
  unittest_support  ``FSDPTestCase`` and ``parameterized`` helpers

Importing this package imports nothing else: the names below load on first use.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "check": "driver", "run_checked": "driver", "reproduce": "driver",
    "run_user_case": "run",
    "RoundtripFailure": "failures", "failing": "failures", "failure_message": "failures",
    "reproducer": "failures",
    "Ref": "refs", "UserModel": "model", "user_model": "model", "CustomPath": "model",
    "user_cases": "cases", "Limitation": "limitations",
    "world_size_pair": "spec", "pair_id": "spec",
    "FSDPTestCase": "unittest_support", "TrainState": "app_state",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
