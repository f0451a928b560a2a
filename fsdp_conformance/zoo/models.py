"""Small, CPU-fast models, built by name so the controller and every rank build the same
module from the same seed. Sizes are chosen to make FSDP's corner cases happen: primes,
a layer smaller than the world size, tied weights, frozen params, a param that never gets
a gradient, buffers, an ignored module.

Rule: ``build_model(name, seed, dtype)`` seeds torch with ``seed`` and returns the module;
``make_batch(name, seed, step, batch)`` returns the *global* batch of a step (every rank
and the single-process reference see the same data; ranks take their slice). Both draw
from torch's process-wide generator under ``seeded``, which one thread holds at a time: the
controller judges cases on several threads (run/execute.py lanes), and two threads seeding
the one generator in turn would draw each other's numbers.

Users' models join by name with ``register_model`` (a registry separate from ``MODELS``, so
the zoo's own matrix never sees them). Registration is per process: code that runs on ranks
registers there too (``fsdp_conformance.roundtrip`` ships the spec with every call)."""
from __future__ import annotations

import contextlib
import math
import re
import dataclasses
import functools
import threading
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import nn


class NestedMLP(nn.Module):
    """Uneven sizes (primes), a 2-element layer (smaller than world sizes 3 and 4)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(7, 13)
        self.block = nn.Sequential(nn.Linear(13, 11), nn.Tanh(), nn.Linear(11, 5))
        self.head = nn.Linear(5, 2)

    def forward(self, x):
        return self.head(self.block(torch.tanh(self.inp(x))))


class TiedLM(nn.Module):
    """A tiny transformer-ish LM whose output projection is tied to the embedding (its
    untied variant, what a broken tie trains as: zoo/ties.py ``untied_variant``)."""

    def __init__(self, vocab: int = 11, dim: int = 6):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layer = nn.Sequential(nn.Linear(dim, dim), nn.LayerNorm(dim))
        self.out = nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, x):
        return self.out(self.layer(self.embed(x)))


class FrozenMLP(NestedMLP):
    """NestedMLP with the input layer frozen (requires_grad=False)."""

    def __init__(self):
        super().__init__()
        for p in self.inp.parameters():
            p.requires_grad_(False)


class MatrixMLP(nn.Module):
    """NestedMLP without biases: every param a matrix, as Muon requires (it refuses a param
    that is not 2-D, optim/_muon.py:128-133)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(7, 13, bias=False)
        self.block = nn.Sequential(nn.Linear(13, 11, bias=False), nn.Tanh(),
                                   nn.Linear(11, 5, bias=False))
        self.head = nn.Linear(5, 2, bias=False)

    def forward(self, x):
        return self.head(self.block(torch.tanh(self.inp(x))))


class UnusedParamMLP(NestedMLP):
    """NestedMLP with a layer that is never used in forward: its params never get a grad."""

    def __init__(self):
        super().__init__()
        self.unused = nn.Linear(3, 3)


class BufferedNet(nn.Module):
    """Buffers (BatchNorm running stats) and a side module meant to be ignored by FSDP."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(5, 8)
        self.norm = nn.BatchNorm1d(8)
        self.side = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.norm(self.inp(x))
        return self.head(h + self.side(h))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(2, 3, 3)
        self.conv2 = nn.Conv2d(3, 5, 2)
        self.head = nn.Linear(5 * 3 * 3, 3)

    def forward(self, x):
        h = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.head(h.flatten(1))


class FeedForward(nn.Module):
    """A pre-norm transformer block's feed-forward half with its residual: ``norm``, ``fc1``,
    ``fc2``."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class TPFeedForward(nn.Module):
    """Two feed-forward blocks and a head: the tensor-parallel cases' model. Its ``tp_plan``
    shards each ``fc1`` column-wise and each ``fc2`` row-wise (torchtitan's plan for a
    feed-forward); norms and head stay replicated over ``tp``. The hidden width 10 splits
    evenly over 2 tp ranks and unevenly (3 + 2 rows) over the 2 dp ranks after them: the
    uneven strided sharding torch gets wrong in places (notes/repro/tp_uneven_full_load.py)."""

    def __init__(self, dim: int = 6, hidden: int = 10):
        super().__init__()
        self.layers = nn.ModuleList([FeedForward(dim, hidden) for _ in range(2)])
        self.head = nn.Linear(dim, 3)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    factory: Callable[[], nn.Module]
    input_fn: Callable[[torch.Generator, int, torch.dtype], torch.Tensor]
    plans: dict  # plan name -> tuple of submodule FQNs that are their own units
    ignored: tuple = ()
    # Users' models (``register_model``): ``batch_fn(step, batch) -> Tensor`` replaces
    # ``input_fn`` (called with torch seeded per step); ``loss_fn(model, x) -> scalar``
    # replaces ``loss_of``'s sum-of-squares loss.
    batch_fn: Callable[[int, int], torch.Tensor] | None = None
    loss_fn: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None
    # Submodules trained and then frozen (``requires_grad_(False)``) right before the save
    # (``freeze_at_save``): the save side freezes them after training, the load side's
    # fresh model before the load, the single-process run at the save point; they stay
    # frozen while resuming. FSDP2 only (FSDP1 fixes requires_grad per FlatParameter when
    # it wraps).
    freeze_at_save: tuple = ()
    # Users' models: ``shard_fn(model, mesh)`` applies ``fully_shard`` itself (replaces the
    # plan under FSDP2; sut/fsdp2.py ``wrap_fsdp2``); ``scheduler_fn(optimizer) ->
    # LRScheduler`` replaces the zoo's scheduler of ``scheduler=True`` cases
    # (``optimizers.build_scheduler``).
    shard_fn: Callable | None = None
    scheduler_fn: Callable | None = None
    # Tensor parallelism (``Case.tensor_parallel``): ``(nn.Linear FQN, "colwise" |
    # "rowwise")`` pairs, applied with ``parallelize_module`` before ``fully_shard``
    # (reference/fsdp2_layout.py ``TP_STYLES``). Empty: the model has no tensor-parallel plan.
    tp_plan: tuple = ()
    # What the model has that a known torch limitation may touch (``TRAITS``), so an entry
    # is matched by what it touches, not by a zoo model's name: a user's model gets its own
    # from one training step in the controller (user/model.py ``traits_of``).
    traits: frozenset = frozenset()

    @property
    def ignored_prefixes(self) -> tuple[str, ...]:
        """``"<module>."`` for each ignored module: the FQN prefix of its params."""
        return tuple(f"{m}." for m in self.ignored)


PARAM_WITHOUT_GRAD = "param_without_grad"
"""Trait: a trainable param that one training step leaves without a gradient (the forward
never uses it), so a lazily-initialised optimizer has no state for it at the save."""
FROZEN_FROM_START = "frozen_from_start"
"""Trait: a param built with ``requires_grad=False`` (an optimizer that makes state at
construction, Adagrad, holds state for it that no step changes)."""
FROZEN_AT_SAVE = "frozen_at_save"
"""Trait: params trained and then frozen right before the save (``freeze_at_save``)."""
TRAITS = (PARAM_WITHOUT_GRAD, FROZEN_FROM_START, FROZEN_AT_SAVE)


def touches(name: str, trait: str) -> bool:
    """Whether model ``name`` (a zoo model, or a registered user model) has ``trait``."""
    return trait in model_spec(name).traits


def _floats(shape):
    return lambda g, b, dt: torch.randn((b, *shape), generator=g, dtype=torch.float64).to(dt)


def _tokens(vocab):
    return lambda g, b, dt: torch.randint(0, vocab, (b, 4), generator=g)


MODELS: dict[str, ModelSpec] = {
    "mlp": ModelSpec("mlp", NestedMLP, _floats((7,)),
                     {"root": (), "nested": ("inp", "block", "block.2"), "block": ("block",)}),
    "tied": ModelSpec("tied", TiedLM, _tokens(11),
                      {"root": (), "nested": ("layer",), "split": ("embed", "layer"),
                       "split_out": ("out",)}),
    "frozen": ModelSpec("frozen", FrozenMLP, _floats((7,)),
                        {"root": (), "nested": ("block", "head")},
                        traits=frozenset({FROZEN_FROM_START})),
    "unused": ModelSpec("unused", UnusedParamMLP, _floats((7,)),
                        {"root": (), "nested": ("block", "unused")},
                        traits=frozenset({PARAM_WITHOUT_GRAD})),
    "buffers": ModelSpec("buffers", BufferedNet, _floats((5,)),
                         {"root": (), "nested": ("inp", "head")}, ignored=("side",)),
    "conv": ModelSpec("conv", ConvNet, _floats((2, 6, 6)),
                      {"root": (), "nested": ("conv1", "conv2")}),
    "late_frozen": ModelSpec("late_frozen", NestedMLP, _floats((7,)),
                             {"root": (), "nested": ("inp", "block", "block.2"),
                              "block": ("block",)}, freeze_at_save=("inp",),
                             traits=frozenset({FROZEN_AT_SAVE})),
}


# Models with a tensor-parallel plan (``ModelSpec.tp_plan``): the tensor-parallel axis's
# (run/matrix.py), buildable by name, not among the models every other axis goes through.
TP_MODELS: dict[str, ModelSpec] = {
    "tp_ffn": ModelSpec("tp_ffn", TPFeedForward, _floats((6,)),
                        {"root": (), "nested": ("layers.0", "layers.1")},
                        tp_plan=tuple((f"layers.{i}.{fc}", style) for i in range(2)
                                      for fc, style in (("fc1", "colwise"), ("fc2", "rowwise")))),
}

# Models an optimizer needs (``OPTIMIZER_MODELS``): buildable by name, in the tiers only
# with that optimizer (run/matrix.py ``more_optimizers``), not among the models every other
# axis goes through.
MATRIX_MODELS: dict[str, ModelSpec] = {
    "matrices": ModelSpec("matrices", MatrixMLP, _floats((7,)),
                          {"root": (), "nested": ("inp", "block", "block.2"),
                           "block": ("block",)}),
}

# Models a known limitation's model trains as (known/model.py ``Effect.runs_as``): buildable
# by name, never in a tier's matrix; registered on first use (zoo/ties.py ``untied_variant``).
VARIANTS: dict[str, ModelSpec] = {}

# Users' models, by name (``register_model``); never mixed into ``MODELS``.
REGISTERED: dict[str, ModelSpec] = {}


def register_model(name: str, factory: Callable[[], nn.Module], input_fn=None,
                   plans: dict | None = None, ignored: tuple = (), *,
                   batch_fn=None, loss_fn=None, shard_fn=None,
                   scheduler_fn=None, traits=frozenset()) -> ModelSpec:
    """Make ``name`` buildable like a zoo model in this process: ``factory() -> nn.Module``
    (called with torch seeded), ``plans`` {plan name: FQNs of submodules that are their own
    unit} ("root" is always there), inputs from ``input_fn(generator, batch, dtype)`` or
    ``batch_fn(step, batch)``, an optional ``loss_fn(model, x)``, ``shard_fn(model, mesh)``,
    ``scheduler_fn(optimizer)`` and its ``traits`` (``ModelSpec``).

    Registering a name again with the same callables and ignored modules merges the plans;
    anything else under a taken name (a zoo name included) is a ValueError."""
    if (input_fn is None) == (batch_fn is None):
        raise ValueError("register_model needs exactly one of input_fn or batch_fn")
    if name in MODELS or name in TP_MODELS:
        raise ValueError(f"{name!r} is a zoo model; pick another name")
    plans = {"root": (), **{k: tuple(v) for k, v in (plans or {}).items()}}
    spec = ModelSpec(name, factory, input_fn, plans, tuple(ignored), batch_fn, loss_fn,
                     shard_fn=shard_fn, scheduler_fn=scheduler_fn, traits=frozenset(traits))
    old = REGISTERED.get(name)
    if old is not None:
        ident = lambda m: (m.factory, m.input_fn, m.ignored, m.batch_fn, m.loss_fn,  # noqa: E731
                           m.shard_fn, m.scheduler_fn)
        same = ident(old) == ident(spec)
        clash = [k for k in plans if k in old.plans and old.plans[k] != plans[k]]
        if not same or clash:
            why = (f"plan(s) {clash} differ" if same else
                   "factory, inputs, loss, shard_fn, scheduler or ignored differ")
            raise ValueError(f"model {name!r} is already registered differently ({why})")
        spec = dataclasses.replace(spec, plans={**old.plans, **plans})
    REGISTERED[name] = spec
    return spec


class ScaledMLP(nn.Module):
    """About ``n`` parameters in four layers of uneven widths (``layers.0`` .. ``layers.3``),
    for timing and memory: the state size is what varies, the structure does not."""

    def __init__(self, n: int):
        super().__init__()
        h = max(4, round(math.sqrt(max(n, 64) / 1.6)))
        dims = (8, h, h + 1, (3 * h) // 5 + 1, 3)
        self.layers = nn.Sequential(*[nn.Linear(a, b) for a, b in zip(dims, dims[1:])])

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == 0 else layer(torch.tanh(x))
        return x


SCALED_PREFIX = "scaled"


def scaled_name(n: int) -> str:
    """The zoo name of a :class:`ScaledMLP` of about ``n`` parameters: ``scaled<n>``."""
    return f"{SCALED_PREFIX}{int(n)}"


def _scaled_spec(name: str) -> ModelSpec | None:
    """``scaled<n>`` (n >= 1): plans root, nested (each layer its own unit) and block (the
    two middle layers together)."""
    m = re.fullmatch(SCALED_PREFIX + r"([1-9][0-9]*)", name)
    if m is None:
        return None
    n = int(m.group(1))
    return ModelSpec(name, lambda: ScaledMLP(n), _floats((8,)),
                     {"root": (), "nested": tuple(f"layers.{i}" for i in range(4)),
                      "block": ("layers.1", "layers.2")})


def model_spec(name: str) -> ModelSpec:
    spec = (MODELS.get(name) or TP_MODELS.get(name) or MATRIX_MODELS.get(name)
            or REGISTERED.get(name)
            or VARIANTS.get(name) or _scaled_spec(name))
    if spec is None:
        extra = f"; registered: {sorted(REGISTERED)}" if REGISTERED else ""
        raise ValueError(f"unknown zoo model {name!r}; known: {sorted({**MODELS, **TP_MODELS, **MATRIX_MODELS})}, "
                         f"{SCALED_PREFIX}<n params>{extra}")
    return spec


_RNG_LOCK = threading.RLock()


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Inside the block torch's CPU generator starts from ``seed`` and no other thread draws
    from it; afterwards it is as it was (module rule)."""
    with _RNG_LOCK, torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)  # the CPU generator alone (rule): fork_rng
        yield  # restores no device generator, so torch.manual_seed would leave them changed


@functools.lru_cache(maxsize=None)
def model_shapes(name: str) -> tuple[int, ...]:
    """Dim 0 of every trainable param of model ``name`` that FSDP manages (the ignored
    modules' params left out), in ``named_parameters`` order; 0-dim params as 0."""
    ignored = model_spec(name).ignored_prefixes
    return tuple((p.shape[0] if p.dim() else 0)
                 for n, p in build_model(name).named_parameters()
                 if p.requires_grad and not n.startswith(ignored))


def build_model(name: str, seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Module:
    """The model ``name`` with parameters drawn from ``seed``, in ``dtype``."""
    spec = model_spec(name)
    with seeded(seed):
        model = spec.factory()
    if spec.loss_fn is not None:  # read by loss_of (FSDP forwards attribute reads)
        model.__dict__["_fsdpc_loss_fn"] = spec.loss_fn
    return model.to(dtype)


def _under(fqn: str, modules: tuple) -> bool:
    return any(fqn == m or fqn.startswith(m + ".") for m in modules)


def freeze_at_save(model: nn.Module, name: str) -> list[str]:
    """Freeze the params the model ``name`` freezes at the save (``ModelSpec``); returns
    their FQNs (FSDP wrappers' prefixes are not in FSDP2's FQNs)."""
    spec = model_spec(name)
    out = []
    for n, p in model.named_parameters():
        if _under(n, spec.freeze_at_save):
            p.requires_grad_(False)
            out.append(n)
    return out


def frozen_at_save(name: str) -> frozenset[str]:
    """The params of the model ``name`` that do not require grad at the save: frozen when
    built, or by ``freeze_at_save``."""
    spec = model_spec(name)
    return frozenset(n for n, p in build_model(name).named_parameters()
                     if not p.requires_grad or _under(n, spec.freeze_at_save))


def runs_on(name: str, family: str) -> bool:
    """Whether the model ``name`` can go through paths of ``family`` ("fsdp1", "fsdp2"):
    a model frozen at the save needs FSDP2 (``ModelSpec.freeze_at_save``)."""
    return family != "fsdp1" or not model_spec(name).freeze_at_save


def make_batch(name: str, seed: int, step: int, batch: int,
               dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The global input batch of ``step`` (same on every rank and in the local reference)."""
    spec = model_spec(name)
    if spec.batch_fn is not None:
        with seeded(seed * 1009 + step):
            x = spec.batch_fn(step, batch)
        return x.to(dtype) if x.is_floating_point() else x
    g = torch.Generator().manual_seed(seed * 1009 + step)
    return spec.input_fn(g, batch, dtype)


def loss_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A deterministic scalar loss (sum of squares of the output, mean over the batch), or
    the registered model's own ``loss_fn(model, x)``."""
    own = getattr(model, "_fsdpc_loss_fn", None)
    if own is not None:
        return own(model, x)
    out = model(x)
    return (out.float() if out.dtype == torch.bfloat16 else out).pow(2).mean()


def mixed_precision_backward(model: nn.Module, x: torch.Tensor,
                             dtype: torch.dtype) -> torch.Tensor:
    """FSDP2's ``MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=<the params' dtype>)``
    in one process: forward and backward on a copy of the model whose params (not buffers)
    are cast to ``dtype``, the input cast too (``cast_forward_inputs``); each gradient is
    cast back to its param's dtype and set on ``model``. Returns the loss."""
    import copy

    low = copy.deepcopy(model)
    with torch.no_grad():
        for q in low.parameters():
            q.data = q.data.to(dtype)
    loss = loss_of(low, x.to(dtype) if x.is_floating_point() else x)
    loss.backward()
    for p, q in zip(model.parameters(), low.parameters()):
        if q.grad is not None:
            p.grad = q.grad.to(p.dtype)
    return loss


def train_step(model: nn.Module, optim: torch.optim.Optimizer, x: torch.Tensor,
               sched=None, zero_grads: frozenset = frozenset(),
               compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """One training step, the same everywhere (FSDP ranks, the single-process baseline, the
    plain model of the rekey observer): zero the grads (to None), ``loss_of``, backward,
    ``optim.step()``, then the LR scheduler's step if there is one. Returns the loss. An
    optimizer whose step needs a closure (LBFGS) is given the zero / forward / backward as
    its closure; the zoo's LBFGS (``max_iter=1``) calls it exactly once a step.
    ``zero_grads``: params (FQNs) that get a zero gradient where backward left none (a
    modelled torch bug, properties/baseline.py). ``compute_dtype``: forward and backward in
    that dtype, as FSDP2's mixed precision does (:func:`mixed_precision_backward`; for a
    model not wrapped by FSDP: the single-process baseline)."""
    def forward_backward() -> torch.Tensor:
        optim.zero_grad(set_to_none=True)
        if compute_dtype is None:
            loss = loss_of(model, x)
            loss.backward()
        else:
            loss = mixed_precision_backward(model, x, compute_dtype)
        for n, p in model.named_parameters():
            if n in zero_grads and p.grad is None:
                p.grad = torch.zeros_like(p)
        return loss

    if isinstance(optim, torch.optim.LBFGS):
        loss = optim.step(forward_backward)  # its first closure call's loss
    else:
        loss = forward_backward()
        optim.step()
    if sched is not None:
        sched.step()
    return loss
