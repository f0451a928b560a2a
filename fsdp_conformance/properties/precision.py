"""The precision P2 and P6 judge at: the one the model actually computes in, never a finer
one.

Rules
- The case asks for a dtype (``Case.compute_dtype``: ``mixed_precision``'s, else
  ``dtype``); the params are built in it. A model can still compute coarser: a forward that
  returns ``.float()`` or ``.half()``, an autocast, a loss computed in float32. Its loss then
  carries that dtype's rounding into every gradient, and the tolerance of the finer dtype
  would call one ulp of float32 a failure. ``judged_dtype`` is the coarser of the two,
  observed on the model itself: one forward of the case's model (built as the baseline
  builds it, in the case's dtype) on the first step's batch, the dtype of its loss.
- The reason travels with the verdict: a pass says which tolerance applied when it is not
  the asked one, and every P2/P6 failure says which tolerance applied, why, and how to ask
  for another (``tolerance_note``).
"""
from __future__ import annotations

import functools
from dataclasses import replace

import torch

from ..cases import Case, torch_dtypes
from .verdict import Verdict
from ..zoo import build_model, make_batch
from ..zoo.models import loss_of

# dtype -> (rtol, atol) for P2 and P6 (float64, float32), and P6's losses in bfloat16.
TOLERANCES = {"fp64": (1e-9, 1e-12), "fp32": (1e-4, 1e-6), "bf16": (5e-2, 1e-2)}

# finest first: a dtype later in this tuple is coarser
_ORDER = ("fp64", "fp32", "bf16")


def _name(dtype: torch.dtype) -> str | None:
    if dtype == torch.float16:  # judged as bf16 is: per-tensor scale, not per element
        return "bf16"
    return next((n for n, d in torch_dtypes().items() if d == dtype), None)


@functools.lru_cache(maxsize=64)
def loss_dtype(case: Case) -> torch.dtype:
    """The dtype of the loss the case's model computes (one forward, no gradient) on the
    first step's batch; the rows of two ranks at most, it only reads a dtype."""
    if case.mixed_precision_dtype is not None:
        return case.mixed_precision_dtype
    model = build_model(case.model, case.seed, case.torch_dtype)
    x = make_batch(case.model, case.seed, 0, case.batch, case.torch_dtype)
    with torch.no_grad():
        return loss_of(model, x[:2]).dtype


def loss_name(case: Case) -> str:
    """``case.dtype``, or the coarser dtype name the case's model computes its loss in."""
    seen = _name(loss_dtype(case))
    if seen is None or _ORDER.index(seen) <= _ORDER.index(case.dtype):
        return case.dtype
    return seen


def judged_dtype(case: Case, own_mp: str = "") -> tuple[str, str]:
    """``(dtype name P2/P6 judge at, why)``: ``case.compute_dtype``, or the model's coarser
    loss dtype, or the compute dtype of a ``MixedPrecisionPolicy`` the user's own sharding
    applied (``own_mp``: ``SaveRecord.own_mixed_precision``), whichever is coarsest (module
    rules); ``why`` is "" when it is the case's own."""
    asked = case.compute_dtype
    seen = _name(loss_dtype(case))
    mp = "bf16" if own_mp == "fp16" else own_mp
    if mp and not case.mixed_precision and _ORDER.index(mp) > _ORDER.index(asked):
        return mp, (f"the model's own sharding (shard_fn) applies a MixedPrecisionPolicy "
                    f"computing in {own_mp}, which the single-process run does not model, so "
                    f"it is judged by {mp}'s rules (each tensor's relative error, the "
                    f"resumed update's scale)")
    if seen is None or _ORDER.index(seen) <= _ORDER.index(asked):
        return asked, ""
    return seen, (f"the model computes its loss in {loss_dtype(case)} although the case runs "
                  f"in {case.torch_dtype}, so it is judged at {seen}'s tolerance")


def own_mp_of(save_obs) -> str:
    """The ``own_mixed_precision`` the save ranks recorded ("" none)."""
    return next((getattr(o, "own_mixed_precision", "") for o in save_obs
                 if getattr(o, "own_mixed_precision", "")), "")


def tolerance_note(case: Case, own_mp: str = "") -> str:
    """One line for a P2/P6 failure: which tolerance applied, why, and how to choose."""
    judged, why = judged_dtype(case, own_mp)
    rtol, atol = TOLERANCES[judged]
    how = ("dtype=\"fp32\" (or \"bf16\") in fsdp_roundtrip / the case's dtype asks for a "
           "coarser one")
    if why:
        return f"tolerance: {judged} (rtol {rtol}, atol {atol}): {why}; {how}"
    return (f"tolerance: {judged} (rtol {rtol}, atol {atol}), the dtype the case runs and "
            f"computes in; if your model is meant to compute coarser, {how}")


def with_precision(case: Case, verdict: Verdict, *, always: bool = True,
                   own_mp: str = "") -> Verdict:
    """A P2/P6 verdict with the precision it was judged at: a failure gets
    ``tolerance_note``; a pass at a coarser dtype than the case asked says so. ``always``
    False: only where the judged dtype is not the case's own (the conformance run's details,
    whose known pairs' digests read them, stay as they were)."""
    judged, why = judged_dtype(case, own_mp)
    if not (why or always):
        return verdict
    if verdict.status == "fail":  # second line: before a long diff a message may cut
        head, nl, rest = verdict.detail.partition("\n")
        return replace(verdict, detail=f"{head}\n{tolerance_note(case, own_mp)}{nl}{rest}")
    if verdict.status == "pass" and why:
        return replace(verdict, detail=f"{verdict.detail} ({why})")
    return verdict
