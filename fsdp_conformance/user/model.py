"""A user's model and checkpoint code as the ranks rebuild them: ``UserModel`` (checked and
named by :func:`user_model`) and ``CustomPath`` (the user's own save/load functions).

Rules
- A user model is registered by name (``zoo.register_model``) in the controller and, before
  every call, on each rank; from there it is an ordinary zoo case: built with torch seeded
  by the case's seed, one global batch per step (ranks take rows ``r::world_size``). The
  loss must be a mean over the batch's rows (FSDP averages gradients over ranks), or P2/P6
  cannot match the single-process run.
- Names are unique per process: a second model with the same factory name but other
  callables gets ``<name>~2`` (the per-case caches, e.g. local_run's, stay honest).
"""
from __future__ import annotations

import hashlib
import inspect
from dataclasses import KW_ONLY, dataclass
from typing import Any, Iterable, Sequence

import torch
from torch import nn

from .. import zoo
from ..zoo.models import FROZEN_FROM_START, PARAM_WITHOUT_GRAD
from ..zoo.optimizers import optimizer_traits_of
from ..api_paths import CUSTOM_PREFIXES, custom_api
from .refs import Ref


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
    """A user's model as the ranks rebuild it. Build it with :func:`user_model`, which checks
    and names everything."""

    name: str
    """The zoo name it is registered under (what case ids show)."""
    factory: Ref
    """``factory() -> nn.Module``."""
    data: Ref
    """``data(step, batch) -> Tensor``: the global batch of a step."""
    _: KW_ONLY
    plan: tuple[str, ...] = ()
    """FQNs of submodules that are their own FSDP unit at the save (the root always is one)."""
    load_plan: tuple[str, ...] | None = None
    """The plan at the load, if it differs (None: the save's)."""
    optimizer: str | Ref = "adam"
    """A zoo optimizer name, or ``factory(named_params) -> Optimizer``."""
    loss: Ref | None = None
    """``loss(model, x) -> scalar`` (a mean over the batch's rows); None: the zoo's."""
    ignored: tuple[str, ...] = ()
    """FQNs of submodules FSDP ignores."""
    optimizer_name: str = "adam"
    """The zoo name the optimizer is registered under."""
    optimizer_kind: str = ""
    """The zoo optimizer of the same class (what known/entries.py matches), or ""."""
    optimizer_traits: tuple[str, ...] = ()
    """What a fresh one of the user's optimizers has that a known torch limitation may
    touch (``zoo.optimizers.OPTIMIZER_TRAITS``, ``optimizer_traits_of``)."""
    shard_fn: Ref | None = None
    """``shard_fn(model, mesh)``: the user's own ``fully_shard`` calls (FSDP2; None: the
    plan's modules, deepest first, then the root)."""
    scheduler: Ref | None = None
    """``scheduler(optimizer) -> LRScheduler``, stepped after every optimizer step (None: no
    scheduler, or the zoo's ExponentialLR where a round trip needs one)."""
    traits: tuple[str, ...] = ()
    """What the model has that a known torch limitation may touch (``zoo.TRAITS``,
    ``traits_of``): the known limitations see it by these, not by a zoo model's name."""

    @property
    def plan_name(self) -> str:
        """What case ids show as the wrapping: the plan's name, or, where the user's own
        ``shard_fn`` shards the model (the plan unused), the function's name."""
        if self.shard_fn is not None and not self.plan:
            return "by-" + self.shard_fn.target.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
        return plan_name(self.plan)

    @property
    def load_plan_name(self) -> str | None:
        return None if self.load_plan is None else plan_name(self.load_plan)

    def register(self) -> None:
        """Register the model (and a user optimizer) in this process's zoo."""
        plans = {self.plan_name: self.plan}
        if self.load_plan is not None:
            plans[self.load_plan_name] = self.load_plan
        zoo.register_model(self.name, self.factory.resolve(), plans=plans,
                           ignored=self.ignored, batch_fn=self.data.resolve(),
                           loss_fn=self.loss.resolve() if self.loss else None,
                           shard_fn=self.shard_fn.resolve() if self.shard_fn else None,
                           scheduler_fn=self.scheduler.resolve() if self.scheduler else None,
                           traits=self.traits)
        if isinstance(self.optimizer, Ref):
            zoo.register_optimizer(self.optimizer_name, self.optimizer.resolve(),
                                   traits=self.optimizer_traits)


# Names given out in this process: name -> identity of what it names (unique names keep the
# per-case caches, e.g. local_run's, honest).
_MODEL_NAMES: dict[str, tuple] = {}
_OPT_NAMES: dict[str, Ref] = {}


def _unique(base: str, ident: Any, taken: dict, reserved=()) -> str:
    """``base``, or ``base~2``, ``base~3``... : the first name not taken by another
    identity and not ``reserved`` (the zoo's own names: a user's factory that happens to be
    called ``adam`` is not the zoo's Adam)."""
    name, i = base, 1
    while (name in taken and taken[name] != ident) or name in reserved:
        i += 1
        name = f"{base}~{i}"
    taken[name] = ident
    return name


def _wrap_fqns(model, plan, what: str) -> tuple[str, ...]:
    """A plan as FQNs: a list of FQNs, a policy ``policy(module) -> bool`` or a set of module
    classes (as torch's ModuleWrapPolicy), evaluated on the model built in the controller."""
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
    cls = type(optim)
    if cls.__name__ == "SGD":
        return "sgd_momentum" if optim.defaults.get("momentum", 0) else "sgd"
    for name, (zcls, _) in zoo.ALL_OPTIMIZERS.items():
        if zcls is cls and name != "sgd_momentum":
            return name
    return ""


def traits_of(built: nn.Module, data, loss) -> tuple[str, ...]:
    """The model's ``zoo.TRAITS``, seen in one training step of ``built`` in this process
    (torch seeded; the caller's RNG is left as it was): a param built frozen is
    ``FROZEN_FROM_START``; a trainable param the backward leaves without a gradient is
    ``PARAM_WITHOUT_GRAD`` (a model that cannot take that step here has not that one: its
    cases say why when they run)."""
    frozen = (FROZEN_FROM_START,) if any(not p.requires_grad for p in built.parameters()) \
        else ()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            x = data(0, 4)
            out = loss(built, x) if loss is not None else zoo.loss_of(built, x)
            out.backward()
    except Exception:  # noqa: BLE001 - a model the controller cannot step: no such trait
        return frozen
    idle = [n for n, p in built.named_parameters() if p.requires_grad and p.grad is None]
    built.zero_grad(set_to_none=True)
    return frozen + ((PARAM_WITHOUT_GRAD,) if idle else ())


def user_model(model, data, *, plan=(), load_plan=None, optimizer="adam", loss=None,
               ignored: Iterable[str] = (), name: str | None = None, shard_fn=None,
               scheduler=None) -> UserModel:
    """Check and name a user's model (see :class:`UserModel`). ``model``, ``data``,
    ``optimizer`` (unless a zoo name), ``loss``, ``shard_fn`` and ``scheduler`` are
    module-level callables or "package.module:name" strings; ``plan``/``load_plan`` a list
    of submodule FQNs, a policy ``policy(module) -> bool`` or a set of module classes."""
    factory, data_ref = Ref.of(model, "model factory"), Ref.of(data, "data factory")
    loss_ref = Ref.of(loss, "loss function") if loss is not None else None
    shard_ref = Ref.of(shard_fn, "shard_fn") if shard_fn is not None else None
    sched_ref = Ref.of(scheduler, "scheduler factory") if scheduler is not None else None
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG as it was
        torch.manual_seed(0)
        built = factory.resolve()()
    fqns = _wrap_fqns(built, plan, "plan")
    load_fqns = None if load_plan is None else _wrap_fqns(built, load_plan, "load_plan")
    ignored = tuple(ignored)
    _wrap_fqns(built, list(ignored), "ignored")
    opt_traits: tuple[str, ...] = ()
    if isinstance(optimizer, str) and optimizer in zoo.ALL_OPTIMIZERS:
        opt, opt_name, kind = optimizer, optimizer, optimizer
    else:
        opt = Ref.of(optimizer, "optimizer factory")
        opt_name = _unique(opt.name, opt, _OPT_NAMES, reserved=zoo.ALL_OPTIMIZERS)
        fresh = opt.resolve()(list(built.named_parameters()))
        kind, opt_traits = _optimizer_kind(fresh), optimizer_traits_of(fresh)
    base = name or factory.name
    ident = (factory, data_ref, loss_ref, ignored, shard_ref, sched_ref)
    mname = _unique(base, ident, _MODEL_NAMES, reserved=zoo.MODELS)
    traits = traits_of(built, data_ref.resolve(), loss_ref.resolve() if loss_ref else None)
    return UserModel(mname, factory, data_ref, plan=fqns, load_plan=load_fqns, optimizer=opt,
                     loss=loss_ref, ignored=ignored, optimizer_name=opt_name,
                     optimizer_kind=kind, optimizer_traits=opt_traits, shard_fn=shard_ref,
                     scheduler=sched_ref,
                     traits=traits)


def _arity(fn, what: str) -> int:
    """How many positional arguments ``fn`` takes: 2 (``state, directory``) or 3
    (``model, optimizer, directory``); TypeError naming ``what`` otherwise."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 3
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 3
    n = sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            and p.default is p.empty)
    if n not in (2, 3):
        raise TypeError(f"{what} {getattr(fn, '__name__', fn)!r} takes {n} positional "
                        f"arguments; expected (state, directory) -- the training state: "
                        f"model, optimizer, scheduler, step -- or (model, optimizer, "
                        f"directory)")
    return n


def pair_name(save: Ref, load: Ref) -> str:
    """The name case ids show for a save/load pair: the save function's ``label``, followed
    by ``+<load's label>`` unless the load is the save's own counterpart (the same name with
    ``save`` read as ``load``, the same bound arguments), so two loads of one save, or two
    partials of one function, never share an id."""
    if ("save" in save.name and load.name == save.name.replace("save", "load")
            and (load.args, load.kwargs) == (save.args, save.kwargs)):
        return save.label
    return f"{save.label}+{load.label}"


@dataclass(frozen=True)
class CustomPath:
    """A user's own checkpoint code, run on every rank in place of a built-in API path (the
    directory is shared by all ranks)."""

    save: Ref
    """``save(state, directory)`` (``state``: the ``TrainState``: model, optimizer,
    scheduler, step) or ``save(model, optimizer, directory)``, on every rank after
    training."""
    load: Ref
    """``load(state, directory)`` (restore the optimizer, scheduler and ``state.step`` in
    place) or ``load(model, optimizer, directory)``, on every rank, on a fresh model whose
    params are already restored."""
    _: KW_ONLY
    name: str = "user"
    """What case ids show, as ``custom:<name>`` (``fsdp2.custom:<name>`` under FSDP2); by
    default ``pair_name`` of the two functions, then ``@<setup's label>`` where there is a
    ``setup``."""
    family: str = "fsdp2"
    """The FSDP API the round trip runs under: ``"fsdp2"`` (``fully_shard``, the default, as
    in ``check``) or ``"fsdp1"``."""
    app_state: bool = False
    """The functions take the training state (``save(state, directory)``), not
    ``(model, optimizer, directory)``: decided from their signatures."""
    load_model: Ref | None = None
    """``load_model(model, directory) -> model or None``: the model's part of a load that
    builds its optimizer after loading the model (``load_fn=(load_model, load)``); the
    optimizer is then built on the parameters the model holds after it, and ``load``
    restores the optimizer. None: the optimizer is built before ``load``."""
    setup: Ref | None = None
    """``setup(state)``: a framework's setup of the training state, run on every rank after
    the suite built the model, optimizer and scheduler and before training (the save side)
    or before ``load`` (each load side): it may replace ``state.model``,
    ``state.optimizer`` and ``state.scheduler`` with what the framework returns
    (accelerate's ``prepare``, Lightning Fabric's ``setup``). None: none."""

    @classmethod
    def of(cls, save, load, name: str | None = None, family: str = "fsdp2",
           setup=None) -> "CustomPath":
        """``load`` may be a pair ``(load_model, load_optimizer)``: see ``load_model``;
        ``setup``: see ``setup``."""
        model_part = None
        if isinstance(load, tuple):
            if len(load) != 2:
                raise TypeError(f"load_fn as a tuple is (load_model, load_optimizer), got "
                                f"{len(load)} items")
            model_part = Ref.of(load[0], "load_fn[0] (load_model)")
            if _arity(model_part.resolve(), "load_fn[0] (load_model)") != 2:
                raise TypeError("load_fn[0] (load_model) takes (model, directory)")
            load = load[1]
        s, l_ = Ref.of(save, "save_fn"), Ref.of(load, "load_fn")
        n_save, n_load = _arity(s.resolve(), "save_fn"), _arity(l_.resolve(), "load_fn")
        if n_save != n_load:
            raise TypeError(f"save_fn takes {n_save} positional arguments and load_fn "
                            f"{n_load}: both take (state, directory), or both (model, "
                            f"optimizer, directory)")
        if family not in CUSTOM_PREFIXES:
            raise ValueError(f"fsdp_version must be 1 or 2, got family {family!r}")
        setup_ref = None
        if setup is not None:
            if n_save != 2:
                raise TypeError("setup_fn(state) sets up the training state: it needs "
                                "save_fn/load_fn that take it (save_fn(state, directory))")
            setup_ref = Ref.of(setup, "setup_fn")
        default = pair_name(s, l_) + (f"@{setup_ref.label}" if setup_ref is not None else "")
        return cls(s, l_, name=name or default, family=family,
                   app_state=n_save == 2, load_model=model_part, setup=setup_ref)

    @property
    def api(self) -> str:
        return custom_api(self.family, self.name)
