"""Case: a frozen, picklable, hashable description of one configuration, with a stable
readable id. It is built into model, wrapping and optimizer inside each rank.

Importing this module does not import torch (``Case`` is part of the light public face);
``Case.torch_dtype`` (``torch_dtypes()``) imports it on first use."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Sequence

from .api_paths import (FAMILIES, PATH_NAMES, custom_family, family_of, paths_of,
                           paths_with_axis)

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = ("fp64", "fp32", "bf16")
# The zoo's LR schedules (zoo/optimizers.py ``SCHEDULES``), named here without torch.
SCHEDULE_NAMES = ("exp", "warmup_cosine", "onecycle", "sequential", "chained")
STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
# API paths of the conformance run (api_paths.py: one save path and its load path each),
# plus "fsdp1" / "fsdp2": the differential observers that call every path of that API.
# A user's own save/load functions (the plugin's CustomPath): ``api = "custom:<name>"`` under
# FSDP1, ``"fsdp2.custom:<name>"`` under ``fully_shard`` (``api_paths.custom_api``).
PATHS = PATH_NAMES
APIS = PATHS + FAMILIES
IMPLS = ("default", "forloop", "foreach", "fused")
# Bad inputs a load path must reject with a clear error (P15); "" = a normal case.
FAULTS = ("", "missing_fqn", "extra_fqn", "shape", "dtype", "mixed_keys", "wrong_model",
          "truncated_file", "corrupt_file")
# Kills inside a save (P16): "<point>.<who>.<layout>" (``crash_parts``). The point: "start"
# (before the rank writes anything), "staging" (``dcp.async_save``'s staging), "before_file" (about to open its first data file: after
# DCP's plan exchange, so the other ranks write theirs), "torn" (inside its first data file,
# at a seeded byte or item), "own_file" (after its own data file(s), before any commit),
# "commit" (DCP: every data file written, the coordinator killed before it writes
# ``.metadata``; rank 0 only).
# Who: "rank<r>" or "all". The layout: "fresh" (the second save writes a new step folder)
# or "over" (it overwrites the first save's folder, a "latest" folder).
CRASH_POINTS = ("start", "staging", "before_file", "torn", "own_file", "commit")
CRASH_LAYOUTS = ("fresh", "over")
# Test-only faults planted into a bounds case's measured calls (measure.py), never set by the
# matrix: "slow" makes the call 3x as costly (CPU and wall), "slow10" 10x, "copy" keeps a
# clone of the call's output (save: the returned dict; load: the optimizer state) alive.
INJECTIONS = ("", "slow", "slow10", "copy")
# Which side trains and checkpoints through ``torch.compile(model, backend="eager")`` (its
# FQNs carry ``_orig_mod``), FSDP2 only: the save side, the load side, or both.
COMPILED = ("", "save", "load", "both")
# The FSDP2 round-trip paths: the only ones the FSDP2 axes (compiled, cpu_offload,
# reshard_after_forward, flatten_optimizer_state_dict) apply to.
FSDP2_ROUND_TRIPS = paths_of("fsdp2")
# FSDP2's CPUOffloadPolicy on both sides: pin_memory=True (torch's default) or False.
CPU_OFFLOAD = ("", "pinned", "unpinned")
MIXED_PRECISION = ("", "bf16")
# The longest chain of checkpoints a case runs (``Axes.links``).
MAX_LINKS = 4
KEEP = object()
"""A field's ``single_process`` value (``axis``) that the single-process baseline keeps."""
FIXTURES_HIDDEN = ("the golden fixtures' root is where a run reads its fixtures, one root per "
                   "run (--fixtures), not what a case is: ``golden`` names the fixture, and an "
                   "id holds no machine path")


@dataclass(frozen=True)
class Part:
    """An axis shown in the id inside a segment it shares with other axes (``ID_SEGMENTS``:
    its renderer reads every axis that names it)."""

    segment: str
    """The shared segment's name (``SHARED_SEGMENTS``)."""


@dataclass(frozen=True)
class Hidden:
    """An axis left out of the id, and why (a value every case of one run shares)."""

    why: str
    """The reason, as the docs and the meta test read it."""


def axis(default: Any, *, shown: "str | Part | Hidden", load_only: bool = False,
         single_process: Any = KEEP) -> Any:
    """A ``Case`` field, with the facts the harness needs about it, stated where the field
    is (every field says each; suites/meta checks):

    - ``shown``: how it appears in ``Case.id``: a template of its own segment (``"/seed{}"``:
      ``{}`` is the value; a flag's template has none), shown only where the value is not
      the default; a ``Part`` of a segment it shares with other axes; or ``Hidden`` with the
      reason. Segments come in the order of ``ID_SEGMENTS``, so every axis that makes two
      cases unequal makes their ids unequal (``suites/meta/test_case_ids.py``).
    - ``load_only``: only the load side reads it. A case with every load-only field at its
      default is what its save side sees, so cases that differ only in them share one save
      (``LOAD_ONLY``; run/saves.py, sut/trained.py).
    - ``single_process``: the value the single-process baseline trains with
      (properties/baseline.py): a field that does not change the single-process steps is
      reset to it, so one run serves every case that differs only there; ``KEEP`` (the
      default) keeps the case's value. A load-only field is reset to its default.
    """
    if load_only:
        single_process = default
    return field(default=default, metadata={"load_only": load_only,
                                            "single_process": single_process,
                                            "shown": shown})


@dataclass(frozen=True, kw_only=True)
class Axes:
    """What a configuration varies: the model and its wrapping, the optimizer, the API path,
    the world sizes, the dtype and every other axis of the matrix, each declared with
    ``axis`` (whether only the load side reads it, what the single-process baseline trains
    with). ``plan`` names a wrapping plan of the zoo model; ``load_world_size`` and
    ``load_plan`` describe where the saved state is loaded (default: where it was saved).
    A ``Case`` is its axes and its kind."""

    model: str = axis("mlp", shown=Part("model"))
    """Zoo model name (``zoo.MODELS``), or a user model's name under the plugin."""
    plan: str = axis("nested", shown=Part("model"), single_process="root")
    """Wrapping plan of the model on the save side (a zoo plan name)."""
    optimizer: str = axis("adam", shown=Part("optim"))
    """Zoo optimizer name (``zoo.OPTIMIZERS``)."""
    groups: int = axis(1, shown=Part("optim"))
    """Number of param groups the optimizer is built with."""
    use_orig_params: bool = axis(False, shown=Part("layout"), single_process=False)
    """FSDP1's ``use_orig_params`` on both sides (under FSDP2, which has no flat parameters,
    it is False whatever is passed)."""
    strategy: str = axis("FULL_SHARD", shown=Part("layout"), single_process="FULL_SHARD")
    """Sharding strategy (``STRATEGIES``): FSDP1's ``ShardingStrategy``; under FSDP2 the
    mesh and ``reshard_after_forward`` that mean the same (HYBRID_SHARD and NO_SHARD: a 2-D
    mesh; sut/fsdp2.py)."""
    world_size: int = axis(2, shown=Part("sizes"), single_process=1)
    """Ranks of the save side."""
    load_world_size: int | None = axis(None, shown=Part("sizes"), load_only=True)
    """Ranks of the load side (None: the save's)."""
    load_plan: str | None = axis(None, shown=Part("sizes"), load_only=True)
    """Wrapping plan of the load side (None: the save's)."""
    api: str = axis("fsdp1", shown=Part("api"))
    """The API path (``api_paths``), a differential observer ("fsdp1", "fsdp2") or a
    user's own path."""
    steps: int = axis(2, shown=Part("steps"))
    """Optimizer steps trained before the save."""
    batch: int = axis(12, shown="/batch{}")
    """Batch size of every training step."""
    seed: int = axis(0, shown="/seed{}")
    """Seed of the model, data and every random choice of the case."""
    dtype: str = axis("fp64", shown=Part("dtype"))
    """Param and state dtype ("fp64", "fp32", "bf16")."""
    resume_steps: int = axis(2, shown=Part("steps"))
    """Optimizer steps trained after the load (P6)."""
    scheduler: bool | str = axis(False, shown=Part("optim"))
    """The LR scheduler stepped after every optimizer step and checkpointed beside it: a zoo
    schedule name (``SCHEDULE_NAMES``; True is "exp"), "" = none (False)."""
    impl: str = axis("default", shown=Part("optim"))
    """Optimizer implementation: "default", "foreach" or "fused" (``zoo.FUSED``)."""
    compiled: str = axis("", shown="/compiled:{}", single_process="")
    """Compiled-model case (COMPILED): the side(s) whose model is wrapped by torch.compile
    (backend "eager") for training and every torch.distributed.checkpoint call. "" = none."""
    reshard_after_forward: int = axis(0, shown=Part("layout"), single_process=0)
    """FSDP2 round trips only: ``fully_shard(reshard_after_forward=<int>)`` on both sides,
    the world size the params are resharded to after forward (a factor of each side's
    world size, at least 2; equal to it is torch's ``True``). 0 = the strategy's own
    choice."""
    flatten_optimizer_state_dict: bool = axis(False, shown="/flat_osd", single_process=False)
    """FSDP2 round trips only: both sides pass ``StateDictOptions(
    flatten_optimizer_state_dict=True)`` (torchtitan's checkpointer does): the saved dict
    is ``{"state.<fqn>.<name>": v, "param_groups.<fqn>.<key>": v}``."""
    cpu_offload: str = axis("", shown="/offload:{}", single_process="")
    """FSDP2 round trips only (CPU_OFFLOAD): ``fully_shard(offload_policy=CPUOffloadPolicy(
    pin_memory=...))`` on both sides, "pinned" (torch's default) or "unpinned". "" = none."""
    scheduler_after_load: bool = axis(False, shown=Part("optim"), load_only=True)
    """With ``scheduler``: the load side builds its LR scheduler after the optimizer state is
    loaded (then loads the scheduler's state), as a trainer that restores the optimizer
    first does; ``initial_lr`` must then come from the checkpoint (pytorch#140900 class).
    A user's own save/load: no scheduler exists while ``load_fn`` runs; the suite builds
    it after, from the step the load restored, unless ``load_fn`` built one (torchtune's
    recipes rebuild theirs from the step and never checkpoint it)."""
    mixed_precision: str = axis("", shown="/mp:{}")
    """FSDP2 round trips only, float32 params: ``fully_shard(mp_policy=MixedPrecisionPolicy(
    param_dtype=bfloat16, reduce_dtype=float32))`` on both sides: compute in bfloat16,
    params and optimizer state stay float32 (MIXED_PRECISION). "" = none."""
    async_save: bool = axis(False, shown="/async_save", single_process=False)
    """fsdp2.sharded only: the save writes with ``dcp.async_save`` (torch's default thread
    executor) and the save side takes one more optimizer step on the live model and
    optimizer before it waits on the returned Future (a trainer goes on training while the
    checkpoint is written); the checkpoint must hold the state at the save."""
    app_state: bool = axis(False, shown="/app_state", single_process=False)
    """fsdp2.sharded only: the checkpoint is a DCP ``Stateful`` app state (model, optimizer,
    LR scheduler, step; sut/app_state.py) saved and loaded under one key, as trainers do:
    ``get_state_dict`` / ``set_state_dict`` of model and optimizer together, the scheduler
    restored from the checkpoint."""
    nonstrict: bool = axis(False, shown="/nonstrict", load_only=True)
    """FSDP2 round trips only: the load passes ``StateDictOptions(strict=False)`` (a trainer
    loading a checkpoint whose params do not all have state, e.g. ones that never had a
    gradient); the save is unchanged."""
    no_broadcast: bool = axis(False, shown="/no_broadcast", load_only=True)
    """fsdp2.full only: the load without ``broadcast_from_rank0``: every rank loads the full
    dict it read itself (``set_optimizer_state_dict(full_state_dict=True)``)."""
    ignore_frozen_params: bool = axis(False, shown="/ignore_frozen",
                                      single_process=False)
    """FSDP2 round trips only: every state-dict call of both sides passes
    ``StateDictOptions(ignore_frozen_params=True)`` (the model's frozen params are left
    out of its state dict; the optimizer's dict is documented as unchanged)."""
    tensor_parallel: int = axis(0, shown=Part("layout"), single_process=0)
    """FSDP2 round trips only: tensor parallelism under ``fully_shard`` on the save side: a
    ``(world_size // tensor_parallel, tensor_parallel)`` mesh named ("dp", "tp"), the zoo
    model's ``tp_plan`` applied by ``parallelize_module`` on "tp", then ``fully_shard`` on
    "dp" (torchtitan's order). 0 = no tensor parallelism."""
    load_tensor_parallel: int | None = axis(None, shown=Part("layout"), load_only=True)
    """The load side's tensor-parallel degree (0: none); None = the save side's."""
    links: int = axis(1, shown="/links{}", load_only=True)
    """Checkpoints in a chain (``next_link``): 1 = one save and one load; 2 = after the
    resumed training the load side saves again through the same path (at step
    ``steps + resume_steps``), that checkpoint is loaded where the case saved (the world size
    and plan of its save side: a case that resizes resizes back) and trained on, as a
    trainer that checkpoints every N steps and is preempted twice. The save side is the
    same whatever the chain (load-only)."""

    def __post_init__(self) -> None:
        # the LR schedule: True is the zoo's "exp" (its id is "+sched", as it always was)
        if self.scheduler is True or self.scheduler is False:
            object.__setattr__(self, "scheduler", "exp" if self.scheduler else "")
        if self.scheduler not in ("",) + SCHEDULE_NAMES:
            raise ValueError(f"scheduler must be one of {SCHEDULE_NAMES} (True: 'exp'), or "
                             f"empty, got {self.scheduler!r}")
        if self.api not in APIS and custom_family(self.api) is None:
            raise ValueError(f"api must be one of {APIS}, 'custom:<name>' or "
                             f"'fsdp2.custom:<name>', got {self.api!r}")
        if self.use_orig_params and self.family == "fsdp2":
            # FSDP2 keeps per-parameter DTensors: the flag means nothing there, so a case
            # that sets it is the case that does not (one configuration, one id)
            object.__setattr__(self, "use_orig_params", False)
        if self.impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {self.impl!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_NAMES)}, got {self.dtype!r}")
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")

        if self.compiled not in COMPILED:
            raise ValueError(f"compiled must be one of {COMPILED[1:]} (or empty), got "
                             f"{self.compiled!r}")
        if self.mixed_precision not in MIXED_PRECISION:
            raise ValueError(f"mixed_precision must be one of {MIXED_PRECISION[1:]} (or empty), "
                             f"got {self.mixed_precision!r}")
        if self.mixed_precision and self.dtype != "fp32":
            raise ValueError(f"mixed_precision={self.mixed_precision!r} computes in bfloat16 "
                             f"with float32 params and state: dtype must be 'fp32', got "
                             f"{self.dtype!r}")
        for axis, value in (("async_save", self.async_save), ("app_state", self.app_state)):
            if value:
                apis = paths_with_axis(axis)  # ApiPath.axes: the paths with a DCP write
                self._only_round_trips(f"{axis}={value!r}", apis,
                                       f"the {', '.join(apis)} round trips (a DCP write)")
        if self.app_state and self.scheduler_after_load:
            raise ValueError("app_state restores the LR scheduler with the optimizer; "
                             "scheduler_after_load builds it after the load: pick one")
        if self.cpu_offload not in CPU_OFFLOAD:
            raise ValueError(f"cpu_offload must be one of {CPU_OFFLOAD[1:]} (or empty), got "
                             f"{self.cpu_offload!r}")
        for axis, value in (("compiled", self.compiled), ("cpu_offload", self.cpu_offload),
                            ("reshard_after_forward", self.reshard_after_forward),
                            ("flatten_optimizer_state_dict", self.flatten_optimizer_state_dict),
                            ("mixed_precision", self.mixed_precision),
                            ("nonstrict", self.nonstrict),
                            ("ignore_frozen_params", self.ignore_frozen_params)):
            if value:
                self._only_fsdp2_round_trips(f"{axis}={value!r}")
        if self.tensor_parallel or self.load_tensor_parallel:
            self._check_tensor_parallel()
        if self.reshard_after_forward:
            raf = self.reshard_after_forward
            if self.strategy != "FULL_SHARD":
                raise ValueError(f"reshard_after_forward={raf} needs the 1-D mesh (strategy "
                                 f"FULL_SHARD), got strategy={self.strategy!r}")
            if raf < 2 or any(ws % raf for ws in (self.world_size, self.dst_world_size)):
                raise ValueError(f"reshard_after_forward must be a factor (at least 2) of both "
                                 f"world sizes {self.world_size} and {self.dst_world_size}, "
                                 f"got {raf}")
        if self.no_broadcast and self.api not in paths_with_axis("no_broadcast"):
            raise ValueError(f"no_broadcast=True is the load without broadcast_from_rank0 of "
                             f"{', '.join(paths_with_axis('no_broadcast'))}, got "
                             f"api={self.api!r}")
        if not 1 <= self.links <= MAX_LINKS:
            raise ValueError(f"links must be 1 (one checkpoint) to {MAX_LINKS}, got "
                             f"{self.links!r}")
        if self.scheduler_after_load and not self.scheduler:
            raise ValueError("scheduler_after_load needs scheduler=True")
        if self.scheduler_after_load and custom_family(self.api) is None:
            self._only_round_trips("scheduler_after_load=True", PATHS,
                                   "the round trips of the built-in paths and a user's own "
                                   "save/load (their load sides build the scheduler)")

    def _check_tensor_parallel(self) -> None:
        """Tensor parallelism: an FSDP2 round trip on the 1-D strategy's mesh, each side's
        degree 0 or at least 2 and a factor of its world size."""
        tp, dst = self.tensor_parallel, self.dst_tensor_parallel
        self._only_fsdp2_round_trips(f"tensor_parallel={tp}, load_tensor_parallel="
                                     f"{self.load_tensor_parallel}")
        if self.strategy != "FULL_SHARD" or self.reshard_after_forward:
            raise ValueError(f"tensor parallelism builds its own (dp, tp) mesh: strategy must be "
                             f"FULL_SHARD and reshard_after_forward unset, got strategy="
                             f"{self.strategy!r}, reshard_after_forward="
                             f"{self.reshard_after_forward}")
        for side, degree, ws in (("save", tp, self.world_size), ("load", dst, self.dst_world_size)):
            if degree == 1 or degree < 0 or (degree and ws % degree):
                raise ValueError(f"the {side} side's tensor-parallel degree must be 0 (none) or a "
                                 f"factor (at least 2) of its world size {ws}, got {degree}")

    def _only_fsdp2_round_trips(self, what: str) -> None:
        """Refuse ``what`` (an FSDP2-only axis set on this case) unless the case is an FSDP2
        round trip: fsdp2.full or fsdp2.sharded, of a kind that round-trips."""
        self._only_round_trips(what, FSDP2_ROUND_TRIPS,
                               f"the FSDP2 round trips ({', '.join(FSDP2_ROUND_TRIPS)})")

    def _only_round_trips(self, what: str, apis: Sequence[str], which: str) -> None:
        """Refuse ``what`` (an axis set on this case) unless the case is a round trip of one
        of ``apis`` (its kind says whether it round-trips: ``_round_trips``); ``which`` names
        them in the error."""
        if self.api not in apis or not self._round_trips():
            raise ValueError(f"{what} applies to {which}, not api={self.api!r}"
                             + self._kind_note())

    def _round_trips(self) -> bool:
        """Whether the configuration is a save -> load round trip (``Case``: its kind)."""
        return True

    def _kind_note(self) -> str:
        """What an error about an axis adds about the configuration's kind ("" for none)."""
        return ""

    @property
    def torch_dtype(self) -> "torch.dtype":
        return torch_dtypes()[self.dtype]

    @property
    def compute_dtype(self) -> str:
        """The dtype the model computes in: ``mixed_precision``'s, else ``dtype``. P2/P6 judge
        by its tolerance rules (a bfloat16 compute drifts like bfloat16 params do)."""
        return self.mixed_precision or self.dtype

    @property
    def mixed_precision_dtype(self) -> "torch.dtype | None":
        """The torch dtype ``mixed_precision`` computes in; None without it."""
        return torch_dtypes()[self.mixed_precision] if self.mixed_precision else None

    @property
    def family(self) -> str:
        """The FSDP API the case runs under (``api_paths.family_of``)."""
        return family_of(self.api)

    @property
    def dst_world_size(self) -> int:
        return self.load_world_size or self.world_size

    @property
    def dst_plan(self) -> str:
        return self.load_plan or self.plan

    @property
    def loads_where_saved(self) -> bool:
        """The load side's layout is the save side's: same world size, plan and
        tensor-parallel degree (so each rank gets its own state back: P3)."""
        return (self.dst_world_size == self.world_size and self.dst_plan == self.plan
                and self.dst_tensor_parallel == self.tensor_parallel)

    @property
    def dst_tensor_parallel(self) -> int:
        """The load side's tensor-parallel degree (0: none)."""
        return self.tensor_parallel if self.load_tensor_parallel is None else self.load_tensor_parallel

    def next_link(self) -> "Case":
        """The round trip of a chain's next checkpoint (``links``): saved by this case's
        load side after its resumed training (at step ``steps + resume_steps``, at the load
        side's world size, plan and tensor-parallel degree), loaded at this case's save
        side's, with one link fewer to go. ValueError on the last link."""
        if self.links < 2:
            raise ValueError(f"{self.id} is the last link of its chain (links={self.links})")
        swap = {"save": "load", "load": "save"}
        return replace(self, world_size=self.dst_world_size, load_world_size=self.world_size,
                       plan=self.dst_plan, load_plan=self.plan,
                       tensor_parallel=self.dst_tensor_parallel,
                       load_tensor_parallel=self.tensor_parallel,
                       compiled=swap.get(self.compiled, self.compiled),
                       steps=self.steps + self.resume_steps, links=self.links - 1)

    def tensor_parallel_of(self, load_side: bool) -> int:
        """The tensor-parallel degree of the save side, or of the load side (0: none)."""
        return self.dst_tensor_parallel if load_side else self.tensor_parallel

    @property
    def shard_world_size(self) -> int:
        """HYBRID_SHARD shards inside groups of 2 ranks (2x2 on 4 ranks); others: everyone."""
        return 2 if self.strategy == "HYBRID_SHARD" and self.world_size >= 2 else self.world_size



@dataclass(frozen=True, kw_only=True)
class Case(Axes):
    """One configuration: its axes (``Axes``) and its kind. The fields below are the kind's:
    the registered kind whose flag is set runs the case (run/kinds.py ``KINDS``: ``bounds``,
    ``golden``, ``fault``; none: a round trip), and ``inject`` / ``fixtures`` parametrize
    it. Frozen, picklable, hashable, with a stable readable ``id``."""

    fault: str = axis("", shown="/fault:{}", single_process="")
    """A bad input planted into the load (``FAULTS``; P15 only). "" = none."""
    crash: str = axis("", shown="/crash:{}", single_process="")
    """A kill inside a second save (P16 only): ``"<point>.<who>.<layout>"`` (``CRASH_POINTS``,
    "rank<r>" or "all", ``CRASH_LAYOUTS``); the load after it must restore the first save
    exactly or raise an error that says the checkpoint is incomplete. "" = none."""
    golden: str = axis("", shown="/golden:{}")
    """Golden-fixture case (P12 only): "<torch version>/<fixture name>" of a checkpoint
    stored under ``fixtures``, loaded through ``api`` at ``dst_world_size``. "" = a normal
    case."""
    fixtures: str = axis("", shown=Hidden(FIXTURES_HIDDEN))
    """Golden fixtures root of a golden case ("" = the fixtures the package ships)."""
    bounds: bool = axis(False, shown="/bounds")
    """Bounds case (P13/P14 only): measure the path's save and load (time against its floor,
    peak memory per rank) at ``world_size`` instead of the round trip; ``inject`` plants a
    slowdown or an extra copy (INJECTIONS; the self-tests of suites/bounds only)."""
    inject: str = axis("", shown="/inject:{}")
    """Test-only slowdown or extra copy planted into a bounds case (``INJECTIONS``)."""

    def __post_init__(self) -> None:
        # the kind's own values first: an axis's error may name the kind (``_kind_note``)
        if self.fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS[1:]} (or empty), got {self.fault!r}")
        if self.golden and (self.golden.count("/") != 1 or self.fault
                            or not all(self.golden.split("/"))):
            raise ValueError(f"golden must be '<torch version>/<fixture name>' (and fault empty), "
                             f"got golden={self.golden!r}, fault={self.fault!r}")
        if self.crash:
            crash_parts(self.crash, self.world_size)  # raises on a bad value
            if self.fault or self.golden or self.bounds:
                raise ValueError(f"crash={self.crash!r} is a kind of its own: no fault, golden "
                                 f"fixture or bounds with it")
        super().__post_init__()
        if self.inject not in INJECTIONS:
            raise ValueError(f"inject must be one of {INJECTIONS[1:]} (or empty), got {self.inject!r}")
        if self.inject and not self.bounds:
            raise ValueError(f"inject={self.inject!r} is planted into measured calls: it needs "
                             f"bounds=True")
        if self.links > 1 and (self.bounds or self.golden or self.fault or self.crash
                               or self.api in FAMILIES):
            raise ValueError(f"links={self.links} chains round trips: a bounds, golden, fault "
                             f"or differential ({'/'.join(FAMILIES)}) case has one checkpoint, "
                             f"got{self._kind_note() or ' api=' + repr(self.api)}"
                             + (f" fault={self.fault!r}" if self.fault else ""))
        if self.bounds:
            if self.api not in PATHS:
                raise ValueError(f"a bounds case measures one API path: api must be one of "
                                 f"{PATHS}, got {self.api!r}")
            if self.fault or self.golden:
                raise ValueError(f"a bounds case has no fault and no golden fixture, got "
                                 f"fault={self.fault!r}, golden={self.golden!r}")
            if self.dst_world_size != self.world_size or self.dst_plan != self.plan:
                raise ValueError(f"a bounds case loads where it saves: got world size "
                                 f"{self.world_size}->{self.dst_world_size}, plan "
                                 f"{self.plan!r}->{self.dst_plan!r}")

    def _round_trips(self) -> bool:
        return not (self.bounds or self.golden)

    def _kind_note(self) -> str:
        return ((" with bounds=True" if self.bounds else "")
                + (" of a golden fixture" if self.golden else ""))

    @property
    def axes(self) -> Axes:
        """The case's axes alone (without its kind)."""
        return Axes(**{f.name: getattr(self, f.name) for f in fields(Axes)})

    @property
    def id(self) -> str:
        """The case's stable readable id: every segment of ``ID_SEGMENTS`` in order, each
        rendered from the axes that declare it (``axis(shown=...)``)."""
        return "".join(_segment(self, name) for name in ID_SEGMENTS)

    def to_dict(self) -> dict:
        return asdict(self)


def _optim_part(c: Case) -> str:
    opt = c.optimizer + (f"x{c.groups}g" if c.groups > 1 else "")
    if c.impl != "default":
        opt += f".{c.impl}"
    if c.scheduler:
        opt += "+sched" + ("" if c.scheduler == "exp" else f":{c.scheduler}") + (
            "@load" if c.scheduler_after_load else "")
    return "/" + opt


def _layout_part(c: Case) -> str:
    # FSDP2 keeps per-parameter DTensors: no flat/orig choice
    out = "/" + ("dtensor" if c.family == "fsdp2" else "orig" if c.use_orig_params else "flat")
    if c.strategy != "FULL_SHARD":
        out += f"/{c.strategy.lower()}"
    if c.reshard_after_forward:
        out += f"/raf{c.reshard_after_forward}"
    if c.tensor_parallel or c.dst_tensor_parallel:
        out += f"/tp{c.tensor_parallel}" + (
            f"->{c.dst_tensor_parallel}" if c.dst_tensor_parallel != c.tensor_parallel else "")
    return out


def _sizes_part(c: Case) -> str:
    ws = f"/ws{c.world_size}"
    if c.dst_world_size != c.world_size or c.dst_plan != c.plan:
        ws += f"->{c.dst_world_size}"
        if c.dst_plan != c.plan:
            ws += f":{c.dst_plan}"
    return ws


SHARED_SEGMENTS = {
    "api": lambda c: c.api,
    "optim": _optim_part,
    "model": lambda c: f"/{c.model}.{c.plan}",
    "layout": _layout_part,
    "sizes": _sizes_part,
    "dtype": lambda c: f"/{c.dtype}",
    "steps": lambda c: ("" if (c.steps, c.resume_steps) == (2, 2)
                        else f"/steps{c.steps}+{c.resume_steps}"),
}
"""The segments several axes share (``Part``), each rendered from the axes that name it."""

ID_SEGMENTS: tuple[str, ...] = (
    "api", "optim", "model", "layout", "sizes", "dtype", "steps", "seed", "fault", "golden",
    "bounds", "inject", "compiled", "flatten_optimizer_state_dict", "cpu_offload",
    "mixed_precision", "async_save", "app_state", "nonstrict", "no_broadcast",
    "ignore_frozen_params", "batch", "links", "crash")
"""The order of the id's segments: a shared one by its name (``SHARED_SEGMENTS``), an axis
with a segment of its own by the axis's name. A new axis is appended, so that every earlier
id stays as it was."""

_FIELDS = {f.name: f for f in fields(Case)}


def _segment(case: Case, name: str) -> str:
    """One segment of ``case.id``: a shared one's renderer, or the axis's own template where
    its value is not the default."""
    if name in SHARED_SEGMENTS:
        return SHARED_SEGMENTS[name](case)
    f = _FIELDS[name]
    value = getattr(case, name)
    return "" if value == f.default else f.metadata["shown"].format(value)


KIND_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Case)
                                     if f.name not in {a.name for a in fields(Axes)})
"""The fields ``Case`` adds to its ``Axes``: the kind's flags and parameters."""

LOAD_ONLY: dict[str, Any] = {f.name: f.default for f in fields(Case) if f.metadata["load_only"]}
"""The fields only a round trip's load side reads, with their defaults (``axis``)."""
SINGLE_PROCESS: dict[str, Any] = {f.name: f.metadata["single_process"] for f in fields(Case)
                                  if f.metadata["single_process"] is not KEEP}
"""What the single-process baseline trains with, per field it resets (``axis``)."""


def crash_parts(crash: str, world_size: int) -> tuple[str, tuple[int, ...], str]:
    """``(point, killed ranks, layout)`` of a ``Case.crash`` value at ``world_size``; a
    ValueError that names the part that is wrong."""
    parts = crash.split(".")
    if len(parts) != 3:
        raise ValueError(f"crash must be '<point>.<who>.<layout>' (e.g. 'commit.rank0.over'), "
                         f"got {crash!r}")
    point, who, layout = parts
    if point not in CRASH_POINTS:
        raise ValueError(f"crash point must be one of {CRASH_POINTS}, got {point!r}")
    if layout not in CRASH_LAYOUTS:
        raise ValueError(f"crash layout must be one of {CRASH_LAYOUTS}, got {layout!r}")
    if who == "all":
        ranks = tuple(range(world_size))
    elif who.startswith("rank") and who[4:].isdigit() and int(who[4:]) < world_size:
        ranks = (int(who[4:]),)
    else:
        raise ValueError(f"crash must kill 'all' or 'rank<r>' with r < {world_size}, got {who!r}")
    if point == "commit" and ranks != (0,):
        raise ValueError(f"the 'commit' point is the coordinator's (rank 0 writes DCP's "
                         f".metadata): who must be 'rank0', got {who!r}")
    return point, ranks, layout


def shard_group_size(case: Case, world_size: int) -> int:
    """Ranks per shard group at ``world_size``: HYBRID_SHARD 2 (the whole world when odd),
    NO_SHARD 1 (a ``(ws, 1)`` mesh: every param replicated, FSDP2's way to not shard),
    otherwise the world size."""
    if case.strategy == "HYBRID_SHARD":
        return 2 if world_size % 2 == 0 else world_size
    if case.strategy == "NO_SHARD":
        return 1
    return world_size


def torch_dtypes() -> dict[str, Any]:
    """``{dtype name: torch.dtype}`` (imports torch)."""
    import torch

    return {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16}
