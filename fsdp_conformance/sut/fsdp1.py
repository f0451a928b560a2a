"""FSDP1 (``FullyShardedDataParallel``) observed on a rank: build the case's model, wrap it,
train, then call every optimizer-state API path and return what each produced, in the
neutral named form of ``fsdp_conformance.reference`` (keys = clean names, never int ids).

Rules
- Names are cleaned by removing FSDP's wrapper prefixes (``_fsdp_wrapped_module.``,
  ``_checkpoint_wrapped_module.``); a flat parameter is ``"<unit>._flat_param"``.
- Each API path runs in its own try block: a path that raises is reported as
  ``{"error": traceback}`` for that path, and the other paths still run. A path that is
  skipped on purpose says why in ``{"n/a": reason}``.
- Everything returned is on CPU and detached (tensors are cloned), so it pickles.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..cases import Case
from ..zoo import build_model, build_optimizer, make_batch, model_spec, train_step
from ..reference.keys import clean_name
from .common import guard

def to_cpu(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", copy=True)
    if isinstance(x, dict):
        return {k: to_cpu(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(v) for v in x)
    return x


def sharding_strategy(case: Case):
    from torch.distributed.fsdp import ShardingStrategy

    return getattr(ShardingStrategy, case.strategy)


def _hybrid_groups(ctx, case: Case):
    """(intra-node shard group, inter-node replicate group) for HYBRID_SHARD, else None."""
    if case.strategy != "HYBRID_SHARD":
        return None
    import torch.distributed as dist

    s = case.shard_world_size
    ws = ctx.world_size
    shard_groups = [dist.new_group(list(range(i, i + s))) for i in range(0, ws, s)]
    repl_groups = [dist.new_group(list(range(j, ws, s))) for j in range(s)]
    return shard_groups[ctx.rank // s], repl_groups[ctx.rank % s]


def wrap_fsdp1(ctx, case: Case, plan: str | None = None, world_size: int | None = None):
    """Build the zoo model and wrap it in FSDP1 as the case says; return (fsdp_model, plain)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import CustomPolicy

    spec = model_spec(case.model)
    if spec.freeze_at_save:
        raise ValueError(f"model {case.model!r} freezes {list(spec.freeze_at_save)} at the save: "
                         f"FSDP1 fixes requires_grad per FlatParameter when it wraps, so it "
                         f"runs on FSDP2 paths only")
    model = build_model(case.model, case.seed, case.torch_dtype)
    plan_fqns = set(spec.plans[plan or case.plan])
    targets = {id(m) for n, m in model.named_modules() if n in plan_fqns}
    ignored = [model.get_submodule(f) for f in spec.ignored]
    kwargs = dict(device_id=ctx.device, use_orig_params=case.use_orig_params,
                  sharding_strategy=sharding_strategy(case), ignored_modules=ignored or None,
                  auto_wrap_policy=CustomPolicy(lambda m: id(m) in targets))
    groups = _hybrid_groups(ctx, case)
    kwargs["process_group"] = groups if groups is not None else ctx.group
    fsdp = FSDP(model, **kwargs)
    return fsdp


def optimizer_keys(model: nn.Module, optim: torch.optim.Optimizer) -> list[str]:
    """Clean names of the optimizer's params in its own order (the int ids of its state_dict)."""
    names = {id(p): clean_name(n) for n, p in model.named_parameters(remove_duplicate=True)}
    out = []
    for group in optim.param_groups:
        for p in group["params"]:
            out.append(names.get(id(p), f"<unnamed param {len(out)}>"))
    return out


def named_local(osd: dict, keys: list[str]) -> dict:
    """An int-keyed ``optim.state_dict()`` (or an FQN-keyed one) in the neutral named form."""
    def name(k):
        if not isinstance(k, int):
            return clean_name(k)
        # an index past the keys: a param added to the optimizer after it was built
        return keys[k] if k < len(keys) else f"<param {k}: added after the optimizer was built>"

    return {
        "state": {name(k): dict(v) for k, v in osd.get("state", {}).items()},
        "param_groups": [{**g, "params": [name(k) for k in g["params"]]}
                         for g in osd.get("param_groups", [])],
    }


def train(ctx, case: Case, fsdp: nn.Module, optim: torch.optim.Optimizer, steps: int,
          start_step: int = 0, sched=None, tensor_parallel: int = 0) -> list[float]:
    """``steps`` steps on the global batches; rank r takes rows r::world_size (an LR
    scheduler, if given, steps after each optimizer step). Returns the global losses
    (all-reduced mean) so a single-process run can be compared. ``tensor_parallel`` T (a
    ``(dp, tp)`` mesh): the T ranks of a tp group take the same rows, those of dp rank
    ``r // T`` of ``world_size // T``; their losses are equal, so the mean stays the global
    one."""
    import torch.distributed as dist

    tp = tensor_parallel or 1
    losses = []
    for step in range(start_step, start_step + steps):
        x = make_batch(case.model, case.seed, step, case.batch, case.torch_dtype)
        local = x[ctx.rank // tp::ctx.world_size // tp].to(ctx.device)
        loss = train_step(fsdp, optim, local, sched)
        t = loss.detach().to(torch.float64).reshape(1).clone()
        dist.all_reduce(t, group=ctx.group)
        losses.append(float(t.item()) / ctx.world_size)
    return losses


def flat_metadata(fsdp: nn.Module) -> list[dict]:
    """FSDP's actual flat-parameter layout per unit (what P0 compares with the reference).
    Reads FlatParameter attributes: this is the system under test being observed."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    units = []
    for mod in FSDP.fsdp_modules(fsdp):
        handle = getattr(mod, "_handle", None)
        if handle is None:
            continue
        fp = handle.flat_param
        name = ""
        for n, m in fsdp.named_modules():
            if m is mod:
                name = clean_name(n)
                break
        infos = [(bool(i.in_shard), i.offset_in_shard, i.numel_in_shard,
                  i.intra_param_start_idx, i.intra_param_end_idx)
                 for i in fp._shard_param_infos]
        units.append({
            "name": name,
            "fqns": [f"{name}.{f}" if name else f for f in fp._fqns],
            "shapes": [tuple(s) for s in fp._shapes],
            "numels_with_padding": list(fp._numels_with_padding),
            "is_padding_mask": list(fp._is_padding_mask),
            "unpadded_unsharded_numel": int(fp._unpadded_unsharded_size.numel()),
            "local_numel": int(fp.numel()),
            "shard_param_infos": infos,
            "uses_sharded_strategy": bool(handle.uses_sharded_strategy),
        })
    return units


def flat_sharded_to_neutral(sharded: dict) -> dict:
    """ShardedTensor / DTensor values -> (global shape, [(offsets, local tensor)]) per state."""
    out = {}
    for key, state in sharded.get("state", {}).items():
        conv = {}
        for n, v in state.items():
            if hasattr(v, "local_shards") and hasattr(v, "metadata"):
                shards = [(tuple(s.metadata.shard_offsets), to_cpu(s.tensor))
                          for s in v.local_shards()]
                conv[n] = {"global_shape": tuple(v.metadata().size), "shards": shards}
            elif hasattr(v, "to_local") and hasattr(v, "placements"):
                conv[n] = {"global_shape": tuple(v.shape), "dtensor": True,
                           "local": to_cpu(v.to_local())}
            else:
                conv[n] = to_cpu(v)
        out[clean_name(key) if isinstance(key, str) else key] = conv
    return {"state": out, "param_groups": to_cpu(sharded.get("param_groups", []))}


def grouping_name(name: str, param) -> str:
    """The name ``zoo.build_optimizer`` sorts a param into a group by: its clean FQN, or for
    a FlatParameter the FQNs it holds joined by "|" (so a unit lands in the group its
    original params are in, as in the single-process run)."""
    fqns = getattr(param, "_fqns", None)
    if fqns is None:
        return clean_name(name)
    prefix = clean_name(name)[: -len("_flat_param")]
    return "|".join(prefix + f for f in fqns)


def full_params(model) -> dict[str, torch.Tensor]:
    """Every param of the model, unsharded, by clean FQN (tied params once)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.summon_full_params(model, writeback=False):
        return {clean_name(n): p.detach().to("cpu", copy=True)
                for n, p in model.named_parameters()}


def load_params(ctx, model, params: dict[str, torch.Tensor]) -> None:
    """The saved params into the load side's FSDP1 model (not under test): every rank
    copies the whole of them in under ``summon_full_params``."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.summon_full_params(model, writeback=True), torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(params[clean_name(n)])


def full_optim(model, optim, rank0_only: bool) -> Any:
    """FSDP1's legacy ``full_optim_state_dict`` (the legacy full, scatter and rekey saves)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return FSDP.full_optim_state_dict(model, optim, rank0_only=rank0_only)


def model_sharded_sd(model) -> dict:
    """The FSDP1 model's SHARDED_STATE_DICT (what a DCP checkpoint holds beside the optim)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType

    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        return model.state_dict()


def observe(ctx, case: Case) -> dict:
    """Save side: train ``case.steps`` steps, then every FSDP1 path's output on this rank."""
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType

    fsdp = wrap_fsdp1(ctx, case)
    names = [(clean_name(n), p) for n, p in fsdp.named_parameters()]
    optim = build_optimizer(case.optimizer, names, case.groups)
    keys = optimizer_keys(fsdp, optim)
    losses = train(ctx, case, fsdp, optim, case.steps)
    out: dict[str, Any] = {"rank": ctx.rank, "keys": keys, "losses": losses,
                           "meta": flat_metadata(fsdp)}
    out["local"] = to_cpu(named_local(optim.state_dict(), keys))
    full_legacy = guard(FSDP.full_optim_state_dict, fsdp, optim, rank0_only=False)
    out["full_legacy"] = to_cpu(full_legacy)
    out["full_legacy_rank0_only"] = to_cpu(guard(FSDP.full_optim_state_dict, fsdp, optim,
                                                rank0_only=True))

    def full_current():
        with FSDP.state_dict_type(fsdp, StateDictType.FULL_STATE_DICT,
                                  FullStateDictConfig(rank0_only=False),
                                  FullOptimStateDictConfig(rank0_only=False)):
            return FSDP.optim_state_dict(fsdp, optim)

    out["full_current"] = to_cpu(guard(full_current))
    if "error" not in full_legacy:
        out.update(_load_paths(ctx, fsdp, optim, keys, full_legacy))
    sharded = guard(FSDP.sharded_optim_state_dict, fsdp, optim)
    out["sharded_legacy"] = (sharded if "error" in sharded else flat_sharded_to_neutral(sharded))
    if "error" not in sharded:
        out["flatten_legacy"] = to_cpu(guard(
            lambda: named_local(FSDP.flatten_sharded_optim_state_dict(sharded, fsdp, optim),
                                keys)))
    return out


def _load_paths(ctx, fsdp, optim, keys: list[str], full: dict) -> dict:
    """``full`` through every FSDP1 load path on this rank (scatter: from rank 0 only),
    each guarded, each as a named local dict."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType

    def to_load():
        with FSDP.state_dict_type(fsdp, StateDictType.FULL_STATE_DICT):
            return named_local(FSDP.optim_state_dict_to_load(fsdp, optim, full), keys)

    return {
        "shard_legacy": to_cpu(guard(
            lambda: named_local(FSDP.shard_full_optim_state_dict(full, fsdp), keys))),
        "scatter_legacy": to_cpu(guard(
            lambda: named_local(FSDP.scatter_full_optim_state_dict(
                full if ctx.rank == 0 else None, fsdp), keys))),
        "to_load": to_cpu(guard(to_load)),
    }


def load_full(ctx, case: Case, full: dict) -> dict:
    """Load side at this pool's world size and the case's load plan: shard a full dict
    (saved elsewhere) through every FSDP1 load path; return each rank's named local dict."""
    fsdp = wrap_fsdp1(ctx, case, plan=case.dst_plan)
    names = [(clean_name(n), p) for n, p in fsdp.named_parameters()]
    optim = build_optimizer(case.optimizer, names, case.groups)
    keys = optimizer_keys(fsdp, optim)
    out: dict[str, Any] = {"rank": ctx.rank, "keys": keys, "meta": flat_metadata(fsdp)}
    out.update(_load_paths(ctx, fsdp, optim, keys, full))
    return out
