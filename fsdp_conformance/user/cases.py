"""The cases of one user round trip: each built-in path of the chosen FSDP version (or the
user's own) x each world-size spec, checked against what FSDP1 refuses by design before any
rank runs.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from ..cases import DTYPE_NAMES, Case
from ..properties.layouts import reference_layout
from ..api_paths import custom_family, family_of, paths_of, resizable
from ..zoo import build_model, build_optimizer
from .model import CustomPath, UserModel
from .refs import Ref
from .spec import DEFAULT_PAIRS, DEFAULT_PATHS, FSDP_VERSIONS, parse_sizes

FSDP1_PATHS, FSDP2_PATHS = paths_of("fsdp1"), paths_of("fsdp2")


def _groups_of(user: UserModel, seed: int) -> int:
    if not isinstance(user.optimizer, Ref):
        return 1
    model = build_model(user.name, seed)
    return len(build_optimizer(user.optimizer_name, list(model.named_parameters())).param_groups)


def check_units_fit_groups(user: UserModel, case: Case) -> None:
    """With ``use_orig_params=False`` a unit is one flat parameter, so all its params must
    sit in one param group; ValueError naming the unit and the groups otherwise."""
    if case.use_orig_params or not isinstance(user.optimizer, Ref):
        return
    model = build_model(user.name, case.seed)
    optim = build_optimizer(user.optimizer_name, list(model.named_parameters()))
    names = {id(p): n for n, p in model.named_parameters()}
    group_of = {names[id(p)]: i for i, g in enumerate(optim.param_groups) for p in g["params"]}
    for side in (False, True):
        layout = reference_layout(case, load_side=side)
        for u in layout.units:
            gs = sorted({group_of[f] for f in u.fqns if f in group_of})
            if len(gs) > 1:
                raise ValueError(
                    f"unit {u.name or '<root>'!r} of plan {case.dst_plan if side else case.plan!r} "
                    f"holds params of param groups {gs} ({list(u.fqns)}); with "
                    f"use_orig_params=False a unit is one flat parameter in one group: wrap the "
                    f"groups' modules separately or pass use_orig_params=True")


def model_dtype(user: UserModel, seed: int = 0) -> str:
    """The dtype a user's model runs in by default: "fp64" (the tightest comparisons), or
    the dtype its loss comes out in when that is coarser (a forward that returns
    ``.float()``): then the case, its id and its tolerances say what the model computes in
    (properties/precision.py ``loss_dtype``, one forward in this process)."""
    from ..properties.precision import loss_name

    return loss_name(Case(model=user.name, plan=user.plan_name, api="fsdp1", seed=seed))


def _paths(fsdp_version: int, tier: str, paths, custom: CustomPath | None) -> list[str]:
    if fsdp_version not in FSDP_VERSIONS:
        raise ValueError(f"fsdp_version must be one of {FSDP_VERSIONS}, got {fsdp_version!r}")
    family = f"fsdp{fsdp_version}"
    if custom is not None:
        if paths:
            raise ValueError(f"paths={list(paths)} and save_fn/load_fn were both given: the "
                             f"round trip goes through your save_fn/load_fn, not through "
                             f"built-in paths; pass one or the other (two tests, if you want "
                             f"both)")
        return [custom.api]
    every = FSDP1_PATHS if fsdp_version == 1 else FSDP2_PATHS
    apis = list(paths or DEFAULT_PATHS[(fsdp_version, tier)] or every)
    wrong = [a for a in apis if family_of(a) != family]
    if wrong:
        raise ValueError(f"paths {wrong} are not {family} paths (fsdp_version={fsdp_version}); "
                         f"its paths: {list(every)}")
    return apis


DEFAULT_CRASHES: tuple[str, ...] = ("start.rank0.over", "before_file.rank1.over",
                                    "torn.rank0.over", "own_file.rank1.over",
                                    "own_file.all.over", "commit.rank0.over")
"""The kill points ``crash=True`` checks a user's save at: before it writes, as one rank
opens its first data file (the others write theirs), inside a file, after one rank's and
after every rank's files, at DCP's commit; each saving into the first save's directory, as
a trainer's next checkpoint does."""


def crash_cases(cases: Sequence[Case], crash, custom: CustomPath | None) -> list[Case]:
    """A crash case (P16, ``Case.crash``) per value of ``crash`` (True:
    ``DEFAULT_CRASHES``) for each distinct world-size pair of ``cases`` whose save side has
    the ranks it kills; a chain of checkpoints is not one (``links`` 1). A bad value is a
    ValueError that names it."""
    if not crash:
        return []
    if custom is None:
        raise ValueError("crash= needs save_fn/load_fn: it kills your save")
    from ..cases import crash_parts

    values = DEFAULT_CRASHES if crash is True else tuple(crash)
    out, seen = [], set()
    for c in cases:
        for value in values:
            who = value.split(".")[1] if value.count(".") == 2 else ""
            if who[4:].isdigit() and who.startswith("rank") and int(who[4:]) >= c.world_size:
                continue  # kills a rank this world size does not have
            crash_parts(value, c.world_size)  # any other bad value: its ValueError
            key = (c.world_size, c.dst_world_size, c.strategy, value)
            if key not in seen:
                seen.add(key)
                out.append(dataclasses.replace(c, crash=value, links=1))
    return out


def user_cases(user: UserModel, *, paths: Sequence[str] | None = None,
               world_sizes: Sequence | None = None, use_orig_params: bool = False,
               custom: CustomPath | None = None, steps: int = 2, resume_steps: int = 2,
               batch: int = 12, dtype: str | None = None, seed: int = 0,
               groups: int | None = None,
               tier: str = "quick", fsdp_version: int = 2, links: int = 1,
               scheduler_after_load: bool = False, crash=False) -> list[Case]:
    """The cases of one round trip: each path (or the custom one) x each world-size spec
    (``spec.parse_sizes``: an HSDP spec runs as HYBRID_SHARD). Paths that cannot change
    world size or wrapping (``api_paths.resizable``) keep their same-size pairs only. The
    LR scheduler runs (``Case.scheduler``) when the user gave one, or when their own
    save/load takes the training state (then the zoo's, if they gave none). ``dtype``
    None: the model runs as it computes (``model_dtype``). ``links``: checkpoints in a
    chain (``Case.links``); ``scheduler_after_load``: the scheduler built after the user's
    load (``Case.scheduler_after_load``); ``crash``: True (``DEFAULT_CRASHES``) or the
    ``Case.crash`` values of the user's save's crash cases (P16), each at every world-size
    spec whose save side has the ranks it kills, after the round trips."""
    user.register()
    if dtype is None:
        dtype = model_dtype(user, seed)
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_NAMES)}, got {dtype!r}")
    specs = [parse_sizes(w) for w in (world_sizes or DEFAULT_PAIRS[tier])]
    apis = _paths(fsdp_version, tier, paths, custom)
    if custom is not None and custom.family != f"fsdp{fsdp_version}":
        raise ValueError(f"the custom path runs under {custom.family}, the round trip under "
                         f"fsdp_version={fsdp_version}")
    if custom is not None and not custom.app_state and user.scheduler is not None:
        raise ValueError("scheduler= needs save_fn/load_fn that take the training state "
                         "(save_fn(state, directory)): (model, optimizer, directory) "
                         "functions cannot save it")
    if fsdp_version == 2 and user.load_plan is not None and user.shard_fn is not None:
        raise ValueError("load_plan= and shard_fn= were both given: shard_fn shards both sides")
    scheduler = user.scheduler is not None or (custom is not None and custom.app_state)
    if scheduler_after_load and not (custom is not None and custom.app_state):
        raise ValueError("scheduler_after_load=True builds the scheduler after your load: it "
                         "needs save_fn/load_fn that take the training state "
                         "(save_fn(state, directory))")
    n_groups = _groups_of(user, seed) if groups is None else groups
    model, plan = user.name, user.plan_name
    load_plan = user.load_plan_name if user.load_plan_name != plan else None
    opt = user.optimizer_name
    out = []
    for api in apis:
        for n, m, hsdp in specs:
            if custom_family(api) is None and not resizable(api) and (
                    n != m or load_plan is not None):
                continue
            out.append(Case(model=model, plan=plan, load_plan=load_plan, optimizer=opt,
                            groups=n_groups, use_orig_params=use_orig_params and
                            fsdp_version == 1, world_size=n,
                            load_world_size=m if m != n else None, api=api, steps=steps,
                            resume_steps=resume_steps, batch=batch, seed=seed, dtype=dtype,
                            scheduler=scheduler, links=links,
                            scheduler_after_load=scheduler_after_load and scheduler,
                            strategy="HYBRID_SHARD" if hsdp else "FULL_SHARD"))
    out += crash_cases(out, crash, custom)
    if out and fsdp_version == 1:  # unit membership depends on the plans only: one check
        check_units_fit_groups(user, out[0])
    if not out:
        raise ValueError(f"no case: paths {apis} cannot run world sizes "
                         f"{[(n, m) for n, m, _ in specs]} (fsdp1.legacy_sharded loads at the "
                         f"saving size and plan only)")
    return out
