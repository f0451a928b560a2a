"""``FSDP.rekey_optim_state_dict`` (PARAM_ID <-> PARAM_NAME) observed on a rank, in the two
uses its docstring gives, between an FSDP1 model and a plain (unwrapped) copy of the same
zoo model.

FSDP -> plain (rank 0, where ``full_optim_state_dict(rank0_only=True)`` puts the full dict)
    ``full`` (FQN keys) -> ``a_ids`` = rekey(full, PARAM_ID, plain, optim=plain_optim) ->
    ``plain_optim.load_state_dict(a_ids)`` -> ``a_loaded`` = ``plain_optim.state_dict()`` ->
    ``a_names`` = rekey(a_loaded, PARAM_NAME). ``a_ids_legacy``: the ``optim_input=None``
    path (ids = positions in ``plain.parameters()``), run only when the plain optimizer
    holds the model's params in that order (one group, all params).
    The plain optimizer mirrors the full dict's param groups (:func:`plain_optimizer_for`):
    with ``use_orig_params=False`` FSDP's groups hold flat params, so the zoo's name-based
    grouping of the FSDP optimizer is not the plain model's.
plain -> FSDP (every rank)
    a plain model and optimizer (the zoo's grouping) trained ``case.steps`` steps on the
    full global batches -> ``b_osd`` (int ids) -> ``b_names`` = rekey(b_osd, PARAM_NAME) ->
    ``b_ids`` = rekey(b_names, PARAM_ID) (the ID -> name -> ID round trip); ``b_reloaded``:
    a fresh plain optimizer loaded with ``b_ids``, its ``state_dict()``; ``b_shard``:
    ``shard_full_optim_state_dict(b_names, fsdp_model, optim=fsdp_optim)`` in the neutral
    named local form.

Rules (as in ``sut.fsdp1``)
- Every path runs in its own guard: one that raises is ``{"error": traceback}``, the others
  still run; a path skipped on purpose is ``{"n/a": reason}``.
- Rekeyed dicts keep their key types (int ids or FQNs: that is what is under test); local
  dicts of the FSDP model are in the neutral named form. Everything is a CPU clone.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..cases import Case
from ..zoo import build_optimizer, make_batch, train_step
from ..zoo.plain import plain_model, plain_optimizer, plain_optimizer_for, uses_model_order
from .common import guard
from .fsdp1 import to_cpu, clean_name, named_local, optimizer_keys, train, wrap_fsdp1


def train_plain(case: Case, model: nn.Module, optim: torch.optim.Optimizer) -> list[float]:
    """``case.steps`` steps on the full global batches, in this process only."""
    losses = []
    for step in range(case.steps):
        x = make_batch(case.model, case.seed, step, case.batch, case.torch_dtype)
        loss = train_step(model, optim, x)
        losses.append(float(loss.detach()))
    return losses


def rekey_osd(osd: dict, to: str, model: nn.Module, optim: torch.optim.Optimizer | None) -> dict:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import OptimStateKeyType

    kind = OptimStateKeyType.PARAM_ID if to == "id" else OptimStateKeyType.PARAM_NAME
    return FSDP.rekey_optim_state_dict(osd, kind, model, optim=optim)


def _plain_pair(case: Case):
    """The unwrapped zoo model and the optimizer a plain trainer builds for it (the zoo's
    grouping): the ids of a PARAM_ID dict are positions in that optimizer's groups."""
    model = plain_model(case)
    return model, plain_optimizer(case, model)


def to_param_ids(case: Case, full: dict) -> dict:
    """A full FQN-keyed dict rekeyed to PARAM_ID for the unwrapped model (rekey path)."""
    return rekey_osd(full, "id", *_plain_pair(case))


def to_param_names(case: Case, ids: dict) -> dict:
    """A PARAM_ID dict of the unwrapped model rekeyed back to FQNs (rekey path)."""
    return rekey_osd(ids, "name", *_plain_pair(case))


def _fsdp_to_plain(case: Case, full: dict) -> dict[str, Any]:
    """FSDP's full dict -> a plain optimizer (rank-local; no collectives)."""
    model = plain_model(case)
    optim, how = plain_optimizer_for(case, model, full)
    out: dict[str, Any] = {"a_groups": how}
    out["a_same_object"] = guard(lambda: rekey_osd(full, "name", model, optim) is full)
    a_ids = guard(rekey_osd, full, "id", model, optim)
    out["a_ids"] = to_cpu(a_ids)
    if "error" in a_ids:
        out["a_loaded"] = out["a_names"] = {"n/a": "rekey to PARAM_ID raised"}
    else:
        def load():
            optim.load_state_dict(a_ids)
            return optim.state_dict()

        loaded = guard(load)
        out["a_loaded"] = to_cpu(loaded)
        out["a_names"] = (to_cpu(guard(rekey_osd, loaded, "name", model, optim))
                          if "error" not in loaded else {"n/a": "load_state_dict raised"})
    if uses_model_order(model, optim):
        out["a_ids_legacy"] = to_cpu(guard(rekey_osd, full, "id", model, None))
    else:
        out["a_ids_legacy"] = {"n/a": "the plain optimizer does not hold model.parameters() in "
                                      "order (several groups or a param left out): the "
                                      "optim_input=None path does not apply"}
    return out


def observe(ctx, case: Case) -> dict:
    """Both uses of ``rekey_optim_state_dict`` on this rank (see the module docstring)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    fsdp = wrap_fsdp1(ctx, case)
    fsdp_optim = build_optimizer(case.optimizer,
                                 [(clean_name(n), p) for n, p in fsdp.named_parameters()],
                                 case.groups)
    keys = optimizer_keys(fsdp, fsdp_optim)
    losses = train(ctx, case, fsdp, fsdp_optim, case.steps)
    out: dict[str, Any] = {"rank": ctx.rank, "keys": keys, "losses": losses}

    # FSDP -> plain: the full dict lives on rank 0 only (rank0_only=True, the default)
    full = guard(FSDP.full_optim_state_dict, fsdp, fsdp_optim, rank0_only=True)
    if ctx.rank == 0:
        out["full"] = to_cpu(full)
        if "error" in full:
            na = {"n/a": "full_optim_state_dict raised (see 'full')"}
            out.update({k: na for k in ("a_ids", "a_loaded", "a_names", "a_ids_legacy")})
        else:
            out.update(_fsdp_to_plain(case, full))

    # plain -> FSDP: every rank trains the same plain model on the same global batches
    model = plain_model(case)
    optim = plain_optimizer(case, model)
    out["plain_losses"] = train_plain(case, model, optim)
    b_osd = optim.state_dict()
    out["b_osd"] = to_cpu(b_osd)
    b_names = guard(rekey_osd, b_osd, "name", model, optim)
    out["b_names"] = to_cpu(b_names)
    if "error" in b_names:
        na = {"n/a": "rekey to PARAM_NAME raised (see 'b_names')"}
        out.update(b_ids=na, b_reloaded=na, b_shard=na)
        return out
    b_ids = guard(rekey_osd, b_names, "id", model, optim)
    out["b_ids"] = to_cpu(b_ids)

    def reload():
        fresh_model = plain_model(case)
        fresh = plain_optimizer(case, fresh_model)
        fresh.load_state_dict(rekey_osd(b_names, "id", fresh_model, fresh))
        return fresh.state_dict()

    out["b_reloaded"] = to_cpu(guard(reload))
    out["b_shard"] = to_cpu(guard(lambda: named_local(
        FSDP.shard_full_optim_state_dict(b_names, fsdp, optim=fsdp_optim), keys)))
    return out
