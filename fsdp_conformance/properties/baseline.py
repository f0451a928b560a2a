"""The single-process baseline of P2 and P6: the same zoo model, optimizer and LR scheduler
trained without FSDP on the same global batches, uninterrupted.

Rule: FSDP averages gradients over ranks and every rank takes ``batch / world_size`` rows
of the global batch, so with the mean-over-batch loss of ``zoo.loss_of`` the FSDP gradient
equals the single-process one up to float rounding. Params of ignored modules are the
exception (FSDP leaves them per rank, trained on the rank's own rows); the properties leave
them out and say so.

Under a modelled torch bug (properties/expectation.py ``expecting``) the run resumes from the
modelled state: at the save point its optimizer loads ``loaded(saved(its own state))``, so
the resumed losses, params and state are what the bug predicts.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

import torch

from ..cases import LOAD_ONLY, Case
from . import expectation as expect
from ..zoo import (build_model, build_optimizer, build_scheduler, freeze_at_save, make_batch,
                   scheduler_state, train_step)


@dataclass(frozen=True)
class LocalRun:
    """Snapshots of the uninterrupted run: after ``case.steps`` (the save point) and after
    ``case.steps + case.resume_steps`` (the end of the resumed run). Optimizer dicts are
    FQN-keyed (the neutral named form)."""

    losses: tuple[float, ...]
    params_at_save: dict
    optim_at_save: dict
    params_at_end: dict
    optim_at_end: dict
    sched_at_save: dict | None = None
    """The LR scheduler's ``state_dict()`` at the save point (None: no scheduler)."""
    sched_at_end: dict | None = None
    """The LR scheduler's ``state_dict()`` at the end of the resumed run."""


def named_osd(optim: torch.optim.Optimizer, names: list[str]) -> dict:
    sd = optim.state_dict()
    clone = lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v  # noqa: E731
    return {
        "state": {names[k]: {n: clone(v) for n, v in st.items()} for k, st in sd["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]}
                         for g in sd["param_groups"]],
    }


def local_run(case: Case) -> LocalRun:
    """Train the case's model in this process (module rules), the model of the case it runs
    as under a modelled bug (``expectation.runs_as``); cached per case and modelled bug."""
    return _local_run(expect.runs_as(case), expect.current())


def _to_ids(named: dict, names: list[str]) -> dict:
    """A named optimizer dict (``named_osd``) keyed by the optimizer's ids again, each
    group's params in the optimizer's order (``names``): torch's ``load_state_dict`` pairs a
    saved group's params with the optimizer's by position, and a dict gathered from FSDP
    lists them in its own order."""
    ids = {n: i for i, n in enumerate(names)}
    return {"state": {ids[k]: st for k, st in named["state"].items()},
            "param_groups": [{**g, "params": sorted(ids[n] for n in g["params"])}
                             for g in named["param_groups"]]}


def load_exactly(optim: torch.optim.Optimizer, sd: dict) -> None:
    """``optim.load_state_dict(sd)``, then every state tensor exactly as ``sd`` holds it:
    torch's load casts floating-point state to its param's dtype (pytorch#43706, entry
    ``optim-load-casts-state-to-param-dtype``), and the baseline is the correct run, so it
    keeps the dtype it was given. ``sd`` is the optimizer's own id-keyed form; its tensors
    become the optimizer's (the caller passes a copy)."""
    optim.load_state_dict(sd)
    params = [p for g in optim.param_groups for p in g["params"]]
    for pid, st in sd["state"].items():
        mine = optim.state[params[pid]]
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and mine.get(k) is not None and \
                    mine[k].dtype != v.dtype:
                mine[k] = v


def fresh_training(case: Case):
    """The case's model, optimizer and LR scheduler as built before any step, and the
    optimizer's params as FQNs in its own order (the names ``named_osd`` keys by):
    ``(model, optim, sched or None, names)``."""
    model = build_model(case.model, case.seed, case.torch_dtype)
    named = list(model.named_parameters())
    optim = build_optimizer(case.optimizer, named, case.groups, impl=case.impl)
    sched = build_scheduler(optim, case.model) if case.scheduler else None
    order = {id(p): n for n, p in named}
    return model, optim, sched, [order[id(p)] for g in optim.param_groups for p in g["params"]]


@functools.lru_cache(maxsize=128)
def _local_run(case: Case, exp: expect.Expectation) -> LocalRun:
    # one run per training: every axis that does not change the single-process steps is
    # reset (mixed precision does; it lives on the FSDP2 round trips)
    api = "fsdp2.full" if case.mixed_precision else "fsdp1"
    base = Case(**{**case.to_dict(), **LOAD_ONLY, "world_size": 1, "api": api, "fault": "",
                   "strategy": "FULL_SHARD", "use_orig_params": False, "plan": "root",
                   "compiled": "", "reshard_after_forward": 0,
                   "flatten_optimizer_state_dict": False, "cpu_offload": "",
                   "async_save": False, "app_state": False, "ignore_frozen_params": False,
                   "tensor_parallel": 0})
    if base != case:
        return _local_run(base, exp)
    model, optim, sched, names = fresh_training(case)
    losses: list[float] = []
    snaps = {}
    for step in range(case.steps + case.resume_steps):
        if step == case.steps:
            freeze_at_save(model, case.model)  # trained, then frozen at the save (zoo)
            snaps["save"] = (_params(model), named_osd(optim, names), scheduler_state(sched))
            if exp.key:  # resume from the modelled state (module rules)
                # the effects never mutate their argument but may share its tensors (the
                # step counter): one deep copy keeps the snapshot out of the resumed
                # optimizer's in-place updates, and keeps the sharing an effect models
                modelled = exp.loaded(exp.saved(snaps["save"][1]))
                load_exactly(optim, copy.deepcopy(_to_ids(modelled, names)))
        x = make_batch(case.model, case.seed, step, case.batch, case.torch_dtype)
        loss = train_step(model, optim, x, sched, zero_grads=exp.zero_grads(step),
                          compute_dtype=case.mixed_precision_dtype)
        losses.append(float(loss.detach().to(torch.float64)))
    if "save" not in snaps:
        freeze_at_save(model, case.model)
        snaps["save"] = (_params(model), named_osd(optim, names), scheduler_state(sched))
    return LocalRun(tuple(losses), snaps["save"][0], snaps["save"][1], _params(model),
                    named_osd(optim, names), snaps["save"][2], scheduler_state(sched))



def continue_from(case: Case, params: dict, state: dict) -> LocalRun:
    """The uninterrupted continuation of a given training state, in this process: the
    case's model with ``params`` (by FQN), its optimizer with ``state`` (a named optimizer
    dict, ``named_osd``'s form) and the LR scheduler, trained the case's ``resume_steps``
    on the same global batches as every other run. bfloat16's P6 (run_props
    ``p6_resume``) compares a resumed FSDP run with this continuation of FSDP's own state
    at the save: both start from the same bits, so they differ by the resumed steps'
    gradient rounding only, not by the drift of the steps before the save.

    ``params_at_save`` / ``optim_at_save`` are the start as given; ``losses`` are the
    resumed steps' only."""
    model, optim, sched, names = fresh_training(case)
    missing = sorted(set(n for n, _ in model.named_parameters()) - set(params))
    if missing:
        raise KeyError(f"no start value for params {missing}")
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(params[n])
    freeze_at_save(model, case.model)
    load_exactly(optim, copy.deepcopy(_to_ids(state, names)))
    sched_at_save = local_run(case).sched_at_save if sched is not None else None
    if sched is not None:  # the scheduler as it was at the save
        sched.load_state_dict(copy.deepcopy(sched_at_save))
    losses = []
    for step in range(case.steps, case.steps + case.resume_steps):
        x = make_batch(case.model, case.seed, step, case.batch, case.torch_dtype)
        loss = train_step(model, optim, x, sched, compute_dtype=case.mixed_precision_dtype)
        losses.append(float(loss.detach().to(torch.float64)))
    return LocalRun(tuple(losses), params, state, _params(model), named_osd(optim, names),
                    sched_at_save, scheduler_state(sched))


def _params(model: torch.nn.Module) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters()}
