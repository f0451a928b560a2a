"""FSDP1 wrapped with ``device_mesh=`` observed on a rank: its SHARDED optimizer state dict
holds DTensors (``_optim_utils.py`` chunks each unflattened state with
``_ext_chunk_dtensor`` when the FSDP state has a device mesh; ``Shard(0)``, HSDP
``(Replicate(), Shard(0))``), the input the reference's ``flatten_sharded`` reads as is.

Rules
- Wrapping as ``sut.fsdp1.wrap_fsdp1`` (same plan, strategy, ignored modules), but the
  process group comes from a ``DeviceMesh`` over the pool's ranks (HYBRID_SHARD: 2-D,
  ``(ws // S, S)``).
- ``"sharded"``: ``FSDP.optim_state_dict`` under ``SHARDED_STATE_DICT``, recorded by
  ``sut.fsdp2.sharded_record``: per DTensor its local tensor, placements, mesh, torch's own
  global offset, and ``"pieces"``: ``reference.to_pieces`` applied to the live DTensor on
  this rank (the reference's DTensor input path on real DTensors).
- ``"to_load"``: ``FSDP.optim_state_dict_to_load`` of that live dict (the flat local dict
  FSDP1 would load), named like ``"local"``.
- Paths guarded as in ``sut.fsdp1``: ``{"error": traceback}``; everything CPU, cloned.
"""
from __future__ import annotations

from typing import Any

from ..cases import Case
from ..zoo import build_model, build_optimizer, model_spec
from .fsdp1 import sharding_strategy, clean_name, flat_metadata, named_local, optimizer_keys, train
from .common import guard
from .fsdp2 import local_to_cpu, sharded_record


def _mesh(ctx, case: Case):
    from torch.distributed.device_mesh import init_device_mesh

    ws = ctx.world_size
    hybrid = case.strategy == "HYBRID_SHARD"
    s = case.shard_world_size if hybrid else ws
    shape = (ws // s, s) if hybrid else (ws,)
    key = ("fsdp1-mesh", ctx.device.type, shape)
    if key not in ctx.cache:
        names = ("replicate", "shard") if hybrid else ("shard",)
        ctx.cache[key] = init_device_mesh(ctx.device.type, shape, mesh_dim_names=names)
    return ctx.cache[key]


def wrap_fsdp1_mesh(ctx, case: Case, plan: str | None = None):
    """The zoo model in FSDP1 with ``device_mesh=`` (module docstring)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import CustomPolicy

    spec = model_spec(case.model)
    model = build_model(case.model, case.seed, case.torch_dtype)
    targets = {id(m) for n, m in model.named_modules() if n in set(spec.plans[plan or case.plan])}
    ignored = [model.get_submodule(f) for f in spec.ignored]
    return FSDP(model, device_id=ctx.device, use_orig_params=case.use_orig_params,
                sharding_strategy=sharding_strategy(case), ignored_modules=ignored or None,
                auto_wrap_policy=CustomPolicy(lambda m: id(m) in targets),
                device_mesh=_mesh(ctx, case))


def observe(ctx, case: Case) -> dict:
    """Train ``case.steps`` steps, then the SHARDED (DTensor) optimizer dict and what
    ``optim_state_dict_to_load`` makes of it on this rank."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType

    fsdp = wrap_fsdp1_mesh(ctx, case)
    names = [(clean_name(n), p) for n, p in fsdp.named_parameters()]
    optim = build_optimizer(case.optimizer, names, case.groups)
    keys = optimizer_keys(fsdp, optim)
    losses = train(ctx, case, fsdp, optim, case.steps)
    out: dict[str, Any] = {"rank": ctx.rank, "keys": keys, "losses": losses,
                           "meta": flat_metadata(fsdp)}
    out["local"] = local_to_cpu(named_local(optim.state_dict(), keys))

    def sharded():
        with FSDP.state_dict_type(fsdp, StateDictType.SHARDED_STATE_DICT):
            return FSDP.optim_state_dict(fsdp, optim)

    live = guard(sharded)
    if "error" in live:
        out["sharded"] = live
        return out
    out["value_types"] = sorted({type(v).__name__ for st in live["state"].values() for v in st.values()})
    rec = guard(sharded_record, live)
    if "error" not in rec:
        rec["state"] = {clean_name(k): v for k, v in rec["state"].items()}
    out["sharded"] = rec

    def to_load():
        with FSDP.state_dict_type(fsdp, StateDictType.SHARDED_STATE_DICT):
            return named_local(FSDP.optim_state_dict_to_load(fsdp, optim, live), keys)

    out["to_load"] = local_to_cpu(guard(to_load))
    return out
