"""The cases of one user round trip: each built-in path (or the user's own) x each world-size
pair, checked against what FSDP1 refuses by design before any rank runs.
"""
from __future__ import annotations

from typing import Sequence

from ..cases import CUSTOM_PREFIX, DTYPE_NAMES, Case
from ..properties.layouts import reference_layout
from ..sut.paths import FSDP1_PATHS, resizable
from ..zoo import build_model, build_optimizer
from .model import CustomPath, UserModel
from .refs import Ref
from .spec import DEFAULT_PAIRS, DEFAULT_PATHS, world_size_pair


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


def user_cases(user: UserModel, *, paths: Sequence[str] | None = None,
               world_sizes: Sequence | None = None, use_orig_params: bool = False,
               custom: CustomPath | None = None, steps: int = 2, resume_steps: int = 2,
               batch: int = 12, dtype: str = "fp64", seed: int = 0, groups: int | None = None,
               tier: str = "quick") -> list[Case]:
    """The cases of one round trip: each path (or the custom one) x each world-size pair.
    Paths that cannot change world size or wrapping (``sut.paths.resizable``) keep their
    same-size pairs only."""
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_NAMES)}, got {dtype!r}")
    pairs = [world_size_pair(w) for w in (world_sizes or DEFAULT_PAIRS[tier])]
    if custom is not None and paths:
        raise ValueError(f"paths={list(paths)} and save_fn/load_fn were both given: the round "
                         f"trip goes through your save_fn/load_fn, not through built-in paths; "
                         f"pass one or the other (two tests, if you want both)")
    apis = [custom.api] if custom is not None else list(paths or DEFAULT_PATHS[tier]
                                                        or FSDP1_PATHS)
    user.register()
    n_groups = _groups_of(user, seed) if groups is None else groups
    model, plan = user.name, user.plan_name
    load_plan = user.load_plan_name if user.load_plan_name != plan else None
    opt = user.optimizer_name
    out = []
    for api in apis:
        for n, m in pairs:
            if not api.startswith(CUSTOM_PREFIX) and not resizable(api) and (
                    n != m or load_plan is not None):
                continue
            out.append(Case(model=model, plan=plan, load_plan=load_plan, optimizer=opt,
                            groups=n_groups, use_orig_params=use_orig_params, world_size=n,
                            load_world_size=m if m != n else None, api=api, steps=steps,
                            resume_steps=resume_steps, batch=batch, seed=seed, dtype=dtype))
    if out:  # unit membership depends on the plans only: one check covers every case
        check_units_fit_groups(user, out[0])
    if not out:
        raise ValueError(f"no case: paths {apis} cannot run world sizes {pairs} "
                         f"(fsdp1.legacy_sharded loads at the saving size and plan only)")
    return out

