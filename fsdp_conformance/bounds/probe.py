"""The machine's speed at the work the paths do, measured in the run itself: the interpreter
and dispatch probes behind P13's portable bounds (bounds/rules.py).

Why: a path's save or load on the quick tier's state is mostly Python and torch dispatch
(walking params and state keys, building dicts and FQNs, small tensor ops) and only a
little memcpy. The copy and collective floors (floors.py) move with the machine's memory
speed; the rest of the path's cost moves with its interpreter and dispatch speed, which
differ between machines of one kind by 2.5-4x where memcpy does not (another CPU, a slower
Python build, a profiler or tracer hooked into the interpreter). A bound fitted on one
machine as ``a x floor + c`` with a fixed ``c`` fails an unchanged path on a machine whose
Python is slower.

Rules
- Two probes, each one fixed piece of work and none of the paths' bytes:
    * ``python``: pure interpreter work (nested calls, dicts, FQN strings, sorting) and no
      torch call;
    * ``dispatch``: a Python loop of small torch calls on 16-element tensors (view, narrow,
      clone, add, cat, reshape), whose cost is mostly torch's dispatcher and allocator.
  A path's work beyond its floor is a mix of these two kinds, so on any machine its
  slowdown lies between theirs: the larger of the two probes' slowdowns bounds it.
- They touch no torch API a checkpoint path depends on beyond core tensor ops, so a torch
  release that slows a state-dict API does not slow a probe and cannot loosen its own bound.
- Each is timed in every rank, in the same process, right after the path and its floor,
  with the same repeat rule (``timing.timed_repeats``: every rank together, the slowest
  rank, the minimum over ``PROBE_REPEATS``), in both clocks.
- Use (rules.py): the calibration stores both probes' CPU times beside every point; a run's
  ``speed`` = ``max(1, python now / python at calibration, dispatch now / dispatch at
  calibration)`` scales the part of each bound that is not the floor. A 3x slower path on the
  calibrating machine leaves the probes as they were, so it is still caught; an unchanged
  path on a machine whose Python is 3x slower meets a bound 3x wider.
- Limits: where a machine is faster than the calibrating one, ``speed`` stays 1 (the bounds
  never tighten below their calibration: a faster machine hides a slowdown of up to its
  speed-up). Noise on a loaded machine only makes a probe slower, so it only widens a bound.
  The probes bound the paths' slowdown only as far as a path's extra work is of their two
  kinds; ``bounds stability --slow-python`` (slowdown.py) runs the bounds cases on an
  interpreter slowed several times while memcpy keeps its speed, and under it every path
  slowed less than the pure-Python probe (paths 0.5-4.1x, probe 4.4-5.8x, 2 cores, torch
  2.13, world sizes 1-2).
"""
from __future__ import annotations

import torch

PROBE_ITEMS = 120
PROBE_REPEATS = 7
PROBES = ("python", "dispatch")
_WIDTH = 16


def _fqn(prefix: str, i: int) -> str:
    return f"{prefix}.layers.{i // 8}.block.{i % 8}.weight"


def _record(name: str, i: int) -> dict:
    return {"fqn": name, "step": i, "hyper": {"lr": 0.01, "betas": (0.9, 0.999)},
            "keys": [k for k in ("exp_avg", "exp_avg_sq", "step") if k]}


def _python(items: int) -> int:
    state: dict[str, dict] = {}
    for i in range(items):
        name = _fqn("model", i)
        state[name] = _record(name, i)
    total = 0
    for name, rec in sorted(state.items()):
        parts = name.split(".")
        total += len(parts) + len(rec["keys"]) + int(".".join(parts[1:3]) in name)
        total += sum(len(k) for k in rec["hyper"])
    return total


def _dispatch(items: int) -> int:
    base = torch.arange(_WIDTH, dtype=torch.float32)
    total = 0
    for i in range(items):
        row = base.view(4, 4).narrow(0, i % 4, 1)
        flat = torch.cat([row.clone().reshape(-1), row.add(1.0).reshape(-1)])
        total += flat.numel()
    return total


def probe(kind: str, items: int = PROBE_ITEMS) -> int:
    """Run the probe ``kind`` ("python" or "dispatch") once (module rules); returns a checksum
    so the work cannot be skipped."""
    if kind == "python":
        return _python(items * 4)
    if kind == "dispatch":
        return _dispatch(items)
    raise ValueError(f"unknown probe {kind!r}: expected one of {PROBES}")


__all__ = ["PROBES", "PROBE_ITEMS", "PROBE_REPEATS", "probe"]
