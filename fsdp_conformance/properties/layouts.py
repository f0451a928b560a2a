"""The reference layout of a case, built on the controller from the same zoo model."""
from __future__ import annotations

from .. import reference as ref
from ..cases import Case
from ..zoo import build_model, model_spec
from .expectation import EXACT, Expectation


def reference_layout(case: Case, *, load_side: bool = False, exp: Expectation = EXACT):
    """``ModelLayout`` of the case's save side (or load side: its load world size and plan),
    of the case it runs as under the modelled bug ``exp`` (``Expectation.runs_as``)."""
    case = exp.runs_as(case)
    spec = model_spec(case.model)
    ws = case.dst_world_size if load_side else case.world_size
    plan = case.dst_plan if load_side else case.plan
    shard_ws = case.shard_world_size if case.strategy == "HYBRID_SHARD" else ws
    model = build_model(case.model, case.seed, case.torch_dtype)
    return ref.build_layout(model, spec.plans[plan], ws, use_orig_params=case.use_orig_params,
                            strategy=case.strategy, shard_world_size=shard_ws,
                            ignored=spec.ignored)


def fsdp2_reference_layout(case: Case, load_side: bool = False, *,
                           exp: Expectation = EXACT):
    """``Fsdp2Layout`` of the case under ``fully_shard`` (save side, or its load world size
    and tensor-parallel degree), of the case it runs as under ``exp``. The wrapping plan
    does not change FSDP2's layout: every param is sharded on its own."""
    from ..cases import shard_group_size

    case = exp.runs_as(case)
    spec = model_spec(case.model)
    ws = case.dst_world_size if load_side else case.world_size
    tp = case.tensor_parallel_of(load_side)
    model = build_model(case.model, case.seed, case.torch_dtype)
    if tp:
        return ref.fsdp2_layout(model, ws, ignored=spec.ignored, tp_size=tp,
                                tp_plan=dict(spec.tp_plan))
    return ref.fsdp2_layout(model, ws, ignored=spec.ignored,
                            shard_world_size=shard_group_size(case, ws))
