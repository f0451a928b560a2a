"""FSDP2 (``fully_shard``) observed on a rank: build the case's model, shard it, train, then
call every ``torch.distributed.checkpoint.state_dict`` optimizer path and return what each
produced, in the neutral named form of ``fsdp_conformance.reference`` (keys = FQNs).

Rules
- Wrapping: ``fully_shard`` on every submodule of the case's plan, deepest first (a module
  is sharded before any ancestor; equal depth in plan order), then on the root, all on one
  CPU/CUDA ``DeviceMesh`` over the pool's ranks: 1-D ``(ws,)``; HYBRID_SHARD: 2-D
  ``(ws // S, S)`` (HSDP, ``S = shard_group_size``); NO_SHARD: ``(ws, 1)``;
  SHARD_GRAD_OP: ``reshard_after_forward=False``. Tensor parallelism (degree T): the zoo
  model's ``tp_plan`` by ``parallelize_module`` on the "tp" dim of a ``(ws // T, T)`` mesh,
  then ``fully_shard`` as above on its "dp" dim. Params of the zoo's ignored modules are
  passed as ``ignored_params`` (they stay plain tensors). A user model registered with a
  ``shard_fn(model, mesh)`` is sharded by it instead (the mesh as above; the plan unused).
- Keys: ``model.named_parameters()`` names (``fully_shard`` adds no prefix); the int ids
  of ``optim.state_dict()`` are mapped by the optimizer's own param order.
- DTensor values: in local dicts, their ``to_local()`` tensor; in the sharded dict, a
  record ``{"global_shape", "dtensor": True, "local", "placements", "mesh_shape",
  "coordinate", "torch_offset"}`` (placements as ``("shard", dim)`` / ``("strided_shard",
  dim, split_factor)`` / ``("replicate",)`` / ``repr``; ``torch_offset``: torch's own
  global offset of the local piece), plus ``"pieces"``: the reference's reading of the
  live DTensor (``reference.to_pieces``).
- Each API path runs in its own try block: a path that raises is reported as
  ``{"error": traceback}`` for that path, and the other paths still run. A path that is
  skipped on purpose says why in ``{"n/a": reason}``. A load path that could leave ranks
  waiting in a collective (broadcast from rank 0 after rank 0 rejected the dict) is
  skipped on every rank when the same dict already failed to load without broadcast.
- Everything returned is on CPU, detached and cloned, so it pickles.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import reference as ref
from ..cases import Case, shard_group_size
from ..zoo import build_model, build_optimizer, model_spec
from .common import guard
from .fsdp1 import named_local, optimizer_keys, train
from .records import NotApplicableHere


def is_dtensor(x: Any) -> bool:
    return hasattr(x, "to_local") and hasattr(x, "placements") and hasattr(x, "device_mesh")


def local_to_cpu(x: Any) -> Any:
    """Detached CPU clones; DTensors become their local tensor."""
    if is_dtensor(x):
        x = x.to_local()
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", copy=True)
    if isinstance(x, dict):
        return {k: local_to_cpu(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(local_to_cpu(v) for v in x)
    return x


def _placement(p) -> tuple:
    """``("shard", dim)``, ``("strided_shard", dim, split_factor)``, ``("replicate",)``, or
    ``(repr,)`` for anything else."""
    if hasattr(p, "split_factor"):
        return ("strided_shard", int(p.dim), int(p.split_factor))
    if p.is_shard():
        return ("shard", int(p.dim))
    if p.is_replicate():
        return ("replicate",)
    return (repr(p),)


def torch_piece(v) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(local shape, global offset) of this rank's piece of the DTensor ``v``, as torch itself
    computes them (``compute_local_shape_and_global_offset``)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(v.shape, v.device_mesh, v.placements)
    return tuple(int(d) for d in shape), tuple(int(o) for o in offset)


def dtensor_record(v) -> dict:
    """A live DTensor as plain data (module docstring)."""
    _, offset = torch_piece(v)
    pieces = guard(ref.to_pieces, v)
    return {"global_shape": tuple(v.shape), "dtensor": True, "local": local_to_cpu(v.to_local()),
            "placements": [_placement(p) for p in v.placements],
            "mesh_shape": tuple(v.device_mesh.shape),
            "coordinate": tuple(v.device_mesh.get_coordinate()),
            "torch_offset": offset,
            "pieces": local_to_cpu(pieces)}


def param_layout(model: nn.Module) -> list[dict]:
    """FSDP2's actual per-parameter layout on this rank (what P0 compares with the reference):
    for each ``named_parameters()`` entry its global shape and, for a DTensor, its local
    shape, placements and torch's global offset of the local piece."""
    out = []
    for n, p in model.named_parameters():
        row = {"fqn": n, "shape": tuple(p.shape), "dtensor": is_dtensor(p)}
        if row["dtensor"]:
            row.update(local_shape=tuple(p.to_local().shape), offset=torch_piece(p)[1],
                       placements=[_placement(x) for x in p.placements])
        out.append(row)
    return out


def sharded_record(sharded: dict) -> dict:
    """A sharded (DTensor-valued) optimizer dict as plain data, FQN-keyed."""
    state = {k: {n: dtensor_record(v) if is_dtensor(v) else local_to_cpu(v) for n, v in st.items()}
             for k, st in sharded.get("state", {}).items()}
    return {"state": state, "param_groups": local_to_cpu(sharded.get("param_groups", []))}


def _mesh(ctx, case: Case, tensor_parallel: int = 0):
    """The pool's DeviceMesh for the case (cached on the rank: a 2-D mesh creates groups);
    ``tensor_parallel`` T: the ``(ws // T, T)`` mesh named ("dp", "tp")."""
    from torch.distributed.device_mesh import init_device_mesh

    ws = ctx.world_size
    if tensor_parallel:
        shape, names = (ws // tensor_parallel, tensor_parallel), ("dp", "tp")
    else:
        s = shard_group_size(case, ws)
        two_d = case.strategy in ("HYBRID_SHARD", "NO_SHARD")
        shape = (ws // s, s) if two_d else (ws,)
        names = ("replicate", "shard") if two_d else ("shard",)
    key = ("fsdp2-mesh", ctx.device.type, shape, names)
    mesh = ctx.cache.get(key)
    if mesh is None:
        mesh = init_device_mesh(ctx.device.type, shape, mesh_dim_names=names)
        ctx.cache[key] = mesh
    return mesh


def mesh_shape(ctx, case: Case, tensor_parallel: int = 0) -> tuple[int, ...]:
    return tuple(_mesh(ctx, case, tensor_parallel).shape)


def tensor_parallelize(model: nn.Module, name: str, tp_mesh) -> None:
    """``parallelize_module`` of the zoo model ``name``'s ``tp_plan`` on ``tp_mesh``
    (``ColwiseParallel`` / ``RowwiseParallel`` with torch's defaults)."""
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    plan = model_spec(name).tp_plan
    if not plan:
        raise ValueError(f"zoo model {name!r} has no tensor-parallel plan (ModelSpec.tp_plan); "
                         "models with one: zoo.TP_MODELS")
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    parallelize_module(model, tp_mesh, {fqn: styles[style]() for fqn, style in plan})


def shard_order(model: nn.Module, plan_fqns) -> list[str]:
    """Plan submodules deepest first (equal depth: plan order): ``fully_shard`` must see a
    submodule before any of its ancestors."""
    names = dict(model.named_modules())
    fqns = [f for f in dict.fromkeys(plan_fqns) if f]
    for f in fqns:
        if f not in names:
            raise ValueError(f"plan names no submodule {f!r}")
    return sorted(fqns, key=lambda f: -f.count("."))


def wrap_fsdp2(ctx, case: Case, plan: str | None = None,
               tensor_parallel: int | None = None) -> nn.Module:
    """Build the zoo model and ``fully_shard`` it as the case says (module docstring);
    ``tensor_parallel`` (default the save side's, ``case.tensor_parallel``): first
    ``parallelize_module`` on the mesh's "tp" dim, then ``fully_shard`` on its "dp" dim."""
    from torch.distributed.fsdp import fully_shard

    tp = case.tensor_parallel if tensor_parallel is None else tensor_parallel
    spec = model_spec(case.model)
    model = build_model(case.model, case.seed, case.torch_dtype).to(ctx.device)
    mesh = _mesh(ctx, case, tp)
    if tp:
        tensor_parallelize(model, case.model, mesh["tp"])
        mesh = mesh["dp"]
    ignored = {p for f in spec.ignored for p in model.get_submodule(f).parameters()}
    kw: dict[str, Any] = {"mesh": mesh}
    if case.strategy == "SHARD_GRAD_OP":
        kw["reshard_after_forward"] = False
    if case.reshard_after_forward:
        kw["reshard_after_forward"] = case.reshard_after_forward
    if case.cpu_offload:
        from torch.distributed.fsdp import CPUOffloadPolicy

        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=case.cpu_offload == "pinned")
    if case.mixed_precision:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=case.mixed_precision_dtype,
                                               reduce_dtype=case.torch_dtype)
    if ignored:
        kw["ignored_params"] = ignored
    if spec.shard_fn is not None:  # a user's own sharding (zoo ModelSpec.shard_fn)
        out = spec.shard_fn(model, mesh)
        return model if out is None else out
    try:
        for f in shard_order(model, spec.plans[plan or case.plan]):
            fully_shard(model.get_submodule(f), **kw)
        fully_shard(model, **kw)
    except RuntimeError as exc:
        _refused_here(case, exc)
        raise
    return model


PIN_REFUSALS = (
    "Cannot access accelerator device when none is available",  # a CPU wheel (2.13+cpu)
    "Found no NVIDIA driver on your system",  # a CUDA wheel on a machine without a GPU (2.15)
)
"""torch's refusals to pin host memory where no accelerator is, as each build words it."""


def _refused_here(case: Case, exc: RuntimeError) -> None:
    """Raise ``NotApplicableHere`` when ``exc`` is torch refusing pinned CPU offload on a
    machine without an accelerator (pinned host memory exists for copies to one); any other
    exception is left to propagate."""
    accel = getattr(torch, "accelerator", None)
    if (case.cpu_offload != "pinned" or not any(r in str(exc) for r in PIN_REFUSALS)
            or (accel is not None and accel.is_available())):
        return
    import os
    import traceback

    last = traceback.extract_tb(exc.__traceback__)[-1]
    raise NotApplicableHere(
        f"CPUOffloadPolicy(pin_memory=True) pins the CPU copy of the params for transfers to an "
        f"accelerator, and this machine has none: fully_shard raised RuntimeError: {exc} "
        f"(in {last.name}, {os.path.basename(last.filename)}:{last.lineno})") from exc


def _optimizer(case: Case, model: nn.Module):
    optim = build_optimizer(case.optimizer, list(model.named_parameters()), case.groups)
    return optim, optimizer_keys(model, optim)


def local_state(model: nn.Module, optim, keys: list[str]) -> dict:
    """The rank's ``optim.state_dict()``: FQN-keyed, DTensors as their local tensors, CPU."""
    return local_to_cpu(named_local(optim.state_dict(), keys))


def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kw)


CORE_SAVES = ("full", "sharded")
EXTRA_SAVES = ("full_rank0", "sharded_offload", "flattened")


def save_paths(ctx, model: nn.Module, optim, extras: bool = True) -> dict:
    """Every ``get_optimizer_state_dict`` variant on this rank (live objects, not yet CPU),
    each guarded; ``extras=False``: only ``CORE_SAVES``, the others ``{"n/a": ...}``."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    def get(**kw):
        return guard(get_optimizer_state_dict, model, optim, options=_options(**kw))

    out = {"full": get(full_state_dict=True), "sharded": get(full_state_dict=False)}
    if not extras:
        return {**out, **dict.fromkeys(EXTRA_SAVES, {"n/a": "extras not requested"})}
    return {
        **out,
        "full_rank0": get(full_state_dict=True, cpu_offload=True),
        "sharded_offload": get(full_state_dict=False, cpu_offload=True),
        "flattened": get(full_state_dict=True, flatten_optimizer_state_dict=True),
    }


def _agree_all(ctx, ok: bool) -> bool:
    """True on every rank iff ``ok`` on every rank (one all_reduce)."""
    import torch.distributed as dist

    t = torch.tensor([0 if ok else 1], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(t, group=ctx.group)
    return int(t.item()) == 0


def _fresh(ctx, case: Case, plan: str):
    model = wrap_fsdp2(ctx, case, plan)
    optim, keys = _optimizer(case, model)
    return model, optim, keys


def load_paths(ctx, case: Case, plan: str, full: dict | None, *, flattened: dict | None = None,
               sharded: dict | None = None, strict_off: bool = True) -> dict:
    """Load the given dicts through every ``set_optimizer_state_dict`` path, each into a fresh
    model and optimizer (the load-side plan, this pool's world size); return each path's
    local state after loading (a named local dict), or its error.

    ``full``: the FQN-keyed full dict (on every rank; for ``set_full_broadcast`` only rank
    0's is passed, the others pass ``{}``). ``flattened``: the same, flattened. ``sharded``:
    the live DTensor dict of a model of the same mesh and plan. ``strict_off``: also run
    ``set_full_nonstrict`` / ``set_full_broadcast_nonstrict`` (``strict=False``). A
    broadcast path runs only if its non-broadcast twin loaded on every rank."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    out: dict[str, Any] = {}

    def run(name, osd, **kw):
        model, optim, keys = _fresh(ctx, case, plan)
        res = guard(set_optimizer_state_dict, model, optim, osd, options=_options(**kw))
        out[name] = res if isinstance(res, dict) and "error" in res else local_state(model, optim, keys)

    if full is not None:
        variants = [("set_full", {})] + ([("set_full_nonstrict", {"strict": False})] if strict_off else [])
        for name, extra in variants:
            run(name, local_to_cpu(full), full_state_dict=True, **extra)
            bname = name.replace("set_full", "set_full_broadcast")
            if _agree_all(ctx, "error" not in out[name]):
                run(bname, local_to_cpu(full) if ctx.rank == 0 else {}, full_state_dict=True,
                    broadcast_from_rank0=True, **extra)
            else:
                out[bname] = {"n/a": f"skipped: {name} rejected this dict on some rank; with "
                                     "broadcast_from_rank0 the other ranks could wait for rank 0 "
                                     "forever"}
    if flattened is not None:
        run("set_flattened", local_to_cpu(flattened), full_state_dict=True, flatten_optimizer_state_dict=True)
    if sharded is not None:
        run("set_sharded", sharded, full_state_dict=False)
    return out


def observe(ctx, case: Case, nonstrict: bool = True, extras: bool = True) -> dict:
    """Save side: train ``case.steps`` steps, then every FSDP2 save path's output on this rank,
    and the dicts loaded back at the same world size and plan: rank 0's full and flattened
    dicts (what a checkpoint written by rank 0 holds) and each rank's own sharded dict.
    ``nonstrict``: also the ``strict=False`` full-dict paths (they differ from the strict ones
    only where the checkpoint lacks state a trainable param has on the load side).
    ``extras``: also ``EXTRA_SAVES`` (rank-0-only and offloaded dicts, the flattened dict)
    and loading the flattened dict; without them those paths read ``{"n/a": ...}``."""
    model, optim, keys = _fresh(ctx, case, case.plan)
    losses = train(ctx, case, model, optim, case.steps)
    out: dict[str, Any] = {"rank": ctx.rank, "keys": keys, "losses": losses,
                           "mesh_shape": mesh_shape(ctx, case), "meta": param_layout(model)}
    out["local"] = local_state(model, optim, keys)
    saved = save_paths(ctx, model, optim, extras)
    for name in ("full", "full_rank0", "flattened"):
        out[name] = local_to_cpu(saved[name])
    for name in ("sharded", "sharded_offload"):
        v = saved[name]
        out[name] = v if "error" in v or "n/a" in v else guard(sharded_record, v)
    ok = {k: "error" not in saved[k] and "n/a" not in saved[k]
          for k in ("full", "flattened", "sharded")}
    if not _agree_all(ctx, ok["full"] and ok["sharded"] and (ok["flattened"] or not extras)):
        ok = dict.fromkeys(ok, False)  # every rank must take the same load paths
    # what a checkpoint holds: rank 0's full dict (ignored params: rank 0's own values)
    full = _from_rank0(ctx, local_to_cpu(saved["full"])) if ok["full"] else None
    flat = _from_rank0(ctx, local_to_cpu(saved["flattened"])) if ok["flattened"] and extras else None
    sharded = saved["sharded"] if ok["sharded"] else None
    out.update(load_paths(ctx, case, case.plan, full, flattened=flat, sharded=sharded,
                          strict_off=nonstrict))
    return out


def _from_rank0(ctx, obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (one object broadcast)."""
    import torch.distributed as dist

    box = [obj if ctx.rank == 0 else None]
    dist.broadcast_object_list(box, src=0, group=ctx.group)
    return box[0]


def save_full(ctx, case: Case) -> dict:
    """Save side only: train ``case.steps`` steps; the rank's local state and its full dict
    (``get_optimizer_state_dict(full_state_dict=True)``)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    model, optim, keys = _fresh(ctx, case, case.plan)
    losses = train(ctx, case, model, optim, case.steps)
    full = guard(get_optimizer_state_dict, model, optim, options=_options(full_state_dict=True))
    return {"rank": ctx.rank, "keys": keys, "losses": losses, "mesh_shape": mesh_shape(ctx, case),
            "local": local_state(model, optim, keys), "full": local_to_cpu(full)}


def load_full(ctx, case: Case, full: dict, nonstrict: bool = True) -> dict:
    """Load side at this pool's world size and the case's load plan: the full dict (saved
    elsewhere) through every full-dict ``set_optimizer_state_dict`` path (``nonstrict``:
    the ``strict=False`` ones too)."""
    model = wrap_fsdp2(ctx, case, case.dst_plan)
    optim, keys = _optimizer(case, model)
    out: dict[str, Any] = {"rank": ctx.rank, "keys": keys, "mesh_shape": mesh_shape(ctx, case),
                           "meta": param_layout(model)}
    out.update(load_paths(ctx, case, case.dst_plan, full, strict_off=nonstrict))
    return out


def full_params(model) -> dict[str, torch.Tensor]:
    """Every param of the model, unsharded (``full_tensor()``: a collective), by FQN."""
    out = {}
    for n, p in model.named_parameters():
        t = p.full_tensor() if is_dtensor(p) else p
        out[n] = t.detach().to("cpu", copy=True)
    return out


def load_params(ctx, model, params: dict[str, torch.Tensor]) -> None:
    """The saved params into the load side's model (not under test; every rank holds
    ``params``): each rank copies its own piece of every param the file has, at torch's
    offset and shape of that piece (``torch_piece``, which P0 checks against the
    reference); plain (ignored) params whole. No state-dict API: torch
    2.13 and 2.15 raise a bare AssertionError loading a full model state dict on every
    rank into FSDP2 over tensor parallelism with uneven dp rows, and 2.8 fails the same
    load with ``broadcast_from_rank0`` (notes/repro/tp_uneven_full_load.py)."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n not in params:
                continue
            full = params[n]
            if is_dtensor(p):
                shape, off = torch_piece(p)
                full = full[tuple(slice(o, o + d) for o, d in zip(off, shape))]
                p = p.to_local()
            p.copy_(full)


def sharded_to_neutral(sharded: dict) -> dict:
    """DTensor values -> ``{"global_shape", "local", "offsets"}`` (torch's global offset of
    the local piece); everything else CPU clones."""
    state = {}
    for fqn, st in sharded.get("state", {}).items():
        conv = {}
        for n, v in st.items():
            if is_dtensor(v):
                conv[n] = {"global_shape": tuple(v.shape), "dtensor": True,
                           "local": local_to_cpu(v.to_local()), "offsets": torch_piece(v)[1]}
            else:
                conv[n] = local_to_cpu(v)
        state[fqn] = conv
    return {"state": state, "param_groups": local_to_cpu(sharded.get("param_groups", []))}


def state_dict_options(case: Case | None = None, **kw):
    """``StateDictOptions(**kw)``, flattened and without the model's frozen params where the
    case says (``Case.flatten_optimizer_state_dict``, ``Case.ignore_frozen_params``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    if case is not None and case.flatten_optimizer_state_dict:
        kw["flatten_optimizer_state_dict"] = True
    if case is not None and case.ignore_frozen_params:
        kw["ignore_frozen_params"] = True
    return StateDictOptions(**kw)


def load_options(case: Case, **kw):
    """``state_dict_options`` of a load: ``strict=False`` where the case says
    (``Case.nonstrict``)."""
    if case.nonstrict:
        kw["strict"] = False
    return state_dict_options(case, **kw)


def own_mixed_precision(model: nn.Module) -> str:
    """The dtype name ("bf16", "fp16", "fp32") a ``MixedPrecisionPolicy`` applied by the
    model's own sharding (a user's ``shard_fn``) computes in, where it is coarser than the
    params; "" where no FSDP module of the model has one."""
    import torch
    from torch.distributed.fsdp import FSDPModule

    names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
    params = {p.dtype for p in model.parameters()}
    for m in model.modules():
        if not isinstance(m, FSDPModule):
            continue
        policy = getattr(m._get_fsdp_state(), "_mp_policy", None)
        dtype = getattr(policy, "param_dtype", None)
        if dtype is not None and dtype not in params and dtype in names:
            return names[dtype]
    return ""

