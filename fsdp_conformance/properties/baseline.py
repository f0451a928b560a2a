"""The single-process baseline of P2 and P6: the same zoo model, optimizer and LR scheduler
trained without FSDP on the same global batches, uninterrupted.

Rule: FSDP averages gradients over ranks and every rank takes ``batch / world_size`` rows
of the global batch, so with the mean-over-batch loss of ``zoo.loss_of`` the FSDP gradient
equals the single-process one up to float rounding. Params of ignored modules are the
exception (FSDP leaves them per rank, trained on the rank's own rows); the properties leave
them out and say so.

Under a modelled torch bug (properties/expectation.py ``Expectation``) the run resumes from the
modelled state: at the save point its optimizer loads
``loaded(shards_from(saved(its own state)))``, so the resumed losses, params and state are
what the bug predicts.

A modelled load that differs between the load side's ranks (``Expectation.by_rank``: e.g.
each HYBRID_SHARD replica loads another state) cannot be resumed as one run: each load rank
r starts from the modelled state as rank r loads it (``Expectation.on_rank``; the ranks of one
replica of the load side's layout must start alike, or the model does not apply), ranks with
the same start form one replica, and the resumed steps are trained as FSDP trains them (the data-
parallel rule): rank r computes the gradient of its rows ``x[r::M]`` (M load ranks) on its
replica's params, every replica steps on the mean of the M gradients, and the loss is the
mean of the M losses. ``LocalRun.end_of(r)`` is rank r's end. Ranks of one copy that start
apart (e.g. ``fully_shard`` ranks that resume at their own lr: a load that keeps a group key
on rank 0 alone) are modelled where each holds rows of the one copy and the optimizer is
elementwise (``zoo.optimizers.ELEMENTWISE``): one copy is trained per distinct start, and
after every step each rank's piece of every param and param-shaped state tensor is taken
from the copy it steps (``_stitch``), which is what the ranks hold together; anything else
is not modelled (a ``ValueError``: the model explains nothing).

A modelled bug that leaves part of a gradient un-reduced (``Expectation.local_grads``: the
gradient of a param through one module's use of it stays on each rank) trains the save
side's ranks apart from the first step by the same rule, each rank adding its own part to
the mean of the rest (``_own_uses`` takes that use apart with a stand-in leaf);
``LocalRun.save_of(r)`` is rank r's state at the save. The resumed run of such ranks is not
modelled (the run has no end there).
"""
from __future__ import annotations

import contextlib
import copy
import functools
from dataclasses import dataclass

import torch

from ..cases import FSDP2_ROUND_TRIPS, SINGLE_PROCESS, Case
from .expectation import EXACT, Expectation
from ..zoo import (build_model, build_optimizer, build_scheduler, freeze_at_save, loss_of,
                   make_batch, scheduler_state, train_step)
from ..zoo.models import mixed_precision_backward
from ..zoo.optimizers import ELEMENTWISE
from .statediff import diff_state_dicts
from .layouts import fsdp2_reference_layout, reference_layout
from .exact_load import load_exactly
from ..reference.keys import clone_value
from .shard_training import shard_run


@dataclass(frozen=True)
class LocalRun:
    """Snapshots of the uninterrupted run: after ``case.steps`` (the save point) and after
    ``case.steps + case.resume_steps`` (the end of the resumed run). Optimizer dicts are
    FQN-keyed (the neutral named form)."""

    losses: tuple[float, ...]
    """The mean loss of every step, the resumed ones included."""
    params_at_save: dict
    """Rank 0's params at the save point."""
    optim_at_save: dict
    """Rank 0's optimizer dict at the save point."""
    params_at_end: dict | None
    """Rank 0's params at the end of the resumed run (None: the run has no resumed part)."""
    optim_at_end: dict | None
    """Rank 0's optimizer dict at the end of the resumed run (None: no resumed part)."""
    sched_at_save: dict | None = None
    """The LR scheduler's ``state_dict()`` at the save point (None: no scheduler)."""
    sched_at_end: dict | None = None
    """The LR scheduler's ``state_dict()`` at the end of the resumed run."""
    rank_saves: tuple[dict, ...] = ()
    """Each save rank's optimizer dict at the save point, where the ranks train apart
    (module rules); empty: every rank saves ``optim_at_save`` (then rank 0's)."""
    rank_ends: tuple[tuple[dict, dict], ...] = ()
    """Each load rank's (params, optimizer dict) at the end of the resumed run, where the
    modelled load differs between ranks (module rules); empty: every rank ends as
    ``params_at_end`` / ``optim_at_end`` (then rank 0's)."""

    def save_of(self, rank: int) -> dict:
        """Rank ``rank``'s optimizer dict at the save point."""
        return self.rank_saves[rank] if self.rank_saves else self.optim_at_save

    def end_of(self, rank: int) -> tuple[dict, dict]:
        """Rank ``rank``'s (params, optimizer dict) at the end of the resumed run."""
        return self.rank_ends[rank] if self.rank_ends else (self.params_at_end,
                                                             self.optim_at_end)


def named_osd(optim: torch.optim.Optimizer, names: list[str]) -> dict:
    sd = optim.state_dict()
    # every value detached from the live optimizer: clone_value deep-copies lists too (LBFGS
    # appends its history to lists of tensors at later steps, optim/lbfgs.py)
    return {
        "state": {names[k]: {n: clone_value(v) for n, v in st.items()}
                  for k, st in sd["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]}
                         for g in sd["param_groups"]],
    }


def local_run(case: Case, exp: Expectation = EXACT) -> LocalRun:
    """Train the case's model in this process (module rules), the model of the case it runs
    as under the modelled bug ``exp`` (``Expectation.runs_as``); cached per case and
    modelled bug.
    Under a load modelled per rank whose ranks start apart, the resumed steps are trained
    one replica per distinct start; under gradients that ranks keep to themselves, every
    rank is a replica from the first step (module rules)."""
    case = exp.runs_as(case)
    if exp.on_shards:
        return _shards_run(case, exp)
    if case.world_size > 1 and exp.local_grads(case):
        return _apart_run(case, exp)
    if exp.by_rank and case.resume_steps:
        return _replicas_run(case, exp)
    return _local_run(case, exp)


@functools.lru_cache(maxsize=16)
def _shards_run(case: Case, exp: Expectation) -> LocalRun:
    """The run as FSDP1's ranks step their own shards (properties/shard_training.py),
    resumed from the state a load leaves under ``exp``; one load rank's start for all (a
    load modelled per rank is not modelled with it)."""
    if exp.by_rank or exp.local_grads(case) or any(exp.zero_grads(s) for s in range(
            case.steps + case.resume_steps)):
        raise ValueError("an optimizer stepping FSDP1's shards is modelled alone: not with a "
                         "load per rank, gradients kept per rank or zero gradients")
    run = shard_run(case, lambda full: _modelled_start(exp, full))
    return LocalRun(run.losses, run.params_at_save, run.optim_at_save, run.params_at_end,
                    run.optim_at_end)


def _modelled_start(exp: Expectation, state: dict) -> dict:
    """The state a load leaves under ``exp`` on the judged rank, from the state saved."""
    return exp.loaded(exp.shards_from(exp.saved(state)))


@functools.lru_cache(maxsize=16)
def _replicas_run(case: Case, exp: Expectation) -> LocalRun:
    """The uninterrupted run up to the save, then each load rank resumed from the state
    ``exp`` has it load (module rules): the single run where every rank starts the same."""
    run = _local_run(case, exp)
    starts = []
    for r in range(case.dst_world_size):
        starts.append(_modelled_start(exp.on_rank(r), run.optim_at_save))
    distinct: list[dict] = []
    replica_of = [0] * len(starts)

    def copy_of(st: dict) -> int:
        """The copy trained from ``st``: starts bitwise the same train as one."""
        k = next((i for i, d in enumerate(distinct) if not diff_state_dicts(d, st)), None)
        if k is None:
            distinct.append(st)
            k = len(distinct) - 1
        return k

    groups = _load_replicas(case, exp)
    stitched = False
    for group in groups:  # one replica is one copy of the state: one start
        st = starts[group[0]]
        apart = [r for r in group if diff_state_dicts(st, starts[r])]
        if apart and not _stitchable(case, groups):
            raise ValueError(f"the modelled load gives ranks {apart} another state than rank "
                             f"{group[0]} of their replica {list(group)}: not modelled")
        stitched |= bool(apart)  # every rank its own start; its rows stitched (module rules)
        k = copy_of(st)
        for r in group:
            replica_of[r] = copy_of(starts[r]) if apart else k
    if len(distinct) == 1:
        return run
    reps = [_started(case, run.params_at_save, st, run.sched_at_save) for st in distinct]
    stitch = (functools.partial(_stitch, fsdp2_reference_layout(case, load_side=True, exp=exp),
                                reps, replica_of) if stitched else lambda: None)
    stitch()
    losses = list(run.losses[:case.steps])
    for step in range(case.steps, case.steps + case.resume_steps):
        losses.append(_dp_step(case, reps, replica_of, step, zero_grads=exp.zero_grads(step)))
        stitch()
    ends = [(_params(model), named_osd(optim, names)) for model, optim, _, names in reps]
    rank_ends = tuple(ends[k] for k in replica_of)
    return LocalRun(tuple(losses), run.params_at_save, run.optim_at_save, *rank_ends[0],
                    run.sched_at_save, scheduler_state(reps[0][2]), rank_ends=rank_ends)


def _stitchable(case: Case, groups: tuple[tuple[int, ...], ...]) -> bool:
    """Whether ranks of one replica that start apart can be trained as FSDP trains them: a
    ``fully_shard`` load side with one shard group (every rank holds rows of one copy) and
    an optimizer whose update of an element reads only that element's param, gradient and
    state (``zoo.ELEMENTWISE``)."""
    return case.family == "fsdp2" and len(groups) == 1 and case.optimizer in ELEMENTWISE


@torch.no_grad()
def _stitch(layout, reps: list, replica_of: list[int]) -> None:
    """Every copy's params and param-shaped state tensors made the one the ranks hold
    together: rank r's piece (``layout``'s box of r) from the copy rank r steps
    (``replica_of[r]``); a param outside FSDP (whole on every rank) would train apart on
    each rank: not modelled."""
    models = [dict(model.named_parameters()) for model, *_ in reps]
    for p in layout.params:
        if not p.sharded:
            raise ValueError(f"param {p.fqn!r} is whole on every rank: ranks that start "
                             f"apart train it apart (not modelled)")
        own = [m[p.fqn] for m in models]
        states = [optim.state.get(t, {}) for t, (_, optim, *_) in zip(own, reps)]
        for r, k in enumerate(replica_of):
            box = p.slices(r)
            for j in range(len(reps)):
                if j == k:
                    continue
                own[j][box] = own[k][box]
                for name, v in states[k].items():
                    if isinstance(v, torch.Tensor) and v.shape == own[k].shape:
                        states[j][name][box] = v[box]


def _load_replicas(case: Case, exp: Expectation) -> tuple[tuple[int, ...], ...]:
    """The load side's replicas (its reference layout's ``replicas()``)."""
    lay = (fsdp2_reference_layout(case, load_side=True, exp=exp) if case.family == "fsdp2"
           else reference_layout(case, load_side=True, exp=exp))
    return lay.replicas()


@functools.lru_cache(maxsize=16)
def _apart_run(case: Case, exp: Expectation) -> LocalRun:
    """The save side's ``world_size`` ranks trained apart from the first step, each keeping
    the gradients ``exp.local_grads`` names to itself (module rules); the run ends at the
    save (the resumed run of ranks that trained apart is not modelled: no end)."""
    if case.mixed_precision_dtype is not None:
        raise ValueError("ranks that train apart are not modelled under mixed precision")
    reps = [fresh_training(case) for _ in range(case.world_size)]
    losses = [_dp_step(case, reps, list(range(case.world_size)), step,
                       exp.local_grads(case), exp.zero_grads(step))
              for step in range(case.steps)]
    saves = []
    for model, optim, _, names in reps:
        freeze_at_save(model, case.model)
        saves.append(named_osd(optim, names))
    return LocalRun(tuple(losses), _params(reps[0][0]), saves[0], None, None,
                    scheduler_state(reps[0][2]), None, rank_saves=tuple(saves))


def _dp_step(case: Case, reps: list, replica_of: list[int], step: int,
             local_uses: dict | None = None, zero_grads: frozenset = frozenset()) -> float:
    """One training step of the ranks as FSDP takes it (module rules): rank r computes the
    gradient of its rows ``x[r::M]`` on its replica's params (``reps[replica_of[r]]``, as
    ``fresh_training`` gives them), every replica steps on the mean of the M gradients;
    ``local_uses`` ``{param: module}``: the gradient through that module's use of the param
    is each rank's own, added to the mean of the rest (each rank is then its own
    replica). Returns the mean of the M losses."""
    m = len(replica_of)
    local_uses = local_uses or {}
    if local_uses and sorted(replica_of) != list(range(m)):
        raise ValueError("ranks that keep gradients to themselves are replicas of their own")
    x = make_batch(case.model, case.seed, step, case.batch, case.torch_dtype)
    grads: dict[str, torch.Tensor] = {}
    own: list[dict[str, torch.Tensor]] = []
    total = 0.0
    for r in range(m):  # rank r: its rows, its replica's params
        model = reps[replica_of[r]][0]
        model.zero_grad(set_to_none=True)
        params = dict(model.named_parameters())
        with _own_uses(model, local_uses) as twins:
            if case.mixed_precision_dtype is None:
                loss = loss_of(model, x[r::m])
                loss.backward()
            else:
                loss = mixed_precision_backward(model, x[r::m], case.mixed_precision_dtype)
        own.append({n: t.grad for n, t in twins.items() if t.grad is not None})
        total += float(loss.detach().to(torch.float64))
        for n, p in params.items():
            if p.grad is not None:
                grads[n] = grads[n] + p.grad if n in grads else p.grad.clone()
    for k, (model, optim, sched, _) in enumerate(reps):  # each replica: the mean gradient
        optim.zero_grad(set_to_none=True)
        mine = own[replica_of.index(k)] if local_uses else {}
        for n, p in model.named_parameters():
            g = grads[n] / m if n in grads else None
            if n in mine:
                g = mine[n] if g is None else g + mine[n]
            if g is None and n in zero_grads:
                g = torch.zeros_like(p)
            p.grad = g
        optim.step()
        if sched is not None:
            sched.step()
    return total / m


@contextlib.contextmanager
def _own_uses(model: torch.nn.Module, uses: dict):
    """Inside the block, the module of each ``{param: module}`` pair uses a stand-in leaf
    (a copy of the param) in its place, so backward gives that use's gradient apart:
    yields ``{param: stand-in}``, keyed by the param's name in ``named_parameters()`` (a
    tied param may be given by any of its names); the param is put back on leaving. A
    module that does not hold the param is a ``ValueError``."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    swapped = []
    twins = {}
    try:
        for fqn, mod_name in uses.items():
            p = model.get_parameter(fqn)
            mod = model.get_submodule(mod_name)
            attr = next((a for a, q in mod.named_parameters(recurse=False) if q is p), None)
            if attr is None:
                raise ValueError(f"module {mod_name!r} does not hold param {fqn!r} itself")
            twin = torch.nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
            setattr(mod, attr, twin)
            swapped.append((mod, attr, p))
            twins[name_of[id(p)]] = twin
        yield twins
    finally:
        for mod, attr, p in reversed(swapped):
            setattr(mod, attr, p)


def _to_ids(named: dict, names: list[str]) -> dict:
    """A named optimizer dict (``named_osd``) keyed by the optimizer's ids again, each
    group's params in the optimizer's order (``names``): torch's ``load_state_dict`` pairs a
    saved group's params with the optimizer's by position, and a dict gathered from FSDP
    lists them in its own order."""
    ids = {n: i for i, n in enumerate(names)}
    return {"state": {ids[k]: st for k, st in named["state"].items()},
            "param_groups": [{**g, "params": sorted(ids[n] for n in g["params"])}
                             for g in named["param_groups"]]}


def fresh_training(case: Case):
    """The case's model, optimizer and LR scheduler as built before any step, and the
    optimizer's params as FQNs in its own order (the names ``named_osd`` keys by):
    ``(model, optim, sched or None, names)``."""
    model = build_model(case.model, case.seed, case.torch_dtype)
    named = list(model.named_parameters())
    optim = build_optimizer(case.optimizer, named, case.groups, impl=case.impl)
    sched = build_scheduler(optim, case.model, case.scheduler) if case.scheduler else None
    order = {id(p): n for n, p in named}
    return model, optim, sched, [order[id(p)] for g in optim.param_groups for p in g["params"]]


@functools.lru_cache(maxsize=128)
def _local_run(case: Case, exp: Expectation) -> LocalRun:
    # one run per training: every field that does not change the single-process steps is
    # reset to what its declaration says (cases.axis: cases.SINGLE_PROCESS); the api too,
    # since mixed precision (which does change the steps) lives on the FSDP2 round trips (any
    # one: the steps are alike)
    api = FSDP2_ROUND_TRIPS[0] if case.mixed_precision else "fsdp1"
    base = Case(**{**case.to_dict(), **SINGLE_PROCESS, "api": api})
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
                modelled = _modelled_start(exp, snaps["save"][1])
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



def continue_from(case: Case, params: dict, state: dict, exp: Expectation = EXACT) -> LocalRun:
    """The uninterrupted continuation of a given training state, in this process: the
    case's model with ``params`` (by FQN), its optimizer with ``state`` (a named optimizer
    dict, ``named_osd``'s form) and the LR scheduler, trained the case's ``resume_steps``
    on the same global batches as every other run. bfloat16's P6 (run_props
    ``p6_resume``) compares a resumed FSDP run with this continuation of FSDP's own state
    at the save: both start from the same bits, so they differ by the resumed steps'
    gradient rounding only, not by the drift of the steps before the save.

    ``params_at_save`` / ``optim_at_save`` are the start as given; ``losses`` are the
    resumed steps' only."""
    sched_at_save = local_run(case, exp).sched_at_save if case.scheduler else None
    model, optim, sched, names = _started(case, params, state, sched_at_save)
    losses = []
    for step in range(case.steps, case.steps + case.resume_steps):
        x = make_batch(case.model, case.seed, step, case.batch, case.torch_dtype)
        loss = train_step(model, optim, x, sched, compute_dtype=case.mixed_precision_dtype)
        losses.append(float(loss.detach().to(torch.float64)))
    return LocalRun(tuple(losses), params, state, _params(model), named_osd(optim, names),
                    sched_at_save, scheduler_state(sched))


def _started(case: Case, params: dict, state: dict, sched_state: dict | None):
    """The case's model with ``params`` (by FQN), frozen as at the save, its optimizer
    holding ``state`` (a named optimizer dict) and its LR scheduler in ``sched_state``:
    ``(model, optim, sched or None, names)`` as ``fresh_training`` gives them."""
    model, optim, sched, names = fresh_training(case)
    missing = sorted(set(n for n, _ in model.named_parameters()) - set(params))
    if missing:
        raise KeyError(f"no start value for params {missing}")
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(params[n])
    freeze_at_save(model, case.model)
    load_exactly(optim, copy.deepcopy(_to_ids(state, names)))
    if sched is not None:  # the scheduler as it was at the save
        sched.load_state_dict(copy.deepcopy(sched_state))
    return model, optim, sched, names


def _params(model: torch.nn.Module) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters()}
