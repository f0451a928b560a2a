"""Round trips of a user's own model (and, optionally, their own save/load code) through FSDP
optimizer-state checkpointing, judged by the conformance properties. The library behind the
pytest plugin's ``fsdp_roundtrip`` fixture; it works without pytest too::

    from fsdp_conformance.roundtrip import check
    check("mypkg.models:make_model", "mypkg.models:batch", plan=["encoder", "head"],
          optimizer="mypkg.models:make_optimizer")      # raises RoundtripFailure on a failure

Rules
- Everything the ranks need crosses as an import reference (``Ref``: ``"pkg.module:name"``
  plus optional picklable arguments): rank functions and user callables travel by reference,
  so lambdas and nested functions are refused in the controller, with the reason.
- A user model is registered by name (``zoo.register_model``) in the controller and, before
  every call, on each rank; from there it is an ordinary zoo case: built with torch seeded
  by the case's seed, one global batch per step (ranks take rows ``r::world_size``), the
  same property code as the conformance run. The loss must be a mean over the batch's rows
  (FSDP averages gradients over ranks), or P2/P6 cannot match the single-process run.
- Built-in API paths (``sut.paths``): every property of ``runner.evaluate``.
- The user's own save/load (``CustomPath``): ``save(model, optim, directory)`` on every rank
  after training; then, at the load world size and plan, on a fresh model whose params are
  already restored, ``load(model, optim, directory)`` on every rank. The file format is the
  user's; judged are P0 (layout), P2 (training matches one process), P3 (each rank's state
  after the load == ``reference.shard_full`` of the state at the save, bitwise), P6 (resumed
  training == uninterrupted), P7 (the save leaves the optimizer unchanged, and load -> save
  -> load gives bitwise the state of the first load), P10 (partial state) and P11 (param
  groups). P1, P4, P5, P8 and P9 judge torch's own dicts and files: n/a.
- Verdicts go through ``known.py`` (a user optimizer counts as the zoo optimizer of the same
  class for matching), then through the limitations the caller declares (``Limitation``):
  a failing verdict they cover becomes "known"; a strict one that matches nothing fails
  the check ("fixed upstream?").
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import os
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .cases import CUSTOM_PREFIX, DTYPES, Case
from .properties.verdict import Verdict, error, fail, na, passed

# Built-in paths fsdp_roundtrip runs by default, per tier (FSDP1's current API first).
DEFAULT_PATHS = {"quick": ("fsdp1.full", "fsdp1.sharded"), "full": None}  # None: FSDP1_PATHS
# (save world size, load world size) pairs by default, per tier: same size, and a reshard
# onto an odd size (uneven shards, padding).
DEFAULT_PAIRS = {"quick": ((2, 2), (2, 3)),
                 "full": tuple((n, m) for n in (1, 2, 3, 4) for m in (1, 2, 3, 4))}
PROPERTY_NAMES = {"P0": "layout", "P1": "gather", "P2": "vs one process", "P3": "load",
                  "P4": "flatten", "P5": "rekey", "P6": "resume", "P7": "idempotent",
                  "P8": "serialise", "P9": "flags", "P10": "partial state", "P11": "param groups",
                  "P12": "golden", "P13": "time", "P14": "memory", "P15": "bad input"}
CKPT_DIR = "ckpt"
CKPT_AGAIN_DIR = "ckpt-again"


# --------------------------------------------------------------------------- references
@dataclass(frozen=True)
class Ref:
    """An importable callable, optionally with bound arguments: ``"pkg.module:qualname"``,
    ``args`` and ``kwargs`` (a tuple of (name, value) pairs). Pickles as plain data, so it
    crosses to ranks; ``repr`` is valid Python (used by reproducers)."""

    target: str
    args: tuple = ()
    kwargs: tuple = ()

    @classmethod
    def of(cls, obj: Any, what: str = "callable") -> "Ref":
        """A Ref for a "module:name" string, a module-level callable, or a functools.partial
        of one; TypeError (naming ``what``) for anything the ranks could not import."""
        if isinstance(obj, Ref):
            return obj
        if isinstance(obj, str):
            mod, sep, qual = obj.partition(":")
            if not sep or not mod or not qual:
                raise TypeError(f"{what}: expected 'package.module:name', got {obj!r}")
            ref = cls(obj)
            ref.resolve()  # fail here, in the controller, with the import error
            return ref
        if isinstance(obj, functools.partial):
            inner = cls.of(obj.func, what)
            return cls(inner.target, inner.args + tuple(obj.args),
                       inner.kwargs + tuple(sorted(obj.keywords.items())))
        qual = getattr(obj, "__qualname__", None)
        mod = getattr(obj, "__module__", None)
        if not callable(obj) or not qual or not mod or "<lambda>" in qual or "<locals>" in qual:
            raise TypeError(
                f"{what}: {obj!r} cannot be sent to the ranks; pass a module-level function or "
                f"class, or a 'package.module:name' string (lambdas and nested functions are "
                f"not importable by name)")
        if mod == "__main__" and not getattr(sys.modules.get("__main__"), "__file__", None):
            raise TypeError(f"{what}: {qual} is defined in an interactive __main__; define it "
                            f"in a module so the ranks can import it")
        ref = cls(f"{mod}:{qual}")
        if _import(ref.target) is not obj:
            raise TypeError(f"{what}: {mod}:{qual} does not name {obj!r} (shadowed or "
                            f"re-bound); pass a 'package.module:name' string")
        return ref

    def resolve(self) -> Callable:
        return _resolve(self)

    @property
    def name(self) -> str:
        return self.target.rpartition(":")[2].rpartition(".")[2]

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)


def _import(target: str) -> Any:
    mod, _, qual = target.partition(":")
    obj: Any = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


@functools.lru_cache(maxsize=None)
def _resolve(ref: Ref) -> Callable:
    """One object per Ref and process (the zoo registry compares factories by identity)."""
    fn = _import(ref.target)
    if ref.args or ref.kwargs:
        return functools.partial(fn, *ref.args, **dict(ref.kwargs))
    return fn


# --------------------------------------------------------------------------- user model
def plan_name(plan: Sequence[str]) -> str:
    """Readable, content-derived name of a wrapping plan: "root", "encoder+head", or
    "plan-<hash>" for long ones."""
    if not plan:
        return "root"
    name = "+".join(plan)
    if len(name) <= 40:
        return name
    return "plan-" + hashlib.sha1("\n".join(plan).encode()).hexdigest()[:8]


@dataclass(frozen=True)
class UserModel:
    """A user's model as the ranks rebuild it: ``factory() -> nn.Module``, ``data(step,
    batch) -> Tensor`` (the global batch of a step), ``plan`` (FQNs of submodules that are
    their own FSDP unit; the root always is one), an optimizer (a zoo name or
    ``factory(named_params) -> Optimizer``), an optional ``loss(model, x) -> scalar``, ignored
    submodules. Build it with :func:`user_model`, which checks and names everything."""

    name: str
    factory: Ref
    data: Ref
    plan: tuple[str, ...] = ()
    load_plan: tuple[str, ...] | None = None
    optimizer: str | Ref = "adam"
    loss: Ref | None = None
    ignored: tuple[str, ...] = ()
    optimizer_name: str = "adam"
    optimizer_kind: str = ""  # the zoo optimizer of the same class (for known.py), or ""

    @property
    def plan_name(self) -> str:
        return plan_name(self.plan)

    @property
    def load_plan_name(self) -> str | None:
        return None if self.load_plan is None else plan_name(self.load_plan)

    def register(self) -> None:
        """Register the model (and a user optimizer) in this process's zoo."""
        from . import zoo

        plans = {self.plan_name: self.plan}
        if self.load_plan is not None:
            plans[self.load_plan_name] = self.load_plan
        zoo.register_model(self.name, self.factory.resolve(), plans=plans,
                           ignored=self.ignored, batch_fn=self.data.resolve(),
                           loss_fn=self.loss.resolve() if self.loss else None)
        if isinstance(self.optimizer, Ref):
            zoo.register_optimizer(self.optimizer_name, self.optimizer.resolve())


# Names given out in this process: name -> identity of what it names (unique names keep the
# per-case caches, e.g. local_run's, honest).
_MODEL_NAMES: dict[str, tuple] = {}
_OPT_NAMES: dict[str, Ref] = {}


def _unique(base: str, ident: Any, taken: dict) -> str:
    name, i = base, 1
    while name in taken and taken[name] != ident:
        i += 1
        name = f"{base}~{i}"
    taken[name] = ident
    return name


def _wrap_fqns(model, plan, what: str) -> tuple[str, ...]:
    """A plan as FQNs: a list of FQNs, a policy ``policy(module) -> bool`` or a set of module
    classes (as torch's ModuleWrapPolicy), evaluated on the model built in the controller."""
    from torch import nn

    if plan is None:
        return ()
    if isinstance(plan, str):
        plan = [plan]
    mods = dict(model.named_modules())
    if callable(plan) and not isinstance(plan, (list, tuple, set, frozenset)):
        return tuple(n for n, m in mods.items() if n and plan(m))
    items = list(plan)
    if items and all(isinstance(c, type) and issubclass(c, nn.Module) for c in items):
        return tuple(n for n, m in mods.items() if n and isinstance(m, tuple(items)))
    bad = [f for f in items if not isinstance(f, str) or f not in mods or f == ""]
    if bad:
        raise ValueError(f"{what}: {bad} are not submodules of {type(model).__name__}; "
                         f"submodules: {[n for n in mods if n][:30]}")
    return tuple(dict.fromkeys(items))


def _optimizer_kind(optim) -> str:
    """The zoo optimizer with the same class (and momentum, for SGD), or ""."""
    from .zoo import OPTIMIZERS

    cls = type(optim)
    if cls.__name__ == "SGD":
        return "sgd_momentum" if optim.defaults.get("momentum", 0) else "sgd"
    for name, (zcls, _) in OPTIMIZERS.items():
        if zcls is cls and name != "sgd_momentum":
            return name
    return ""


def user_model(model, data, *, plan=(), load_plan=None, optimizer="adam", loss=None,
               ignored: Iterable[str] = (), name: str | None = None) -> UserModel:
    """Check and name a user's model (see :class:`UserModel`). ``model``, ``data``,
    ``optimizer`` (unless a zoo name) and ``loss`` are module-level callables or
    "package.module:name" strings; ``plan``/``load_plan`` a list of submodule FQNs, a policy
    ``policy(module) -> bool`` or a set of module classes."""
    from .zoo import OPTIMIZERS

    factory, data_ref = Ref.of(model, "model factory"), Ref.of(data, "data factory")
    loss_ref = Ref.of(loss, "loss function") if loss is not None else None
    import torch

    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG as it was
        torch.manual_seed(0)
        built = factory.resolve()()
    fqns = _wrap_fqns(built, plan, "plan")
    load_fqns = None if load_plan is None else _wrap_fqns(built, load_plan, "load_plan")
    ignored = tuple(ignored)
    _wrap_fqns(built, list(ignored), "ignored")
    if isinstance(optimizer, str) and optimizer in OPTIMIZERS:
        opt, opt_name, kind = optimizer, optimizer, optimizer
    else:
        opt = Ref.of(optimizer, "optimizer factory")
        opt_name = _unique(opt.name, opt, _OPT_NAMES)
        kind = _optimizer_kind(opt.resolve()(list(built.named_parameters())))
    base = name or factory.name
    ident = (factory, data_ref, loss_ref, ignored)
    mname = _unique(base, ident, _MODEL_NAMES)
    return UserModel(mname, factory, data_ref, fqns, load_fqns, opt, loss_ref, ignored,
                     opt_name, kind)


@dataclass(frozen=True)
class CustomPath:
    """A user's own checkpoint code, run on every rank in place of a built-in API path:
    ``save(fsdp_model, optimizer, directory)`` and ``load(fsdp_model, optimizer, directory)``
    (the directory is shared by all ranks). ``name`` shows in case ids as ``custom:<name>``."""

    save: Ref
    load: Ref
    name: str = "user"

    @classmethod
    def of(cls, save, load, name: str | None = None) -> "CustomPath":
        s, l_ = Ref.of(save, "save_fn"), Ref.of(load, "load_fn")
        return cls(s, l_, name or s.name)

    @property
    def api(self) -> str:
        return CUSTOM_PREFIX + self.name


# --------------------------------------------------------------------------- cases
def world_size_pair(spec) -> tuple[int, int]:
    """``2`` -> (2, 2); ``(2, 3)``, ``"2->3"``, ``"2"`` -> pairs."""
    if isinstance(spec, int):
        pair = (spec, spec)
    elif isinstance(spec, str):
        a, _, b = spec.partition("->")
        pair = (int(a), int(b or a))
    else:
        a, b = spec
        pair = (int(a), int(b))
    if min(pair) < 1:
        raise ValueError(f"world sizes must be >= 1, got {spec!r}")
    return pair


def pair_id(pair: tuple[int, int]) -> str:
    n, m = pair
    return f"ws{n}" if n == m else f"ws{n}->{m}"


def _groups_of(user: UserModel, seed: int) -> int:
    from .zoo import build_model, build_optimizer

    if not isinstance(user.optimizer, Ref):
        return 1
    model = build_model(user.name, seed)
    return len(build_optimizer(user.optimizer_name, list(model.named_parameters())).param_groups)


def check_units_fit_groups(user: UserModel, case: Case) -> None:
    """With ``use_orig_params=False`` a unit is one flat parameter, so all its params must
    sit in one param group; ValueError naming the unit and the groups otherwise."""
    if case.use_orig_params or not isinstance(user.optimizer, Ref):
        return
    from .properties.layouts import reference_layout
    from .zoo import build_model, build_optimizer

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
    from .sut.paths import FSDP1_PATHS, resizable

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    pairs = [world_size_pair(w) for w in (world_sizes or DEFAULT_PAIRS[tier])]
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


# --------------------------------------------------------------------------- rank side
def _err(obj) -> str | None:
    return obj["error"] if isinstance(obj, dict) and "error" in obj else None


def _build(ctx, case: Case, load_side: bool):
    from .sut import fsdp1
    from .sut.paths import grouping_name
    from .zoo import build_optimizer

    model = fsdp1.wrap_fsdp1(ctx, case, plan=case.dst_plan if load_side else case.plan)
    named = [(grouping_name(n, p), p) for n, p in model.named_parameters()]
    optim = build_optimizer(case.optimizer, named, case.groups, impl=case.impl)
    return model, optim, fsdp1.optimizer_keys(model, optim)


def _local(optim, keys) -> dict:
    from .sut.fsdp1 import _cpu, named_local

    return _cpu(named_local(optim.state_dict(), keys))


def _save_model_params(ctx, model, workdir: Path) -> None:
    import torch

    from .sut.paths import MODEL_FILE, full_params

    params = full_params(model)
    if ctx.rank == 0:
        tmp = workdir / f".{MODEL_FILE}.tmp{os.getpid()}"
        torch.save(params, tmp)
        os.replace(tmp, workdir / MODEL_FILE)
    return params


_CACHE = "fsdpc_roundtrip"


def _stash(ctx, case: Case, model, optim, keys) -> None:
    ctx.cache[_CACHE] = (case.id, model, optim, keys)


def _take(ctx, case: Case, keep: bool = False):
    held = ctx.cache.get(_CACHE) if keep else ctx.cache.pop(_CACHE, None)
    if held is None or held[0] != case.id:
        raise RuntimeError(f"no model of {case.id} held on rank {ctx.rank}: the stages of a "
                           f"custom round trip ran out of order (or the pool was rebuilt)")
    return held[1:]


def _fresh_loaded(ctx, case: Case, workdir: Path, params, load, ckpt: Path):
    """A fresh model at the load world size/plan with the saved params, then ``load``."""
    from .sut.paths import load_params

    model, optim, keys = _build(ctx, case, load_side=True)
    load_params(model, params)
    load(model, optim, str(ckpt))
    return model, optim, keys


def _stage_train(ctx, custom: CustomPath, case: Case, workdir: Path) -> dict:
    """Save side, 1: build, train ``case.steps`` steps, record; keep the model."""
    from .sut import fsdp1

    model, optim, keys = _build(ctx, case, load_side=False)
    losses = fsdp1.train(ctx, case, model, optim, case.steps)
    out: dict[str, Any] = {"rank": ctx.rank, "keys": keys, "losses": losses,
                           "meta": fsdp1.flat_metadata(model), "local": _local(optim, keys)}
    params = _save_model_params(ctx, model, workdir)
    if ctx.rank == 0:
        out["params"] = params
    (workdir / CKPT_DIR).mkdir(parents=True, exist_ok=True)
    _stash(ctx, case, model, optim, keys)
    return out


def _stage_save(ctx, custom: CustomPath, case: Case, workdir: Path) -> dict:
    """Save side, 2: the user's save (exceptions propagate: the pool reports every rank)."""
    model, optim, keys = _take(ctx, case)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        custom.save.resolve()(model, optim, str(workdir / CKPT_DIR))
    return {"timings": {"save": time.perf_counter() - t0}, "after_save": _local(optim, keys)}


def _stage_load(ctx, custom: CustomPath, case: Case, workdir: Path) -> dict:
    """Load side, 1: fresh model with the saved params, the user's load, record; keep it."""
    import torch

    from .sut import fsdp1
    from .sut.paths import MODEL_FILE

    _clear(ctx)
    params = torch.load(workdir / MODEL_FILE, weights_only=True)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optim, keys = _fresh_loaded(ctx, case, workdir, params, custom.load.resolve(),
                                           workdir / CKPT_DIR)
    out = {"rank": ctx.rank, "keys": keys, "meta": fsdp1.flat_metadata(model),
           "timings": {"load": time.perf_counter() - t0}, "loaded": _local(optim, keys)}
    _stash(ctx, case, model, optim, keys)
    return out


def _stage_resume(ctx, custom: CustomPath, case: Case, workdir: Path) -> dict:
    """Load side, 2: train ``case.resume_steps`` more steps on the loaded model."""
    from .sut import fsdp1
    from .sut.paths import full_params

    model, optim, keys = _take(ctx, case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        losses = fsdp1.train(ctx, case, model, optim, case.resume_steps, start_step=case.steps)
    out = {"losses": losses, "final_local": _local(optim, keys)}
    final = full_params(model)
    if ctx.rank == 0:
        out["final_params"] = final
    return out


def _stage_again(ctx, custom: CustomPath, case: Case, workdir: Path) -> dict:
    """Load side, 3 (P7), on fresh models: load, save again at once, load that."""
    import torch
    import torch.distributed as dist

    from .sut.paths import MODEL_FILE

    params = torch.load(workdir / MODEL_FILE, weights_only=True)
    again = workdir / f"{CKPT_AGAIN_DIR}-ws{ctx.world_size}"
    again.mkdir(parents=True, exist_ok=True)
    dist.barrier(group=ctx.group)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optim, keys = _fresh_loaded(ctx, case, workdir, params, custom.load.resolve(),
                                           workdir / CKPT_DIR)
        first = _local(optim, keys)
        custom.save.resolve()(model, optim, str(again))
        after = _local(optim, keys)
        del model, optim
        model, optim, keys = _fresh_loaded(ctx, case, workdir, params, custom.load.resolve(),
                                           again)
    return {"loaded_again": first, "after_resave": after, "reloaded": _local(optim, keys)}


def _clear(ctx) -> None:
    ctx.cache.pop(_CACHE, None)


STAGES = {"train": _stage_train, "save": _stage_save, "load": _stage_load,
          "resume": _stage_resume, "again": _stage_again}


def rank_custom(ctx, user: UserModel | None, custom: CustomPath, case: Case, workdir: str,
                stage: str) -> dict:
    """One stage of a custom round trip on a rank (``STAGES``). The stages are separate
    pool calls, and the user's code is not wrapped: an exception on any rank reaches the
    controller with its traceback (and the stacks of ranks left waiting) at once, and the
    observations of the earlier stages survive it."""
    if user is not None:
        user.register()
    return STAGES[stage](ctx, custom, case, Path(workdir))


def rank_save(ctx, user: UserModel | None, custom: CustomPath | None, case: Case,
              workdir: str) -> dict:
    """Save side of a built-in path on a rank: register the user model, then
    ``sut.paths.save_side`` (or the FSDP2 adapter's)."""
    from .run.execute import _sut

    if user is not None:
        user.register()
    return _sut(case.api).save_side(ctx, case, workdir)


def rank_load(ctx, user: UserModel | None, custom: CustomPath | None, case: Case,
              workdir: str) -> dict:
    """Load side of a built-in path on a rank (see :func:`rank_save`)."""
    from .run.execute import _sut

    if user is not None:
        user.register()
    return _sut(case.api).load_side(ctx, case, workdir)


# --------------------------------------------------------------------------- verdicts
def _tail(tb: str, lines: int = 12) -> str:
    return "\n".join(tb.strip().splitlines()[-lines:])


def _partial(layout, local) -> bool:
    """Some (non-ignored) param has no optimizer state in the single-process run."""
    skip = {s.fqn for s in layout.plain_params}
    have = set(local.optim_at_save["state"])
    return any(n not in have for n in local.params_at_save if n not in skip)


def p10_user(case: Case, layout, dst, full: dict | None, load_obs, local) -> Verdict:
    """P10 for a user model: partial state (no step yet, or params without state in the
    single-process run): the params with state, and their state names, are those of the
    single-process run, in what was saved (``full``, if there is one) and after the load."""
    from . import reference as ref

    if not (case.steps == 0 or _partial(layout, local)):
        return na("every param has state in this case: nothing partial to check")
    skip = {s.fqn for s in layout.plain_params}

    def shape_of(d):
        return {k: sorted(v) for k, v in d["state"].items() if k not in skip}

    want = shape_of(local.optim_at_save)
    problems = []
    if full is not None and shape_of(full) != want:
        problems.append(f"saved: params/state names {shape_of(full)}, single-process run has {want}")
    if all("loaded" in o and not _err(o["loaded"]) for o in load_obs):
        try:
            back = ref.gather_full(dst, [o["loaded"] for o in load_obs])
        except ref.StateDictMismatch as exc:
            return error(f"reference.gather_full rejected the loaded dicts: {exc}")
        if shape_of(back) != want:
            problems.append(f"after loading: params/state names {shape_of(back)}, expected {want}")
    if problems:
        return fail("\n".join(problems))
    return passed(f"{len(want)} params with state, as in the single-process run")


def rank_error_text(exc) -> str:
    """A RankError as: each raising rank's exception line, the ranks left waiting, then the
    first traceback's last lines."""
    from .run.faults import _last_line

    fails = list(getattr(exc, "failures", []))
    raised = [f for f in fails if f.kind.startswith("exception")]
    lines = [f"rank {f.rank}: {_last_line(f.detail)}" for f in raised]
    others = [f for f in fails if not f.kind.startswith("exception")]
    if others:
        lines.append(f"rank(s) {[f.rank for f in others]}: {others[0].kind} "
                     f"(blocked in a collective the failing rank never joined?)")
    if raised:
        lines += ["traceback of rank %d (last lines):" % raised[0].rank,
                  _tail(raised[0].detail, 8)]
    elif others:
        lines.append(_tail(others[0].detail, 8))
    return "\n".join(lines) or str(exc)


def _p7_custom(save_obs, load_obs, again_error) -> Verdict:
    from .properties.statediff import diff_state_dicts, format_diff

    problems = []
    for o in save_obs:
        d = diff_state_dicts(o["local"], o["after_save"])
        if d:
            problems.append(f"rank {o['rank']}: the save function changed the optimizer state "
                            f"(expected: the state before saving; got: after):\n" + format_diff(d))
    if again_error is not None:
        problems.append("load -> save -> load raised:\n" + rank_error_text(again_error))
    else:
        for o in load_obs:
            r = o["rank"]
            d = diff_state_dicts(o["loaded"], o["loaded_again"])
            if d:
                problems.append(f"rank {r}: loading the same checkpoint twice gives different "
                                f"states:\n" + format_diff(d))
            d = diff_state_dicts(o["loaded_again"], o["after_resave"])
            if d:
                problems.append(f"rank {r}: saving right after the load changed the optimizer "
                                f"state:\n" + format_diff(d))
            d = diff_state_dicts(o["loaded_again"], o["reloaded"])
            if d:
                problems.append(f"rank {r}: load -> save -> load is not a fixpoint (expected: "
                                f"the state after the first load; got: after the second):\n"
                                + format_diff(d))
    if problems:
        return fail("\n\n".join(problems))
    return passed("the save leaves the state unchanged; load -> save -> load bitwise the same")


def evaluate_custom(case: Case, save_obs: list[dict], load_obs: list[dict] | None,
                    errors: dict | None = None) -> dict[str, Verdict]:
    """Every property of a custom-path round trip (module docstring). ``errors``: the
    RankError of a stage ("save", "load", "resume", "again"), if it raised; ``load_obs``
    is None when the load side never ran."""
    from . import reference as ref
    from .properties.baseline import local_run
    from .properties import run_props as rp
    from .properties.layouts import reference_layout
    from .properties.reference_props import p0_layout
    from .run.execute import NOT_BUILT, PROPS
    from .zoo import model_spec

    errors = errors or {}
    layout = reference_layout(case)
    dst = reference_layout(case, load_side=True)
    v: dict[str, Verdict] = {}
    ordered = case.groups == 1
    p0s = p0_layout(layout, save_obs, ordered=ordered)
    p0l = p0_layout(dst, load_obs, ordered=ordered) if load_obs else passed("")
    v["P0"] = p0s if p0s.status != "pass" else (
        Verdict(p0l.status, "load side: " + p0l.detail) if p0l.status != "pass" else
        passed(f"save side {p0s.detail}" + (f"; load side {p0l.detail}" if load_obs else "")))
    theirs = "the file format is the user's own: judged by what the load restores (P3, P7)"
    for p in ("P1", "P4", "P5", "P8", "P9"):
        v[p] = na(theirs)
    for p, why in NOT_BUILT.items():
        v[p] = na(why)
    v["P15"] = na("not a bad-input case")
    local = local_run(case)
    try:
        full = ref.gather_full(layout, [o["local"] for o in save_obs])
    except ref.StateDictMismatch as exc:
        bad = error(f"reference.gather_full rejected torch's local dicts: {exc}")
        return {p: v.get(p, bad) for p in PROPS}
    ignored = model_spec(case.model).ignored
    why = (f"the model has ignored modules {list(ignored)}: FSDP trains them per rank, so no "
           f"single-process run can match") if ignored else ""
    v["P2"] = na(why) if why else rp.p2_vs_local(layout, full, local, case.dtype)
    for stage, what in (("save", "the save function"), ("load", "the load function")):
        if errors.get(stage) is not None:
            detail = f"{what} raised:\n" + rank_error_text(errors[stage])
            for p in ("P3", "P6", "P7", "P10", "P11"):
                v[p] = fail(detail)
            return {p: v[p] for p in PROPS}
    same = case.dst_world_size == case.world_size and case.dst_plan == case.plan
    v["P3"] = rp.p3_loaded(dst, full, load_obs, own=save_obs if same else None)
    if errors.get("resume") is not None:
        v["P6"] = fail("training after the load raised (the loaded state cannot be trained "
                       "on):\n" + rank_error_text(errors["resume"]))
    else:
        v["P6"] = na(why) if why else rp.p6_resume(dst, load_obs, local, case.dtype)
    v["P7"] = _p7_custom(save_obs, load_obs, errors.get("again"))
    v["P10"] = p10_user(case, layout, dst, None, load_obs, local)
    v["P11"] = rp.p11_groups(full, load_obs, local)
    return {p: v[p] for p in PROPS}


def evaluate_user(case: Case, save_obs, load_obs, workdir: Path) -> dict[str, Verdict]:
    """A built-in path with a user model: ``runner.evaluate``, and P10 from the evidence
    (which params the single-process run has state for) where the zoo's rule does not
    know the model."""
    from .properties.baseline import local_run
    from .properties import run_props as rp
    from .properties.layouts import reference_layout
    from .run.execute import evaluate

    v = evaluate(case, save_obs, load_obs, workdir)
    if v["P10"].status == "n/a":
        layout = reference_layout(case)
        local = local_run(case)
        if _partial(layout, local):
            full, bad = rp.to_full(case.api, save_obs)
            v["P10"] = bad if full is None else p10_user(
                case, layout, reference_layout(case, load_side=True), full, load_obs, local)
    return v


# --------------------------------------------------------------------------- limitations
@dataclass(frozen=True)
class Limitation:
    """A torch limitation declared by the caller for a test: failing (or erroring) verdicts
    of ``props`` whose detail contains ``symptom`` become "known"; ``strict``: a check in
    which it matches nothing fails ("fixed upstream?")."""

    key: str
    props: tuple[str, ...]
    reason: str = ""
    symptom: str = ""
    strict: bool = True

    @classmethod
    def of(cls, key_or_props, *, reason: str = "", symptom: str = "", props=None,
           strict: bool = True) -> "Limitation":
        """A key of ``known.py`` (its properties, reason and symptom), or property ids
        ("P1", "P1,P6", ["P1", "P6"]) with a ``reason``."""
        from .known.entries import KNOWN

        if isinstance(key_or_props, Limitation):
            return key_or_props
        entry = next((k for k in KNOWN if k.key == key_or_props), None)
        if entry is not None:
            return cls(entry.key, tuple(props or entry.props + entry.also),
                       reason or entry.reason, symptom or entry.symptom, strict)
        ids = key_or_props.split(",") if isinstance(key_or_props, str) else list(key_or_props)
        ids = [p.strip() for p in ids]
        if not ids or any(p not in PROPERTY_NAMES for p in ids):
            raise ValueError(f"fsdp_known: {key_or_props!r} is neither a key of "
                             f"fsdp_conformance/known.py ({sorted(k.key for k in KNOWN)}) nor "
                             f"property ids like 'P1' or 'P1,P6'")
        if not reason:
            raise ValueError(f"fsdp_known({key_or_props!r}) needs reason=... (what torch gets "
                             f"wrong, and the upstream issue if there is one)")
        return cls(",".join(ids), tuple(props or ids), reason, symptom, strict)


def apply_declared(verdicts: dict[str, Verdict], declared: Sequence[Limitation],
                   hits: set | None = None) -> dict[str, Verdict]:
    """Failing verdicts covered by a declared limitation become "known" (``hits`` collects
    the keys that matched)."""
    out = {}
    for p, v in verdicts.items():
        if v.status in ("fail", "error"):
            lim = next((d for d in declared if p in d.props and d.symptom in v.detail), None)
            if lim is not None:
                v = Verdict("known", f"declared known limitation {lim.key!r}: {lim.reason}"
                                     f"\n\n{v.detail}", lim.key)
                if hits is not None:
                    hits.add(lim.key)
        out[p] = v
    return out


def _known_view(case: Case, user: UserModel | None) -> Case:
    """The case known.py sees: a user optimizer counts as the zoo optimizer of its class."""
    if user is not None and user.optimizer_kind and user.optimizer_kind != case.optimizer:
        return dataclasses.replace(case, optimizer=user.optimizer_kind)
    return case


# --------------------------------------------------------------------------- running
def run_user_case(case: Case, user: UserModel | None = None, custom: CustomPath | None = None,
                  *, backend: str | None = None, timeout: float = 120.0,
                  declared: Sequence[Limitation] = (), hits: set | None = None):
    """Save, load and judge one case on the shared pools; never raises for a torch or rank
    failure (it becomes the verdicts). Zoo cases without a custom path go through
    ``runner.run_case`` unchanged."""
    from .harness import get_pool
    from .harness.errors import RankError, RankTimeout
    from .report.run_report import CaseResult
    from .run.execute import _all, _apply_known, run_case

    rundir = Path(tempfile.mkdtemp(prefix="fsdpc-rt-"))
    try:
        if user is None and custom is None:
            r = run_case(case, rundir, backend=backend, timeout=timeout,
                         fault_timeout=min(timeout, 30.0))
            return dataclasses.replace(r, properties=apply_declared(r.properties, declared, hits))
        if user is not None:
            user.register()
        t0 = time.perf_counter()
        timings: dict[str, float] = {}

        def finish(verdicts):
            verdicts = _apply_known(_known_view(case, user), verdicts)
            verdicts = apply_declared(verdicts, declared, hits)
            return CaseResult(case, verdicts, {**timings, "total": time.perf_counter() - t0})

        if custom is not None:
            return finish(_run_custom(case, user, custom, rundir, backend, timeout, timings))
        try:
            save_obs = get_pool(case.world_size, backend, timeout=timeout).run(
                rank_save, user, custom, case, str(rundir), timeout=timeout, seed=case.seed)
        except RankError as exc:
            return finish(_all(error(f"save side failed: {exc}")))
        timings["save"] = max(o.get("timings", {}).get("save", 0.0) for o in save_obs)
        try:
            load_obs = get_pool(case.dst_world_size, backend, timeout=timeout).run(
                rank_load, user, custom, case, str(rundir), timeout=timeout, seed=case.seed)
        except RankError as exc:
            kind = "hung" if isinstance(exc, RankTimeout) else "failed"
            return finish(_all(error(f"load side {kind}: {exc}")))
        timings["load"] = max(o.get("timings", {}).get("load", 0.0) for o in load_obs)
        try:
            verdicts = evaluate_user(case, save_obs, load_obs, rundir)
        except Exception:  # noqa: BLE001  (a bug of the suite: say so)
            verdicts = _all(error("the suite failed while evaluating this case:\n"
                                  + traceback.format_exc()))
        return finish(verdicts)
    finally:
        shutil.rmtree(rundir, ignore_errors=True)


def _run_custom(case: Case, user, custom: CustomPath, rundir: Path, backend, timeout: float,
                timings: dict) -> dict[str, Verdict]:
    """The stages of a custom round trip (``rank_custom``), then ``evaluate_custom``."""
    from .harness import get_pool
    from .harness.errors import RankError
    from .run.execute import _all

    def stage(ws: int, name: str) -> list[dict]:
        return get_pool(ws, backend, timeout=timeout).run(
            rank_custom, user, custom, case, str(rundir), name, timeout=timeout, seed=case.seed)

    def merge(obs: list[dict], more: list[dict]) -> None:
        for o, m in zip(obs, more):
            o.update({k: v for k, v in m.items() if k != "timings"})
            o.setdefault("timings", {}).update(m.get("timings", {}))

    errors: dict[str, RankError] = {}
    try:
        save_obs = stage(case.world_size, "train")
    except RankError as exc:
        return _all(fail("building or training the model under FSDP raised:\n"
                         + rank_error_text(exc)))
    load_obs = None
    try:
        merge(save_obs, stage(case.world_size, "save"))
        timings["save"] = max(o["timings"].get("save", 0.0) for o in save_obs)
    except RankError as exc:
        errors["save"] = exc
    if "save" not in errors:
        try:
            load_obs = stage(case.dst_world_size, "load")
            timings["load"] = max(o["timings"].get("load", 0.0) for o in load_obs)
        except RankError as exc:
            errors["load"] = exc
    if load_obs is not None:
        for name in ("resume", "again"):
            try:
                merge(load_obs, stage(case.dst_world_size, name))
            except RankError as exc:
                errors[name] = exc
    try:
        return evaluate_custom(case, save_obs, load_obs, errors)
    except Exception:  # noqa: BLE001  (a bug of the suite: say so)
        return _all(error("the suite failed while evaluating this case:\n"
                          + traceback.format_exc()))


class RoundtripFailure(AssertionError):
    """A round trip failed a property; the message names the case, the property, the
    key/param/rank with expected vs got, and how to rerun just that case."""

    def __init__(self, message: str, results=()):
        super().__init__(message)
        self.results = list(results)


def failing(result) -> dict[str, Verdict]:
    return {p: v for p, v in result.properties.items() if v.status in ("fail", "error")}


def reproducer(case: Case, user: UserModel | None = None,
               custom: CustomPath | None = None) -> str:
    """A standalone Python script that reruns ``case`` and prints its verdicts (run it
    where the user's modules import, e.g. the project root)."""
    args = [repr(case)]
    if user is not None:
        args.append(f"user={user!r}")
    if custom is not None:
        args.append(f"custom={custom!r}")
    body = ",\n              ".join(args)
    return ("from fsdp_conformance.cases import Case\n"
            "from fsdp_conformance.roundtrip import CustomPath, Ref, UserModel, reproduce\n\n"
            "if __name__ == \"__main__\":  # the ranks re-import this file\n"
            f"    raise SystemExit(reproduce({body}))\n")


def _indent(text: str, n: int) -> str:
    return "\n".join(" " * n + ln for ln in text.splitlines())


def failure_message(results, *, user: UserModel | None = None,
                    custom: CustomPath | None = None,
                    rerun: Callable[[Case], str] | None = None,
                    detail_lines: int = 30) -> str:
    """Which cases failed which property, with the detail (key/param/rank, expected vs got)
    and how to rerun each case alone."""
    bad = [r for r in results if failing(r)]
    out = [f"fsdp round trip: {len(bad)} of {len(results)} case(s) failed"]
    for r in bad:
        out.append("")
        out.append(f"case {r.case.id}")
        for p, v in failing(r).items():
            lines = v.detail.strip().splitlines() or ["(no detail)"]
            head = f"  {p} ({PROPERTY_NAMES.get(p, '?')}) {v.status.upper()}: {lines[0]}"
            out.append(head)
            more = lines[1:detail_lines]
            if more:
                out.append(_indent("\n".join(more), 6))
            if len(lines) > detail_lines:
                out.append(f"      ... {len(lines) - detail_lines} more line(s)")
        if rerun is not None:
            out.append(f"  rerun just this case: {rerun(r.case)}")
        out.append("  standalone reproducer (save as repro.py, run from your project root):")
        out.append(_indent(reproducer(r.case, user, custom), 4))
    return "\n".join(out)


def check(model=None, data=None, *, plan=(), load_plan=None, optimizer="adam", loss=None,
          ignored: Iterable[str] = (), name: str | None = None, paths=None, world_sizes=None,
          use_orig_params: bool = False, save_fn=None, load_fn=None,
          custom_name: str | None = None, steps: int = 2, resume_steps: int = 2,
          batch: int = 12, dtype: str = "fp64", seed: int = 0, groups: int | None = None,
          tier: str = "quick", backend: str | None = None, timeout: float = 120.0,
          known: Sequence = (), only: Sequence[str] | None = None,
          rerun: Callable[[Case], str] | None = None,
          on_result: Callable[[Any], None] | None = None) -> list:
    """Round-trip a user's model through the chosen paths and world-size pairs (or through
    ``save_fn``/``load_fn``), judge every property and raise :class:`RoundtripFailure` if any
    fails. Returns the CaseResults. ``only``: run just the cases with these ids; ``known``:
    declared limitations (:meth:`Limitation.of` arguments)."""
    if model is None or data is None:
        raise TypeError("check needs a model factory and a data factory")
    if (save_fn is None) != (load_fn is None):
        raise TypeError("pass both save_fn and load_fn (or neither)")
    user = user_model(model, data, plan=plan, load_plan=load_plan, optimizer=optimizer,
                      loss=loss, ignored=ignored, name=name)
    custom = CustomPath.of(save_fn, load_fn, custom_name) if save_fn is not None else None
    cases = user_cases(user, paths=paths, world_sizes=world_sizes,
                       use_orig_params=use_orig_params, custom=custom, steps=steps,
                       resume_steps=resume_steps, batch=batch, dtype=dtype, seed=seed,
                       groups=groups, tier=tier)
    if only:
        cases = [c for c in cases if c.id in set(only)]
    return run_checked(cases, user, custom, backend=backend, timeout=timeout, known=known,
                       rerun=rerun, on_result=on_result)


def run_checked(cases: Sequence[Case], user: UserModel | None = None,
                custom: CustomPath | None = None, *, backend: str | None = None,
                timeout: float = 120.0, known: Sequence = (),
                rerun: Callable[[Case], str] | None = None,
                on_result: Callable[[Any], None] | None = None) -> list:
    """Run ``cases``; raise :class:`RoundtripFailure` if any property fails or errors, or if
    a strict declared limitation matched nothing."""
    declared = [Limitation.of(k) if not isinstance(k, Limitation) else k for k in known]
    hits: set = set()
    results = []
    for case in cases:
        r = run_user_case(case, user, custom, backend=backend, timeout=timeout,
                          declared=declared, hits=hits)
        results.append(r)
        if on_result is not None:
            on_result(r)
    if any(failing(r) for r in results):
        raise RoundtripFailure(failure_message(results, user=user, custom=custom, rerun=rerun),
                               results)
    unused = [d for d in declared if d.strict and d.key not in hits]
    if unused and results:
        raise RoundtripFailure(
            "declared known limitation(s) did not reproduce in any case: "
            + ", ".join(repr(d.key) for d in unused)
            + "\n(fixed upstream? remove the declaration, or pass strict=False)\ncases: "
            + ", ".join(r.case.id for r in results), results)
    return results


def reproduce(case: Case, user: UserModel | None = None, custom: CustomPath | None = None,
              *, backend: str | None = None, timeout: float = 120.0) -> int:
    """Run one case, print every verdict; 0 if none fails or errors, else 1 (what the
    reproducers printed by failure messages call)."""
    r = run_user_case(case, user, custom, backend=backend, timeout=timeout)
    for p, v in r.properties.items():
        print(f"{p:>4} {v.status:6} {v.detail.splitlines()[0] if v.detail else ''}")
    bad = failing(r)
    if bad:
        print("\n" + failure_message([r], user=user, custom=custom))
    return 1 if bad else 0
