"""The case matrix of the conformance run, by tier.

Rules
- quick: every (path, optimizer) pair and every (path, save world size -> load world size)
  pair at least once (a covering design: the 16 world-size pairs of a path cycle through
  the optimizers), plus every zoo model, use_orig_params both ways, every sharding
  strategy (FSDP2: HSDP meshes resharded, ``fsdp2_meshes``; compiled models, ``compiled``), several param groups with an LR scheduler, the foreach/fused/for-loop
  implementations, float32, a bfloat16 round trip per path, partial state, a second wrapping plan on the load side,
  the bad-input (P15) cases, a slice of the crash (P16) cases (``QUICK_CRASHES``) and NAdam,
  ASGD, Adafactor, Muon and LBFGS on every path (``more_optimizers``; Muon on the model
  ``matrices``). Quick
  is what ``make run`` runs: minutes on 2 cores.
- full: everything quick has, plus the product of paths x optimizers x world-size pairs x
  use_orig_params (mlp), every zoo model x use_orig_params x four world-size pairs x three
  optimizer kinds, every implementation and every dtype.
- The rest of torch.optim (``zoo.MORE_OPTIMIZERS``: NAdam, RAdam, Adamax, ASGD, Rprop,
  Adafactor, Muon, LBFGS) in full on every path at four world-size pairs
  (``more_optimizers``); SparseAdam is not applicable (FSDP produces no sparse gradients).
- Crash cases (P16, ``crashes``): full has every path at every kill point, three choices of
  killed ranks, each layout the path's save can be judged in (``crash_layouts``).
- Golden fixtures (P12, ``fixtures.golden``): full has every stored fixture through every
  load path that reads it at every world size; quick one case per fixture.
- Bounds cases (P13/P14, ``bounds``): both tiers, one per path at each world size 1-4: Adam,
  fp32, the nested plan of ``bounds.BOUNDS_MODEL`` (4 MB of state: times of milliseconds to
  hundreds of ms, far above the timer's resolution), calibrated in
  fsdp_conformance/data/bounds.json.
- Only world sizes the caller allows are kept (``world_sizes``); paths that cannot change
  world size or wrapping (``sut.paths.resizable``) keep their same-size cases only.
- Order is deterministic; ids are unique.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Iterable, Sequence

from ..cases import CRASH_POINTS, FAULTS, SCHEDULE_NAMES, Case
from ..api_paths import PATH_NAMES, PATHS, api_path, family_of, is_full_path, resizable
from ..zoo import FUSED, MODELS, MORE_OPTIMIZERS, OPTIMIZERS, runs_on
from ..zoo.optimizers import OPTIMIZER_MODELS, STATE_DTYPE_OPTIMIZERS

OPTS = tuple(OPTIMIZERS)
# The zoo's LR schedules whose lr depends on the scheduler's own state (every one but the
# chainable "exp"): the +sched cases of each tier go through them too.
STATEFUL_SCHEDULES = tuple(k for k in SCHEDULE_NAMES if k != "exp")
WS_PAIRS = tuple(itertools.product((1, 2, 3, 4), repeat=2))
# Load-side plan per model that differs from "nested" (a second wrapping for N->M).
# (tied "split" shares a param across units: a known FSDP1 failure, probed by
# suites/differential/test_tied_units.py; frozen needs its own unit when flat.)
ALT_PLAN = {"mlp": "block", "tied": "root", "frozen": "nested", "unused": "root",
            "buffers": "root", "conv": "root", "late_frozen": "block"}


def default_paths() -> tuple[str, ...]:
    """The registered paths the run can drive on this torch, in registry order: every FSDP1
    path, and the FSDP2 paths when their adapter imports (it needs ``fully_shard``). An
    FSDP1 path whose module cannot import is an error, not a path left out (a path whose
    torch API is gone is reported "removed" by its verdicts)."""
    usable: dict[str, bool] = {}
    for p in PATHS:
        if p.module not in usable:
            try:
                p.sides()
                usable[p.module] = True
            except ImportError:
                if p.family != "fsdp2":
                    raise
                usable[p.module] = False
    return tuple(p.name for p in PATHS if usable[p.module])


def groups_fit_units(c: Case) -> bool:
    # FSDP1 flat units need all their params in one param group: two groups only with
    # use_orig_params=True or a plan whose units split the group boundary ("nested").
    return c.groups == 1 or c.use_orig_params or c.family == "fsdp2" or (
        c.plan == "nested" and c.dst_plan == "nested" and c.model == "mlp")


def quick(paths: Sequence[str], fixtures: str | None = None) -> list[Case]:
    cases: list[Case] = []
    for p, api in enumerate(paths):
        for i, (n, m) in enumerate(WS_PAIRS):
            if not resizable(api) and n != m:
                continue
            opt = OPTS[i % len(OPTS)]
            cases.append(Case(api=api, optimizer=opt, world_size=n, load_world_size=m,
                              use_orig_params=bool(i % 2), model="mlp", plan="nested",
                              groups=2 if i % 3 == 0 else 1))
        if not resizable(api):  # still cover every optimizer once
            for j, opt in enumerate(OPTS):
                cases.append(Case(api=api, optimizer=opt, world_size=2 + j % 2,
                                  use_orig_params=bool(j % 2), model="conv" if j % 2 else "mlp"))
        for j, model in enumerate(MODELS):
            if not runs_on(model, family_of(api)):
                continue
            cases.append(Case(api=api, model=model, optimizer="adam", world_size=2 + j % 2,
                              load_world_size=3 - j % 2 if resizable(api) else None,
                              load_plan=ALT_PLAN[model] if resizable(api) else None,
                              use_orig_params=bool(j % 2)))
        if family_of(api) == "fsdp1":
            for k, strat in enumerate(("SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")):
                ws = 4 if strat == "HYBRID_SHARD" else 2
                cases.append(Case(api=api, strategy=strat, world_size=ws, optimizer="adamw",
                                  use_orig_params=bool(k % 2)))
        else:
            cases += (fsdp2_meshes(api, QUICK_HSDP_PAIRS) + compiled(api) + flattened(api)
                      + offloaded(api) + mixed_precision(api)
                      + dcp_writes(api, ("adam",)) + nonstrict(api) + frozen_left_out(api)
                      + tensor_parallel(api))
        cases.append(Case(api=api, optimizer="adam", groups=2, scheduler=True, world_size=2,
                          load_world_size=3 if resizable(api) else None, use_orig_params=True))
        # the LR scheduler built after the load (3 -> 2: fsdp1.dsd_sharded loads there)
        cases.append(Case(api=api, optimizer="sgd_momentum", groups=2, scheduler=True,
                          scheduler_after_load=True, world_size=3,
                          load_world_size=2 if resizable(api) else None))
        if "no_broadcast" in api_path(api).axes:  # the load without broadcast_from_rank0,
            # plain and with the scheduler built after the load
            cases.append(Case(api=api, optimizer="adam", world_size=2, load_world_size=3,
                              no_broadcast=True))
            cases.append(Case(api=api, optimizer="sgd_momentum", groups=2, scheduler=True,
                              scheduler_after_load=True, world_size=3, load_world_size=2,
                              no_broadcast=True))
        # a schedule whose lr depends on the scheduler's own state, one per path in turn
        cases.append(Case(api=api, optimizer="adamw", groups=2,
                          scheduler=STATEFUL_SCHEDULES[p % len(STATEFUL_SCHEDULES)],
                          world_size=2, load_world_size=3 if resizable(api) else None))
        # a chain of checkpoints: saved, resumed, saved again by what resumed, resumed again
        cases += chained(api, ("adamw",), first_schedule=p)
        # bfloat16 round trips: one per path, the optimizers in turn, resharded where the
        # path can (P2 and P6 by each tensor's own scale, run_props)
        cases.append(Case(api=api, optimizer=OPTS[(p + 1) % len(OPTS)], dtype="bf16",
                          world_size=2, load_world_size=3 if resizable(api) else None,
                          use_orig_params=bool(p % 2)))
        cases.append(Case(api=api, optimizer="sgd_momentum", impl="fused", world_size=2,
                          use_orig_params=True))
        cases.append(Case(api=api, optimizer="adamw", impl="forloop", world_size=3))
        cases.append(Case(api=api, optimizer="adam", dtype="fp32", world_size=2))
        cases += state_dtype(api, ((2, 3),))
        cases.append(Case(api=api, optimizer="adam", steps=0, world_size=2))
        cases.append(Case(api=api, optimizer="adam", model="frozen", world_size=3,
                          use_orig_params=True))
    cases += more_optimizers(paths, "quick")
    cases += faults(paths)
    cases += crashes(paths, "quick")
    cases += golden(paths, fixtures, "quick")
    cases += bounds(paths)
    return _dedupe(c for c in cases if groups_fit_units(c))


def full(paths: Sequence[str], fixtures: str | None = None) -> list[Case]:
    cases = list(quick(paths, fixtures))
    for api, opt, (n, m), orig in itertools.product(paths, OPTS, WS_PAIRS, (False, True)):
        if not resizable(api) and n != m:
            continue
        cases.append(Case(api=api, optimizer=opt, world_size=n, load_world_size=m,
                          use_orig_params=orig, groups=2 if orig else 1))
    for api, model, orig, (n, m) in itertools.product(paths, MODELS, (False, True),
                                                      ((1, 2), (2, 3), (3, 2), (4, 4))):
        if not resizable(api) and n != m:
            n = m
        if not runs_on(model, family_of(api)):
            continue
        for opt in ("sgd_momentum", "adam", "adagrad"):
            cases.append(Case(api=api, optimizer=opt, world_size=n, load_world_size=m,
                              use_orig_params=orig, model=model))
    for api, opt, impl in itertools.product(paths, OPTS, ("forloop", "foreach", "fused")):
        if impl == "fused" and opt not in FUSED:
            continue
        cases.append(Case(api=api, optimizer=opt, impl=impl, world_size=2, use_orig_params=True))
    for api, dtype, opt in itertools.product(paths, ("fp32", "bf16"), OPTS):
        cases.append(Case(api=api, optimizer=opt, dtype=dtype, world_size=2))
    for api in paths:
        cases += state_dtype(api, ((2, 3), (3, 2), (2, 2), (1, 2)))
    for api, opt, after in itertools.product(paths, OPTS, (False, True)):
        cases.append(Case(api=api, optimizer=opt, groups=2, scheduler=True,
                          scheduler_after_load=after, world_size=3,
                          load_world_size=2 if resizable(api) else None))
    for api, kind, after in itertools.product(paths, STATEFUL_SCHEDULES, (False, True)):
        cases.append(Case(api=api, optimizer="adamw", groups=2, scheduler=kind,
                          scheduler_after_load=after, world_size=3,
                          load_world_size=2 if resizable(api) else None))
    for api in paths:
        cases += chained(api, OPTS, links=(2, 3))
        if family_of(api) == "fsdp2":
            cases += (fsdp2_meshes(api, FULL_HSDP_PAIRS, OPTS) + compiled(api, OPTS)
                      + flattened(api, OPTS) + offloaded(api, OPTS)
                      + mixed_precision(api, OPTS) + dcp_writes(api, OPTS)
                      + nonstrict(api, OPTS) + frozen_left_out(api, OPTS)
                      + tensor_parallel(api, OPTS))
    cases += more_optimizers(paths, "full")
    cases += crashes(paths, "full")
    cases += golden(paths, fixtures, "full")
    return _dedupe(c for c in cases if groups_fit_units(c))


# FSDP2 HSDP (a 2-D replicate x shard mesh: shard groups of 2 on an even world size, the
# whole world on an odd one), saved at one mesh and loaded at another: 2x2 -> 2x2, 2x2 ->
# 1x2, 1x2 -> 2x2, 2x2 -> 1x3 and back (quick); every pair of 1-4 ranks (full).
QUICK_HSDP_PAIRS = ((4, 4), (4, 2), (2, 4), (4, 3), (3, 4))
FULL_HSDP_PAIRS = tuple(pair for pair in WS_PAIRS if 4 in pair or 2 in pair)


def fsdp2_meshes(api: str, pairs: Sequence[tuple[int, int]],
                 optimizers: Sequence[str] = ("adamw", "sgd_momentum", "adagrad")) -> list[Case]:
    """FSDP2 cases on other meshes than the 1-D default: HSDP at each (save, load) world
    size pair, the optimizers in turn (or every one of ``optimizers`` per pair when it has
    more than three), ``reshard_after_forward=False`` (SHARD_GRAD_OP) and a replicate-only
    mesh (NO_SHARD) at 2 -> 3, and ``reshard_after_forward=2`` (reshard to 2 of 4 ranks after
    forward) at 4 -> 4 and 4 -> 2 (every one of ``optimizers`` when it has more than three)."""
    out = []
    for i, (n, m) in enumerate(pairs):
        opts = optimizers if len(optimizers) > 3 else (optimizers[i % len(optimizers)],)
        out += [Case(api=api, strategy="HYBRID_SHARD", world_size=n, load_world_size=m,
                     optimizer=opt) for opt in opts]
    for strat in ("SHARD_GRAD_OP", "NO_SHARD"):
        out.append(Case(api=api, strategy=strat, world_size=2, load_world_size=3,
                        optimizer="adamw"))
    for i, m in enumerate((4, 2)):
        opts = optimizers if len(optimizers) > 3 else (optimizers[i % len(optimizers)],)
        out += [Case(api=api, reshard_after_forward=2, world_size=4, load_world_size=m,
                     optimizer=opt) for opt in opts]
    return out


def flattened(api: str, optimizers: Sequence[str] = ("adam", "sgd_momentum")) -> list[Case]:
    """FSDP2 with ``flatten_optimizer_state_dict=True`` on both sides (torchtitan's
    checkpointer): saved at 2 and loaded at 3, and saved and loaded at 4 with two param
    groups and an LR scheduler, the optimizers in turn (every one of ``optimizers`` at both
    when it has more than two)."""
    shapes = (dict(world_size=2, load_world_size=3),
              dict(world_size=4, groups=2, scheduler=True))
    out = []
    for i, kw in enumerate(shapes):
        opts = optimizers if len(optimizers) > 2 else (optimizers[i % len(optimizers)],)
        out += [Case(api=api, optimizer=opt, flatten_optimizer_state_dict=True, **kw)
                for opt in opts]
    return out


def offloaded(api: str, optimizers: Sequence[str] = ("adamw",)) -> list[Case]:
    """FSDP2 with ``CPUOffloadPolicy`` on both sides: unpinned, saved at 2 and loaded at 3
    (per optimizer), and pinned (torch's default) at 2 -> 2, which needs an accelerator: on a
    CPU-only machine it is "n/a" with torch's refusal (sut/fsdp2.py)."""
    return ([Case(api=api, optimizer=opt, world_size=2, load_world_size=3,
                  cpu_offload="unpinned") for opt in optimizers]
            + [Case(api=api, optimizer="adam", world_size=2, cpu_offload="pinned")])


def state_dtype(api: str, pairs: Sequence[tuple[int, int]]) -> list[Case]:
    """An optimizer whose state dtype is not its params' (``STATE_DTYPE_OPTIMIZERS``: float32
    state for bfloat16 params) at each (save, load) world size pair (the save's size where
    the path cannot reshard; FSDP1 with ``use_orig_params`` on the odd pairs). No pair at 4
    ranks: bfloat16's P6 rule is calibrated up to 3 (run_props), and FSDP2 at 4 ranks
    already moves a plain SGD-momentum resume's update scale to 1.0066."""
    out = []
    for i, (n, m) in enumerate(pairs):
        for opt in STATE_DTYPE_OPTIMIZERS:
            out.append(Case(api=api, optimizer=opt, dtype="bf16", world_size=n,
                            load_world_size=m if resizable(api) else None,
                            use_orig_params=family_of(api) == "fsdp1" and bool(i % 2)))
    return out


def nonstrict(api: str, optimizers: Sequence[str] = ("adam", "sgd")) -> list[Case]:
    """FSDP2 loads with ``strict=False``, saved at 2 and loaded at 3, per optimizer: on the
    ``unused`` model (a param that never gets a gradient has no state) and on the mlp."""
    return [Case(api=api, optimizer=opt, model=model, world_size=2, load_world_size=3,
                 nonstrict=True) for opt in optimizers for model in ("unused", "mlp")]


def frozen_left_out(api: str, optimizers: Sequence[str] = ("adam",)) -> list[Case]:
    """FSDP2 with ``ignore_frozen_params=True`` on every state-dict call, saved at 2 and
    loaded at 3, per optimizer, on the zoo's frozen models (``late_frozen``: trained, then
    frozen before the save; ``frozen``: frozen when built): the optimizer round trip, and on
    fsdp2.sharded the app state (the model goes through set_state_dict with it), strict and
    with ``strict=False``."""
    out = []
    for opt in optimizers:
        out.append(Case(api=api, optimizer=opt, model="late_frozen", world_size=2,
                        load_world_size=3, ignore_frozen_params=True))
        if "app_state" in api_path(api).axes:
            out += [Case(api=api, optimizer=opt, model=m, world_size=2, load_world_size=3,
                         ignore_frozen_params=True, app_state=True, nonstrict=ns)
                    for m in ("frozen", "late_frozen") for ns in (False, True)]
    return out


def dcp_writes(api: str, optimizers: Sequence[str]) -> list[Case]:
    """fsdp2.sharded's DCP write as trainers do it, saved at 2 and loaded at 3, per
    optimizer: ``dcp.async_save`` while the next optimizer step runs (Case.async_save), and
    a ``Stateful`` app state of model, optimizer, LR scheduler (two param groups) and step
    (Case.app_state), written with ``dcp.save`` and with ``dcp.async_save``; none for
    fsdp2.full (it writes one torch.save file)."""
    if "async_save" not in api_path(api).axes:
        return []
    out = []
    for opt in optimizers:
        out.append(Case(api=api, optimizer=opt, world_size=2, load_world_size=3,
                        async_save=True))
        for asynchronous in (False, True):
            out.append(Case(api=api, optimizer=opt, groups=2, scheduler=True, world_size=2,
                            load_world_size=3, app_state=True, async_save=asynchronous))
    # the app state with a schedule whose lr depends on the scheduler's own state
    out.append(Case(api=api, optimizer=optimizers[0], groups=2, scheduler="warmup_cosine",
                    world_size=2, load_world_size=3, app_state=True))
    return out


# FSDP2 over tensor parallelism, (save world size, tp degree, load world size, tp degree):
# 2x2 -> 2x2, 2x2 -> 1x2 (tp only), 2x2 -> 2 without tp and back, 2x2 -> 4 without tp.
TP_PAIRS = ((4, 2, 4, 2), (4, 2, 2, 2), (4, 2, 2, 0), (2, 0, 4, 2), (4, 2, 4, 0))


def tensor_parallel(api: str, optimizers: Sequence[str] = ("adam", "sgd_momentum", "adagrad",
                                                           "adamw", "adadelta")) -> list[Case]:
    """FSDP2 over tensor parallelism (the zoo's ``tp_ffn``: colwise ``fc1``, rowwise ``fc2``)
    at each of ``TP_PAIRS``, the optimizers in turn (every one of ``optimizers`` per pair
    when it has more than five)."""
    out = []
    for i, (n, t, m, u) in enumerate(TP_PAIRS):
        opts = optimizers if len(optimizers) > 5 else (optimizers[i % len(optimizers)],)
        out += [Case(api=api, model="tp_ffn", optimizer=opt, world_size=n, tensor_parallel=t,
                     load_world_size=m, load_tensor_parallel=None if u == t else u)
                for opt in opts]
    return out


def mixed_precision(api: str, optimizers: Sequence[str] = ("adamw", "adagrad")) -> list[Case]:
    """FSDP2 with ``MixedPrecisionPolicy`` (bfloat16 compute, float32 params, state and
    gradient reduction) on both sides, float32: saved at 2 and loaded at 3 (per optimizer),
    and at 4 -> 2 with two param groups and an LR scheduler."""
    return ([Case(api=api, optimizer=opt, dtype="fp32", world_size=2, load_world_size=3,
                  mixed_precision="bf16") for opt in optimizers]
            + [Case(api=api, optimizer="adam", dtype="fp32", groups=2, scheduler=True,
                    world_size=4, load_world_size=2, mixed_precision="bf16")])


def compiled(api: str, optimizers: Sequence[str] = ("adamw",)) -> list[Case]:
    """FSDP2 with ``torch.compile(backend="eager")``: saved compiled and loaded uncompiled,
    the reverse (both resharded 2 -> 3), and compiled on both sides (2 -> 2), per optimizer."""
    return [Case(api=api, optimizer=opt, world_size=2, load_world_size=m, compiled=side)
            for opt in optimizers for side, m in (("save", 3), ("load", 3), ("both", 2))]


def chained(api: str, optimizers: Sequence[str], *, first_schedule: int = 0,
            links: Sequence[int] = (2,)) -> list[Case]:
    """Chains of checkpoints (``Case.links``: saved, resumed, saved again by what resumed,
    loaded where the chain started, resumed again), per optimizer: two param groups with a
    schedule whose lr depends on its own state (the schedules in turn from
    ``first_schedule``), resharding where the path can (2 -> 3 -> 2); and the model that
    freezes params at the save, at one size."""
    m = 3 if resizable(api) else 2
    out = []
    for i, (opt, n) in enumerate(itertools.product(optimizers, links)):
        out.append(Case(api=api, optimizer=opt, groups=2, use_orig_params=True,
                        scheduler=STATEFUL_SCHEDULES[(first_schedule + i) % len(STATEFUL_SCHEDULES)],
                        world_size=2, load_world_size=m, links=n))
        out.append(Case(api=api, optimizer=opt, model="frozen", world_size=2,
                        use_orig_params=True, links=n))
    return out


def golden(paths: Sequence[str], fixtures: str | None, tier: str) -> list[Case]:
    """P12 cases: the stored fixtures under ``fixtures`` (default: the repository's
    fixtures/) through the load paths among ``paths`` (``fixtures.golden.golden_cases``)."""
    from ..golden.case import golden_cases

    return golden_cases(fixtures, tier=tier, paths=paths)


def bounds(paths: Sequence[str]) -> list[Case]:
    """P13/P14 cases: every path measured at world sizes 1-4 (module rules)."""
    from ..bounds.rules import BOUNDS_MODEL

    return [Case(api=api, model=BOUNDS_MODEL, plan="nested", optimizer="adam", dtype="fp32",
                 world_size=ws, steps=1, bounds=True)
            for api in paths for ws in (1, 2, 3, 4)]


def faults(paths: Sequence[str]) -> list[Case]:
    """P15 cases: each bad input kind through each load path that can receive it
    (dict-level faults only where the saved form is one full dict)."""
    out = []
    for api in paths:
        for fault in FAULTS[1:]:
            dict_fault = fault not in ("truncated_file", "corrupt_file")
            if dict_fault and (not is_full_path(api) or api_path(api).rekeys):
                continue  # dict faults need an FQN-keyed full dict on disk
            out.append(Case(api=api, optimizer="adam", world_size=2, fault=fault))
    return out


QUICK_MORE: tuple[str, ...] = ("nadam", "asgd", "adafactor", "muon", "lbfgs")
"""The optimizers of ``MORE_OPTIMIZERS`` the quick tier runs on every path: the new state
shapes (NAdam's 0-dim ``mu_product``; ASGD's 0-dim ``eta`` and ``mu`` beside a param-shaped
``ax``; Adafactor's factors; Muon's whole matrices; LBFGS's state held once for all
params)."""


def more_optimizers(paths: Sequence[str], tier: str) -> list[Case]:
    """The rest of torch.optim (``zoo.MORE_OPTIMIZERS``; issue 49). Quick: ``QUICK_MORE`` on
    every path, saved at 2 and loaded at 3 (at 2 where the path cannot reshard). Full: every
    one on every path at 2 -> 3, 3 -> 2, 1 -> 2 and 4 -> 4, use_orig_params both ways. Each
    on the zoo model it accepts (``OPTIMIZER_MODELS``)."""
    if tier == "quick":
        return [Case(api=api, optimizer=opt, world_size=2, model=OPTIMIZER_MODELS.get(opt, "mlp"),
                     load_world_size=3 if resizable(api) else None)
                for api in paths for opt in QUICK_MORE if opt in MORE_OPTIMIZERS]
    return [Case(api=api, optimizer=opt, world_size=n, load_world_size=m,
                 use_orig_params=orig, model=OPTIMIZER_MODELS.get(opt, "mlp"))
            for api, opt, (n, m), orig in itertools.product(
                paths, MORE_OPTIMIZERS, ((2, 3), (3, 2), (1, 2), (4, 4)), (False, True))]




QUICK_CRASHES: tuple[tuple[str, str, str, int, int, bool], ...] = (
    ("fsdp1", "full", "own_file.rank0.fresh", 2, 2, False),
    ("fsdp1", "dcp", "commit.rank0.over", 2, 3, False),
    ("fsdp1", "dcp", "torn.rank1.fresh", 2, 2, False),
    ("fsdp2", "full", "torn.rank0.fresh", 2, 3, False),
    ("fsdp2", "dcp", "own_file.all.over", 2, 2, False),
    ("fsdp2", "dcp", "own_file.rank1.over", 2, 3, True),
    ("fsdp2", "dcp", "start.rank0.over", 2, 3, False),
    ("fsdp2", "dcp", "before_file.rank1.over", 2, 3, False),
    ("fsdp2", "dcp", "torn.rank0.over", 2, 2, False),
    ("fsdp2", "per_rank", "start.rank1.fresh", 2, 2, False),
)
"""The quick tier's P16 slice: (family, what the path writes, crash, save and load world
sizes, async_save where the path has it), each on the family's first run path that writes
so (a primary one first: ``crash_path``): both families, a full file, DCP and a file per
rank, every point, both layouts, 2 and 2 -> 3."""


def crash_path(family: str, writes: str, paths: Sequence[str]) -> str | None:
    """The path of ``paths`` a quick crash case of ``family`` writing ``writes`` runs on: a
    primary path of the family that writes so, else the first that does; None: none."""
    fits = [a for a in paths if family_of(a) == family and api_path(a).writes == writes]
    return next((a for a in fits if api_path(a).primary), fits[0] if fits else None)


def crash_layouts(api: str) -> tuple[str, ...]:
    """The layouts a path's crash cases take: a new step folder for every path; over the
    first save's folder where the save writes DCP, whose commit (``.metadata`` last) is
    torch's claim to test. A torch.save path has no commit step: whether files overwritten
    in place survive a kill is the trainer's file handling (the plugin judges a trainer's
    own: examples/crash_consistency), and the run's own writes are atomic per file."""
    return ("fresh", "over") if api_path(api).writes == "dcp" else ("fresh",)


def crashes(paths: Sequence[str], tier: str) -> list[Case]:
    """P16 cases (run/crash_kind.py). Quick: ``QUICK_CRASHES`` on the paths run. Full: every
    path at every point (``CRASH_POINTS``; the DCP commit where the path writes DCP), killing
    rank 0, the last rank and every rank (a full path's rank 1, which writes no file, at
    "start" only), in each of its ``crash_layouts``, loaded at 2 and resharded 2 -> 3 (every
    rank killed) where the path can; torn files at two more seeds; DCP's ``async_save``
    (and its "staging" point) where the path has it."""
    if tier == "quick":
        out = []
        for family, writes, crash, n, m, async_save in QUICK_CRASHES:
            api = crash_path(family, writes, paths)
            if api is not None:
                out.append(Case(api=api, optimizer="adam", world_size=n, load_world_size=m,
                                crash=crash,
                                async_save=async_save and "async_save" in api_path(api).axes))
        return out
    out = []
    for api in paths:
        dcp = api_path(api).writes == "dcp"
        for point, who, layout in itertools.product(CRASH_POINTS, ("rank0", "rank1", "all"),
                                                    crash_layouts(api)):
            crash = f"{point}.{who}.{layout}"
            if point == "commit" and (not dcp or who != "rank0"):
                continue
            if point == "staging":  # async_save's alone
                if "async_save" in api_path(api).axes:
                    out.append(Case(api=api, optimizer="adam", world_size=2, crash=crash,
                                    async_save=True))
                continue
            if api_path(api).full and who == "rank1" and point != "start":
                continue  # rank 1 writes no file of a full path: n/a (start: save 2 whole)
            out.append(Case(api=api, optimizer="adam", world_size=2, crash=crash))
            if who == "all" or point == "commit":
                out.append(Case(api=api, optimizer="adam", world_size=2, load_world_size=3,
                                crash=crash))
            if point == "torn":
                out += [Case(api=api, optimizer="adam", world_size=2, crash=crash, seed=s)
                        for s in (1, 2)]
            if "async_save" in api_path(api).axes and point in ("own_file", "torn"):
                out.append(Case(api=api, optimizer="adam", world_size=2, crash=crash,
                                async_save=True))
    return out


RESIZING: tuple[str, ...] = ("load_world_size", "load_plan", "load_tensor_parallel")
"""The load-side fields that change the layout a path loads into (``Case.loads_where_saved``)."""


def _dedupe(cases: Iterable[Case]) -> list[Case]:
    """Unique cases in first-seen order; FSDP2 has no ``use_orig_params`` (it always keeps
    the original params), so FSDP2 cases are normalised to False first; a path that cannot
    change world size or wrapping (``ApiPath.resizable``) takes every case at the saving
    layout (its ``RESIZING`` fields dropped), whichever generator made it."""
    seen, out = set(), []
    for c in cases:
        if c.family == "fsdp2" and c.use_orig_params:
            c = dataclasses.replace(c, use_orig_params=False)
        if not resizable(c.api) and not c.loads_where_saved:
            c = dataclasses.replace(c, **{f: None for f in RESIZING})
        if c.id not in seen:
            seen.add(c.id)
            out.append(c)
    return out


def select(cases: Sequence[Case], *, world_sizes: Sequence[int] = (1, 2, 3, 4),
           keyword: str | None = None, ids: Sequence[str] = ()) -> list[Case]:
    """Cases whose save and load world sizes are allowed and whose id ``keyword`` selects
    (selection.py: pytest's ``-k`` grammar over words of case ids, a path's name selecting
    that path's cases; ValueError for a malformed one), or, with ``ids``, exactly the cases
    of those ids (ValueError naming an id the cases lack, with the closest ids)."""
    allowed = set(world_sizes)
    if ids:
        by_id = {c.id: c for c in cases}
        unknown = [i for i in ids if i not in by_id]
        if unknown:
            import difflib

            close = difflib.get_close_matches(unknown[0], list(by_id), n=3, cutoff=0.5)
            raise ValueError(f"no case has the id {unknown[0]!r}"
                             + (f"; did you mean {' or '.join(map(repr, close))}?" if close
                                else "") + " (`--list` lists the ids)")
        cases = [by_id[i] for i in dict.fromkeys(ids)]
    out = [c for c in cases if c.world_size in allowed and c.dst_world_size in allowed]
    if keyword:
        from ..selection import compile_keyword

        matches = compile_keyword(keyword, PATH_NAMES)
        out = [c for c in out if matches(c.id)]
    return out


def no_match(cases: Sequence[Case], tier: str, *, world_sizes: Sequence[int],
             keyword: str | None, ids: Sequence[str] = ()) -> str:
    """Why ``select`` chose nothing, in words: the selection as given (never Python's
    None), the world sizes the tier's cases use where the allowed ones miss them, and "did
    you mean" for each word of ``keyword`` no id contains."""
    from ..selection import unknown_words

    said = []
    if ids:
        said.append(f"--case {' '.join(map(repr, ids))}")
    if keyword:
        said.append(f"-k {keyword!r}")
    sizes = sorted({w for c in cases for w in (c.world_size, c.dst_world_size)})
    out = (f"no case of tier {tier!r} matches {' and '.join(said) + ' at ' if said else ''}"
           f"world sizes {list(world_sizes)}")
    if not set(sizes) & set(world_sizes) or (not keyword and not ids):
        out += f" (the tier's cases use world sizes {sizes})"
    if keyword:
        for word, close in unknown_words(keyword, [c.id for c in cases]).items():
            out += (f"; no case id contains {word!r}"
                    + (f": did you mean {' or '.join(map(repr, close))}?" if close else ""))
    return out


TIERS = {"quick": quick, "full": full}
