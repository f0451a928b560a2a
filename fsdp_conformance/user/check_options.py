"""What ``check`` is asked, besides the model and the data factories: one documented record
(``CheckOptions``) in place of thirty keyword arguments, in the way torchtitan documents a job
config: a frozen keyword-only dataclass, a docstring per field, grouped by what it decides.

Rules
- ``check(model, data, **fields)`` and ``check(model, data, options=CheckOptions(...))`` are
  the same call; keyword arguments given beside ``options`` replace those fields of it; a
  name that is no field is a TypeError that names it and the fields there are.
- The record checks itself when built: ``save_fn`` and ``load_fn`` come together;
  ``shard_fn`` needs ``fully_shard`` (``fsdp_version=2``); ``use_orig_params`` is FSDP1's.
- Imports nothing heavy (no torch): the public face lists it.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Iterable, Sequence

from ..options import DEFAULT_TIMEOUT_S


@dataclass(frozen=True, kw_only=True)
class CheckOptions:
    """Everything ``check`` takes besides the model and the data factories (module rules)."""

    # -- the model around the optimizer ----------------------------------------------------
    plan: Any = ()
    """The modules FSDP wraps (FSDP1) or ``fully_shard`` shards (FSDP2), by FQN; the root is
    always wrapped. A sequence of names or a preset name."""
    load_plan: Any = None
    """The load side's plan where it differs from ``plan`` (None: the same)."""
    optimizer: Any = "adam"
    """A zoo optimizer's name, or ``"module:function"`` / a callable ``f(model)`` that builds
    the user's optimizer."""
    loss: Any = None
    """``f(model, batch) -> loss`` (None: the model's output's mean square)."""
    ignored: Iterable[str] = ()
    """Modules FSDP ignores (FQNs): trained per rank, not sharded."""
    name: str | None = None
    """The model's name in case ids (None: the factory's)."""
    shard_fn: Callable | str | None = None
    """``f(model, mesh)`` that applies ``fully_shard`` itself (FSDP2 only), in place of
    ``plan``."""
    scheduler: Any = None
    """A zoo LR scheduler's name, or a factory of the user's: ``f(optimizer)``, or
    ``f(optimizer, step)``, the scheduler of a run at training step ``step`` (0 when a run
    starts; e.g. torchtune's ``get_cosine_schedule_with_warmup(..., last_epoch=step - 1)``)."""
    scheduler_after_load: bool = False
    """The trainer's construction order: True builds the LR scheduler after the load (as
    torchtune's ``full_finetune_distributed`` does), so none exists while ``load_fn`` runs;
    the suite then builds ``scheduler(optimizer, step)`` from the step ``load_fn`` restored,
    unless ``load_fn`` sets ``state.scheduler`` itself. False (the default): built with the
    optimizer, before ``load_fn``, which restores it (a checkpointed scheduler)."""
    # -- the checkpoint under test -----------------------------------------------------------
    save_fn: Any = None
    """The user's save: ``f(state, directory)`` for the whole training state (``TrainState``)
    or ``f(model, optimizer, directory)`` for the optimizer only; None: the built-in paths."""
    load_fn: Any = None
    """The user's load, the same shape as ``save_fn`` (both or neither)."""
    custom_name: str | None = None
    """The name the user's save/load path has in case ids (None: ``save_fn``'s)."""
    crash: Any = False
    """Crash consistency of your save (P16): True adds a case per default kill point
    (``DEFAULT_CRASHES``) at each world-size spec, or a sequence of ``Case.crash`` values
    (``"<point>.<who>.<layout>"``, e.g. ``"commit.rank0.over"``). Each trains and saves
    with your ``save_fn``, saves again one step later killed (SIGKILL) at that point, and
    loads with your ``load_fn``: the load must restore the first save exactly or raise an
    error that says the checkpoint is incomplete. Needs save_fn/load_fn (pytest:
    ``--fsdp-crash`` turns it on for every such check)."""
    setup_fn: Any = None
    """``setup_fn(state)``: your framework's setup of the training state (``TrainState``),
    run on every rank after the suite built model, optimizer and scheduler (your factories)
    and before training or your load: replace ``state.model`` / ``state.optimizer`` /
    ``state.scheduler`` with what it returns (accelerate's ``prepare``, Fabric's
    ``setup``). Needs save_fn/load_fn that take the training state."""
    # -- which cases -------------------------------------------------------------------------
    paths: Sequence[str] | None = None
    """The built-in API paths (None: the tier's default paths of ``fsdp_version``)."""
    world_sizes: Sequence | None = None
    """World-size specs: ``"2"``, ``"2->3"``, HSDP ``"2x2->2"`` (None: the tier's)."""
    use_orig_params: bool = False
    """FSDP1's ``use_orig_params`` (FSDP1 only)."""
    fsdp_version: int = 2
    """2: ``fully_shard`` on a DeviceMesh; 1: ``FullyShardedDataParallel``."""
    steps: int = 2
    """Training steps before the save."""
    resume_steps: int = 2
    """Training steps after the load, compared with uninterrupted training."""
    links: int = 2
    """Checkpoints in a chain: 2 (the default) saves again after the resumed training,
    with the same save, loads that checkpoint where the case started (``2->3`` resumes on 3
    ranks, saves there, and resumes again on 2) and trains on, as a trainer that checkpoints
    every N steps does; a bug that shows only at the second save after a resume is caught
    there. 1: one save and one load."""
    batch: int = 12
    """Rows per step (split between the ranks)."""
    dtype: str | None = None
    """The params' dtype ("fp64", "fp32", "bf16"; None: "fp64", or the coarser dtype the
    model computes its loss in)."""
    seed: int = 0
    """The seed of the model's init and the data."""
    groups: int | None = None
    """Param groups to split the params into (None: the optimizer's own)."""
    tier: str = "quick"
    """"quick" or "full": how many world-size specs and paths by default."""
    only: Sequence[str] | None = None
    """Run just the cases with these ids."""
    on_cases: Any = None
    """``f(ids)``, called with the id of every case the check builds, before ``only`` keeps
    some (the plugin's ``--fsdp-case`` names an id no test has, with the closest ones)."""
    # -- running and judging -------------------------------------------------------------------
    backend: str | None = None
    """"gloo" or "nccl" (None: nccl where there are GPUs, else gloo)."""
    timeout: float = DEFAULT_TIMEOUT_S
    """Seconds any one rank call may take before the ranks are stopped."""
    known: Sequence = ()
    """Declared known limitations (``Limitation.of`` arguments, or ``Limitation``s)."""
    rerun: Any = None
    """``f(case_id) -> str``: the command that reruns one case, printed in failures."""
    on_result: Any = None
    """``f(result)``, called with each case's result as it is decided."""

    def __post_init__(self) -> None:
        if (self.save_fn is None) != (self.load_fn is None):
            raise TypeError("pass both save_fn and load_fn (or neither)")
        if self.setup_fn is not None and self.save_fn is None:
            raise ValueError("setup_fn= sets up the training state your save_fn/load_fn "
                             "checkpoint: pass them too")
        if self.shard_fn is not None and self.fsdp_version != 2:
            raise ValueError("shard_fn= applies fully_shard: it needs fsdp_version=2")
        if self.crash and self.save_fn is None:
            raise ValueError("crash= kills your save at chosen points: it needs save_fn/load_fn "
                             "(the built-in paths' crash cases are the conformance run's: "
                             "fsdp-conformance run -k crash)")
        if self.scheduler_after_load and self.save_fn is None:
            raise ValueError("scheduler_after_load=True is the construction order of your own "
                             "load: it needs save_fn/load_fn (the built-in paths' load "
                             "restores the scheduler it builds)")
        if self.use_orig_params and self.fsdp_version != 1:
            raise ValueError("use_orig_params= is an option of FSDP1 (FullyShardedDataParallel); "
                             "fully_shard always keeps the original parameters: pass "
                             "fsdp_version=1 to test FSDP1 with use_orig_params=True")

    @classmethod
    def of(cls, options: "CheckOptions | None" = None, **given: Any) -> "CheckOptions":
        """``options`` (default: the defaults) with the fields ``given`` replaced (module
        rules)."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(given) - names)
        if unknown:
            raise TypeError(f"check() got unexpected keyword argument(s) {unknown}; its "
                            f"options are {sorted(names)} (CheckOptions)")
        return cls(**given) if options is None else replace(options, **given)
