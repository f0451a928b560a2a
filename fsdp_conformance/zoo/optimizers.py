"""Optimizers by name, with one or several param groups.

Rule: ``build_optimizer(name, named_params, groups)`` puts every param in group 0 unless
``groups == 2``: then params whose name contains "head" or "out" or "block.2" go to a second
group with its own hyperparameters (a distinct lr and weight_decay), so mis-mapped param
groups show up as wrong values."""
from __future__ import annotations

from typing import Callable, Iterable

import torch

from .models import model_spec

OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": 0.05}),  # stateless: no momentum
    "sgd_momentum": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
    "adam": (torch.optim.Adam, {"lr": 0.01}),
    "adamw": (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
    "adadelta": (torch.optim.Adadelta, {"lr": 0.5}),
    "adagrad": (torch.optim.Adagrad, {"lr": 0.05}),
    "rmsprop": (torch.optim.RMSprop, {"lr": 0.01}),
}


_MORE: tuple[tuple[str, str, dict], ...] = (
    ("nadam", "NAdam", {"lr": 0.01}),  # a 0-dim mu_product beside step
    ("radam", "RAdam", {"lr": 0.01}),
    ("adamax", "Adamax", {"lr": 0.01}),  # exp_inf: a running max
    ("asgd", "ASGD", {"lr": 0.01, "t0": 1}),  # 0-dim eta and mu, param-shaped ax
    ("rprop", "Rprop", {"lr": 0.01}),  # prev, step_size
    # row_var, col_var for a 2-D param (not param-shaped), variance for a 1-D one
    ("adafactor", "Adafactor", {"lr": 0.01}),
    # orthogonalised momentum of whole matrices; 2-D params only (zoo model "matrices")
    ("muon", "Muon", {"lr": 0.01}),
    # state held once (under the first param) for all params: flat direction and gradient
    # over every param, history lists, 0-dim H_diag, Python numbers; one closure evaluation
    # a step (max_iter=1: zoo.models.train_step)
    ("lbfgs", "LBFGS", {"lr": 0.1, "max_iter": 1}),
)

MORE_OPTIMIZERS = {name: (getattr(torch.optim, cls), kw) for name, cls, kw in _MORE
                   if hasattr(torch.optim, cls)}
"""The rest of torch.optim (issue 49): state of param-shaped tensors and 0-dim tensors per
param, and Adafactor's factored second moments. Apart from ``OPTIMIZERS``, whose order the
quick tier cycles through: the full tier runs these on every path (run/matrix.py
``more_optimizers``), the quick tier those of ``QUICK_MORE`` there. ASGD's ``t0=1`` starts its
averaging (``ax``) at the first step instead of step 1e6. LBFGS's ``max_iter=1`` makes its step
evaluate the closure exactly once (optim/lbfgs.py: the re-evaluation is skipped on the last
iteration), so its step is one forward and backward as every other optimizer's. Only the
classes the installed torch has (``NOT_IN_THIS_TORCH``)."""

NOT_IN_THIS_TORCH: dict[str, str] = {
    name: f"torch {torch.__version__} has no torch.optim.{cls}" for name, cls, _ in _MORE
    if not hasattr(torch.optim, cls)}
"""Zoo optimizers the installed torch lacks (torch.optim.Muon came in 2.9), with the reason:
no case, fixture or factory names them on this torch; building one is a ValueError saying
so."""

ALL_OPTIMIZERS = {**OPTIMIZERS, **MORE_OPTIMIZERS}
"""Every zoo optimizer of torch.optim the run names (``OPTIMIZERS`` and ``MORE_OPTIMIZERS``)."""


class SGDMomentumFP32State(torch.optim.Optimizer):
    """SGD with momentum whose momentum buffer is float32 whatever the param's dtype, as
    mixed-precision training keeps optimizer state (fairseq's FP16 optimizer, torchao's
    low-bit optimizers): ``buf = grad`` on the first step, then ``buf = momentum * buf +
    grad``, in float32; ``p -= lr * buf``, cast to the param's dtype. A checkpoint of it
    holds float32 state for bfloat16 params, which a load must keep (pytorch#43706 class)."""

    def __init__(self, params, lr: float = 0.05, momentum: float = 0.9):
        super().__init__(params, {"lr": lr, "momentum": momentum})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.to(torch.float32)
                st = self.state[p]
                if "momentum_buffer" not in st:
                    st["momentum_buffer"] = grad.clone()
                else:
                    st["momentum_buffer"].mul_(group["momentum"]).add_(grad)
                p.add_(st["momentum_buffer"].to(p.dtype), alpha=-group["lr"])


# Optimizers whose state dtype is not the param's: built by name like the zoo's, but not in
# OPTIMIZERS (the tiers' per-optimizer products and the golden fixtures iterate that); the
# run's state-dtype cases name them (run/matrix.py).
STATE_DTYPE_OPTIMIZERS = {
    "sgd_momentum_fp32state": (SGDMomentumFP32State, {"lr": 0.05, "momentum": 0.9}),
}

WHOLE_TENSOR = frozenset({"adafactor", "muon", "lbfgs"})
"""The zoo optimizers whose update of an element reads more than that element: Adafactor
factors a 2-D param's second moment over its rows and columns and scales its update by the
RMS of the update and of the param it steps (optim/_adafactor.py); Muon orthogonalises a
matrix's momentum as a whole (Newton-Schulz, optim/_muon.py); LBFGS's direction and step
length come from dot products over every param. So they train otherwise on a
piece of a param (FSDP1's flat shards: properties/shard_training.py)."""

HELD_ONCE = frozenset({"lbfgs"})
"""The zoo optimizers whose state is held once for all their params (LBFGS: under the first
param, its vectors the concatenation over every param in order, optim/lbfgs.py), not per
param: FSDP's optimizer state dicts read state per param."""

ONE_IMPLEMENTATION = frozenset({"lbfgs"}) | frozenset(STATE_DTYPE_OPTIMIZERS)
"""The optimizers without ``foreach`` / ``fused`` flags (LBFGS's constructor takes none)."""

MATRIX_ONLY = frozenset({"muon"})
"""The zoo optimizers that refuse a param that is not 2-D (Muon, optim/_muon.py:128-133):
FSDP1's 1-D flat shards and pieces cannot be stepped by them at all."""

NEWTON_SCHULZ_UNMATCHED = (
    "Muon computes its update by a bfloat16 Newton-Schulz iteration of the whole matrix "
    "(optim/_muon.py:55-66), and under fully_shard on more than one rank it runs on Shard(0) "
    "DTensors: the matrix's norm is taken from the ranks' own bfloat16 norms, a bfloat16 "
    "step or two from one process's (0.3652 against 0.3633), and a matmul over the sharded "
    "dim adds the ranks' bfloat16 partial products. Each of its five iterations multiplies "
    "small singular values by up to 3.4445, so the rounding noise of a low-rank gradient's "
    "null directions grows to the update's own size: the update of the same gradient is up "
    "to half its norm apart from one process's (a full-rank 2x5 one: 2%). So no "
    "single-process run is a reference within a tolerance a real bug would exceed; the "
    "checkpoint itself is still judged exactly (P1, P3, P7, P8, P11 against the reference "
    "of the ranks' own state). Reproducer notes/repro/fsdp2_muon_sharded.py (torch 2.13 and "
    "2.15 alike)")
"""Why no single-process run reproduces Muon's training of params sharded over more than
one rank under fully_shard within any tolerance: P2 and P6 are n/a there
(``sharded_update_unmatched``, properties/roundtrip.py ``single_process_unmatched``).
Everything else of the round trip is judged as for any optimizer."""

OPTIMIZER_MODELS = {"muon": "matrices"}
"""The zoo model an optimizer runs on in the tiers where the zoo's default (``mlp``, whose
biases are 1-D) is not one it accepts: Muon steps 2-D params only."""

ELEMENTWISE = (frozenset(ALL_OPTIMIZERS) - WHOLE_TENSOR) | frozenset(STATE_DTYPE_OPTIMIZERS)
"""The optimizers whose update of a param element reads only that element's param, gradient
and state (and the group's hyperparameters): ranks that hold the rows of one param and step
them with different hyperparameters give, row for row, what each would give stepping the
whole param (properties/baseline.py)."""

_SECOND_GROUP = ("head", "out", "block.2")


# Optimizers with a fused implementation (``fused=True``) in torch, CPU included since 2.4.
FUSED = ("sgd", "sgd_momentum", "adam", "adamw", "adagrad")


def impl_kwargs(name: str, impl: str) -> dict:
    """Constructor flags for an implementation: "default" (torch picks), "forloop"
    (``foreach=False``), "foreach" (``foreach=True``), "fused" (``fused=True``; only the
    optimizers in ``FUSED``)."""
    if impl == "default":
        return {}
    if impl == "forloop":
        return {"foreach": False}
    if impl == "foreach":
        return {"foreach": True}
    if impl == "fused":
        if name not in FUSED:
            raise ValueError(f"optimizer {name!r} has no fused implementation; fused: {FUSED}")
        return {"fused": True}
    raise ValueError(f"unknown implementation {impl!r}; known: default, forloop, foreach, fused")


# Users' optimizer factories by name (``register_optimizer``); never mixed into OPTIMIZERS.
REGISTERED: dict[str, Callable] = {}

EMPTY_STATE_AT_START = "empty_state_at_start"
"""Optimizer trait: the optimizer as its factory returns it holds state entries, none with a
tensor (schedule-free AdamW's ``train()`` reads ``self.state[p]`` for every param, which
makes an empty entry each): torch's code that asks "is the state initialised?" by
``if optim.state`` (DSD's ``_init_optim_state``) takes it for initialised."""
NEWTON_SCHULZ_UPDATE = "newton_schulz_update"
"""Optimizer trait: a ``torch.optim.Muon`` (a subclass included), whose update of each
matrix is a bfloat16 Newton-Schulz iteration of the whole matrix: on params sharded over
more ranks no single-process run matches it (``NEWTON_SCHULZ_UNMATCHED``)."""
OPTIMIZER_TRAITS = (EMPTY_STATE_AT_START, NEWTON_SCHULZ_UPDATE)
"""What an optimizer can have that a known torch limitation or a property's reach may touch:
a user's optimizer is matched by these (seen on a fresh one: ``optimizer_traits_of``). A zoo
optimizer is matched by its name (none has ``EMPTY_STATE_AT_START``: Adagrad's state at
construction holds tensors; the zoo's Muon is ``steps_by_newton_schulz``)."""
_TRAITS: dict[str, frozenset] = {}


def optimizer_traits_of(optim: torch.optim.Optimizer) -> tuple[str, ...]:
    """The ``OPTIMIZER_TRAITS`` a freshly built optimizer shows."""
    holds_tensor = any(isinstance(v, torch.Tensor) for st in optim.state.values()
                       for v in st.values())
    traits = [EMPTY_STATE_AT_START] if optim.state and not holds_tensor else []
    muon = getattr(torch.optim, "Muon", None)
    if muon is not None and isinstance(optim, muon):
        traits.append(NEWTON_SCHULZ_UPDATE)
    return tuple(traits)


def steps_by_newton_schulz(name: str) -> bool:
    """Whether optimizer ``name`` is Muon: the zoo's, or a registered user optimizer with the
    ``NEWTON_SCHULZ_UPDATE`` trait (a ``torch.optim.Muon`` subclass included)."""
    return name == "muon" or optimizer_touches(name, NEWTON_SCHULZ_UPDATE)


def sharded_update_unmatched(name: str) -> str:
    """Why no single-process run matches optimizer ``name`` on params sharded over more
    than one rank (``NEWTON_SCHULZ_UNMATCHED`` for Muon); "" where one can."""
    return NEWTON_SCHULZ_UNMATCHED if steps_by_newton_schulz(name) else ""


def optimizer_touches(name: str, trait: str) -> bool:
    """Whether optimizer ``name`` (a registered user optimizer; a zoo optimizer is matched
    by its name, never by a trait) has ``trait``."""
    if trait not in OPTIMIZER_TRAITS:
        raise ValueError(f"unknown optimizer trait {trait!r}; traits: {OPTIMIZER_TRAITS}")
    return trait in _TRAITS.get(name, frozenset())


def register_optimizer(name: str, factory: Callable, traits: Iterable[str] = ()) -> None:
    """Make ``name`` buildable in this process: ``factory(named_params) -> Optimizer``, with
    ``named_params`` a list of ``(name, param)``. Under FSDP1 with ``use_orig_params=False``
    a param is a unit's flat parameter and its name is the unit's FQNs joined by "|" (see
    ``sut.fsdp1.grouping_name``). ``traits``: its ``OPTIMIZER_TRAITS``
    (``optimizer_traits_of``). The same name again with the same factory is a no-op."""
    if name in ALL_OPTIMIZERS or name in STATE_DTYPE_OPTIMIZERS:
        raise ValueError(f"{name!r} is a zoo optimizer; pick another name")
    unknown = sorted(set(traits) - set(OPTIMIZER_TRAITS))
    if unknown:
        raise ValueError(f"optimizer {name!r}: unknown traits {unknown}; traits: "
                         f"{OPTIMIZER_TRAITS}")
    old = REGISTERED.get(name)
    if old is not None and old is not factory:
        raise ValueError(f"optimizer {name!r} is already registered with another factory")
    REGISTERED[name] = factory
    _TRAITS[name] = frozenset(traits)


def build_optimizer(name: str, named_params: Iterable[tuple[str, torch.nn.Parameter]],
                    groups: int = 1, foreach: bool | None = None,
                    impl: str = "default") -> torch.optim.Optimizer:
    """The zoo optimizer ``name`` (``groups``, ``foreach``, ``impl`` as in the module
    docstring), or a registered factory called with the named params (which then decides
    the groups and flags itself)."""
    if name in REGISTERED and name not in ALL_OPTIMIZERS:
        return _checked(name, REGISTERED[name]([(n, p) for n, p in named_params]))
    try:
        cls, kw = {**ALL_OPTIMIZERS, **STATE_DTYPE_OPTIMIZERS}[name]
    except KeyError:
        if name in NOT_IN_THIS_TORCH:
            raise ValueError(f"optimizer {name!r}: {NOT_IN_THIS_TORCH[name]}") from None
        extra = f"; registered: {sorted(REGISTERED)}" if REGISTERED else ""
        known = sorted(ALL_OPTIMIZERS) + sorted(STATE_DTYPE_OPTIMIZERS)
        raise ValueError(f"unknown optimizer {name!r}; known: {known}{extra}") from None
    kw = dict(kw)
    if name in ONE_IMPLEMENTATION and (impl != "default" or foreach is not None):
        raise ValueError(f"optimizer {name!r} has one implementation: impl must be 'default' "
                         f"and foreach unset, got impl={impl!r}, foreach={foreach!r}")
    if foreach is not None:
        kw["foreach"] = foreach
    kw.update(impl_kwargs(name, impl))
    named = [(n, p) for n, p in named_params]
    if groups == 1:
        return cls([p for _, p in named], **kw)
    second = [p for n, p in named if any(s in n for s in _SECOND_GROUP)]
    first = [p for n, p in named if not any(s in n for s in _SECOND_GROUP)]
    extra = {"lr": kw["lr"] * 0.5}
    if "weight_decay" in kw or cls in (torch.optim.Adam, torch.optim.SGD):
        extra["weight_decay"] = 0.01
    return cls([{"params": first}, {"params": second, **extra}], **kw)


def _checked(name: str, optim) -> torch.optim.Optimizer:
    """A registered factory's optimizer, if the suite can read it: a ``torch.optim.Optimizer``
    whose ``state_dict()`` has torch's form (``{"state", "param_groups"}``). Otherwise a
    TypeError naming the factory and what it returned (a trainer's container, such as
    torchtitan's ``OptimizersContainer``, has its own flat ``state_dict``: return the
    optimizer it wraps)."""
    if not isinstance(optim, torch.optim.Optimizer):
        raise TypeError(f"optimizer factory {name!r} returned {type(optim).__qualname__}, not "
                        f"a torch.optim.Optimizer")
    keys = set(optim.state_dict())
    if not {"state", "param_groups"} <= keys:
        raise TypeError(f"optimizer factory {name!r} returned {type(optim).__qualname__}, "
                        f"whose state_dict() has keys {sorted(keys)[:6]}, not torch's "
                        f"{{'state', 'param_groups'}}: return the torch optimizer it wraps "
                        f"(a trainer's container keeps its own format)")
    return optim


class WarmupCosine:
    """``LambdaLR``'s factor: linear warm-up over ``warmup`` steps, then cosine decay to
    ``floor`` at ``total`` steps (the default shape of torchtitan's and transformers'
    schedules). A callable object, so ``LambdaLR.state_dict()`` saves its fields and a load
    restores them."""

    def __init__(self, warmup: int = 2, total: int = 8, floor: float = 0.1):
        self.warmup, self.total, self.floor = warmup, total, floor

    def __call__(self, step: int) -> float:
        import math

        if step < self.warmup:
            return (step + 1) / (self.warmup + 1)
        t = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.floor + (1 - self.floor) * 0.5 * (1 + math.cos(math.pi * t))


def _exp(optim):
    return torch.optim.lr_scheduler.ExponentialLR(optim, gamma=0.9)


def _warmup_cosine(optim):
    return torch.optim.lr_scheduler.LambdaLR(optim, WarmupCosine())


def _onecycle(optim):
    return torch.optim.lr_scheduler.OneCycleLR(
        optim, max_lr=[g["lr"] * 4 for g in optim.param_groups], total_steps=8,
        cycle_momentum=False)


def _sequential(optim):
    lr = torch.optim.lr_scheduler
    # the switch at step 4, after the save at step 2: the resume steps through the first child,
    # so a child restored wrongly changes the lrs (at milestone 2 the save was at the switch
    # and the first child's state is never read again)
    return lr.SequentialLR(optim, [lr.LinearLR(optim, start_factor=0.25, total_iters=4),
                                   lr.ExponentialLR(optim, gamma=0.8)], milestones=[4])


def _chained(optim):
    lr = torch.optim.lr_scheduler
    return lr.ChainedScheduler([lr.LinearLR(optim, start_factor=0.5, total_iters=3),
                                lr.ExponentialLR(optim, gamma=0.9)])


SCHEDULES = {"exp": _exp, "warmup_cosine": _warmup_cosine, "onecycle": _onecycle,
             "sequential": _sequential, "chained": _chained}
"""The zoo's LR schedules by name (``Case.scheduler``). "exp" (ExponentialLR 0.9) is
chainable: its next lr comes from the optimizer's lr, not from its own state. The others'
lr depends on the scheduler's own state (``last_epoch``, a lambda's fields, the child
schedulers' states), so a scheduler restored wrongly changes the learning rates after a
resume: warm-up then cosine decay through ``LambdaLR``, ``OneCycleLR``, and the two
compositions whose ``load_state_dict`` recurses into children (``SequentialLR``,
``ChainedScheduler``)."""


def takes_step(fn) -> bool:
    """Whether a scheduler factory takes the training step: ``f(optimizer, step)`` (a
    trainer that builds its scheduler from the step it resumes at, as torchtune's recipes
    do with ``last_epoch=step - 1``), not ``f(optimizer)``."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
               and p.default is p.empty) == 2


def build_scheduler(optim: torch.optim.Optimizer, model: str | None = None,
                    kind: str = "exp", step: int = 0) -> torch.optim.lr_scheduler.LRScheduler:
    """The LR scheduler of cases with a ``scheduler``: the registered user model's
    ``scheduler_fn(optim)`` (or ``scheduler_fn(optim, step)``, ``takes_step``: the
    scheduler of a run at training step ``step``) if ``model`` has one, else the zoo's
    ``SCHEDULES[kind]`` (every one adds ``initial_lr`` to each param group: an extra key
    every path must keep)."""
    if model is not None:
        fn = model_spec(model).scheduler_fn
        if fn is not None:
            return fn(optim, step) if takes_step(fn) else fn(optim)
    if kind not in SCHEDULES:
        raise ValueError(f"scheduler must be one of {sorted(SCHEDULES)}, got {kind!r}")
    return SCHEDULES[kind](optim)


def scheduler_state(sched) -> dict | None:
    """A deep copy of an LR scheduler's ``state_dict()`` (None without a scheduler): what
    the round trip compares, detached from the live scheduler."""
    import copy

    return None if sched is None else copy.deepcopy(sched.state_dict())
