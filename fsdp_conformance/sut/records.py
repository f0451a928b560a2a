"""What the ranks of a conformance round trip send back: typed records in place of string-keyed
dicts. ``SaveRecord`` is one rank's save side (``sut.roundtrip.save_side``),
``LoadRecord`` one rank's load side (``load_side``), ``RecordedError`` what a guarded call that
raised records in place of its value (``sut.common.guarded``).

Rules
- Every record is a frozen, keyword-only dataclass; every field has a docstring saying what it
  holds and which property reads it. A field a path or a rank does not fill defaults to None
  (or an empty container where readers iterate it); "absent" is always None, never a
  missing attribute.
- Only the envelope is typed: the values inside (state dicts in the reference's neutral
  named form, tensors, the layout metadata) are exactly what the ranks recorded before.
- A field that holds the result of a guarded call is either its value or a
  ``RecordedError``; ``error_of(value)`` is the one test (the traceback, or None).
- Records cross process boundaries (the pool pickles them): they hold only picklable values,
  and this module imports nothing but the standard library (no torch), so the controller can
  unpickle them and import it cheaply.
- The differential observers (sut/fsdp1.py, fsdp2.py, fsdp1_dtensor.py, rekey.py) still
  return dicts with their own ``{"error": traceback}`` (``sut.common.guard``); typing them is
  a separate job.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["NotApplicableHere", "RecordedError", "SaveRecord", "LoadRecord", "error_of"]


class NotApplicableHere(RuntimeError):
    """Raised on a rank when the case's configuration cannot run on this machine, by torch's
    own refusal (quoted in the message, with where torch raised it), e.g. pinned CPU offload
    without an accelerator. The lifecycle makes every property the case decides "n/a" with
    that message: evidence, never a silent skip."""


@dataclass(frozen=True, kw_only=True)
class RecordedError:
    """A call on a rank raised; recorded in place of its value so the controller's verdict
    can show torch's traceback (``sut.common.guarded``)."""

    traceback: str
    """The traceback as ``traceback.format_exc()`` wrote it; verdict details print it
    verbatim (P1, P3, P4, P6, P7, P9, P12, the round trip's save error)."""
    exc_type: str = ""
    """The exception's class name, e.g. ``"RuntimeError"`` (empty when unknown)."""


def error_of(value: Any) -> str | None:
    """The traceback a rank recorded instead of ``value`` (a ``RecordedError``), or None when
    ``value`` is a value (None included)."""
    return value.traceback if isinstance(value, RecordedError) else None


@dataclass(frozen=True, kw_only=True)
class SaveRecord:
    """One rank's save side: trained ``case.steps`` steps, saved through the path, wrote the
    files (``save_side``); for a custom path (the plugin), the merged train and save stages."""

    rank: int
    """The rank (of the saving world size). Every property names it."""
    keys: list[str]
    """The optimizer's param keys in its own order (clean FQNs; FSDP1: one per flat unit
    param). P0."""
    meta: list[dict]
    """The wrapped model's layout as the rank sees it: FSDP1 ``fsdp1.flat_metadata`` (one
    dict per flat unit), FSDP2 ``fsdp2.param_layout`` (one dict per param). P0."""
    local: dict
    """``optim.state_dict()`` of the rank before the save, FQN-keyed, CPU (the reference's
    neutral named form). P1 (gathered), P3 (same world size and plan), P7 of a custom path."""
    losses: list[float]
    """The training losses of the ``case.steps`` steps before the save."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds: ``"save"`` (the path's save call), ``"write"`` (writing the files). The run's
    case timings."""
    saved: Any = None
    """What the path's save call returned, in the neutral named form (rank 0's full dict,
    ``{}`` on other ranks of a rank0-only path, the rank's shard of a sharded path), or a
    ``RecordedError``. P1, P2, P7, P8, P9, P10, P11 (through the full dict). None: a custom
    path (the user's format is not read)."""
    saved_devices: list[str] = field(default_factory=list)
    """The devices of the tensors the save call returned, sorted. P9 (offload_to_cpu)."""
    mesh_shape: tuple[int, ...] | None = None
    """FSDP2: the device mesh's shape (``(W,)``, or ``(replicas, shards)`` under HSDP). P0.
    None for FSDP1."""
    own_mixed_precision: str = ""
    """FSDP2 with a user's ``shard_fn``: the dtype a ``MixedPrecisionPolicy`` it applied
    computes in (``sut.fsdp2.own_mixed_precision``; "" none). P2/P6 judge by it
    (properties/precision.py)."""
    params: dict | None = None
    """Rank 0: every param after training, unsharded, by clean FQN (also written to the
    model file the load side starts from). None on other ranks."""
    saved_ids: Any = None
    """fsdp1.rekey, rank 0: the PARAM_ID dict written to the file (or a ``RecordedError`` if
    rekeying raised). P8. None elsewhere."""
    flip: str = ""
    """P9: what the path's declared flip is (``sut.roundtrip.Flip.name``): ``"all_ranks"``
    (rank0_only off and no offload / fsdp2.full's ``cpu_offload=False``: every rank gets
    the full dict), ``"unoffloaded"`` (a save that offloads, without offloading),
    ``"offloaded"`` (a save that does not offload, with ``cpu_offload=True``); "" for a
    path without flags to flip."""
    flipped: Any = None
    """P9: what the flipped save returned, neutral form, or a ``RecordedError``. None where
    ``flip`` is ""."""
    flipped_devices: list[str] | None = None
    """P9: the devices of the flipped save's tensors, sorted. None where ``flip`` is ""."""
    device: str = "cpu"
    """The rank's compute device (``"cpu"``, ``"cuda:0"``). P9: where it is the CPU, every
    tensor is on the CPU whether ``offload_to_cpu`` works or not, so the offload check
    cannot observe anything there."""
    after_save: dict | None = None
    """Custom path: the rank's ``optim.state_dict()`` right after the user's save (P7: a save
    must not change it). None for the built-in paths."""
    sched: dict | None = None
    """The LR scheduler's ``state_dict()`` at the save (P11; ``zoo.scheduler_state``). None
    without a scheduler."""
    step: int | None = None
    """Custom path with the training state: ``TrainState.step`` at the save (P11)."""
    pending: str = ""
    """Custom path: what was still writing the checkpoint when the user's save returned (a
    thread in ``torch.distributed.checkpoint``: an ``async_save`` whose Future nobody waited
    for), one line; empty when nothing was. P7."""
    ignored_params: dict | None = None
    """Custom path: this rank's own values of the params of FSDP-ignored modules at the
    save (each rank trains its own copy); what a known effect that restores one rank's copy
    on every rank reads. None elsewhere."""
    rng: dict | None = None
    """Custom path: a digest of each of the rank's random-number states (``"torch"``,
    ``"python"``, ``"numpy"``) when the user's save was called (user/rank_side.py
    ``rng_digest``); P6's information on whether the load restored them. None elsewhere."""
    reused_training: bool = False
    """The save side took the model and optimizer an earlier case of another path trained
    alike (sut/trained.py) instead of training them. The run's count; no property reads it."""


@dataclass(frozen=True, kw_only=True)
class LoadRecord:
    """One rank's load side: a fresh model and optimizer at the load world size and plan,
    loaded through the path, saved again, resumed (``load_side``); for a custom path, the
    merged load, resume and again stages."""

    rank: int
    """The rank (of the loading world size). Every property names it."""
    keys: list[str]
    """The fresh optimizer's param keys in its own order. P0."""
    meta: list[dict]
    """The freshly wrapped model's layout (as ``SaveRecord.meta``). P0."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds: ``"read"`` (reading the files), ``"load"`` (the path's load call),
    ``"resave"`` (the save right after). The run's case timings."""
    mesh_shape: tuple[int, ...] | None = None
    """FSDP2: the device mesh's shape. P0. None for FSDP1."""
    weights_only_refused: str = ""
    """Why ``torch.load(weights_only=True)`` refused the file (then it was read without);
    empty when it did not. P8, P12's note."""
    reread: Any = None
    """Rank 0 of a full path: the file read back, neutral form (fsdp1.rekey: rekeyed back to
    names, or a ``RecordedError`` if that raised); every rank of fsdp1.legacy_sharded: its
    own file read back, in the save record's form. P5, P8. None elsewhere."""
    reread_ids: dict | None = None
    """fsdp1.rekey, rank 0: the PARAM_ID dict read back from the file. P5, P8."""
    loaded: Any = None
    """The rank's ``optim.state_dict()`` right after the load, FQN-keyed, CPU, or a
    ``RecordedError`` if the load raised. P3, P4, P7, P10, P11, P12. None: the load never
    ran (a custom path whose load stage raised)."""
    resaved: Any = None
    """The path's save call right after the load (neutral form), or a ``RecordedError``.
    P4, P7. None when the load raised, and in a golden case (P12 alone: the load side stops
    after recording ``loaded``)."""
    losses: list[float] | None = None
    """The losses of the ``case.resume_steps`` steps after the load. P6. None where
    ``resaved`` is."""
    final_local: dict | None = None
    """The rank's ``optim.state_dict()`` after resuming. P6 (gathered)."""
    final_params: dict | None = None
    """Every param after resuming, unsharded, as this rank holds it (P6 judges the first
    rank of each replica). None: it did not resume, or a custom path's rank other than 0."""
    params_loaded: dict | None = None
    """Custom path, rank 0, where the user's load restores the weights (a training-state
    load, or a model load function): every param right after the load, unsharded (P3:
    the saved weights, bitwise). None elsewhere."""
    loaded_again: dict | None = None
    """Custom path, P7: the state after a second, fresh load of the same checkpoint."""
    after_resave: dict | None = None
    """Custom path, P7: the state right after saving that load again."""
    reloaded: dict | None = None
    """Custom path, P7: the state after loading what was saved again."""
    sched_loaded: dict | None = None
    """The LR scheduler's ``state_dict()`` right after the load restored it (P11). None
    without a scheduler."""
    step_loaded: Any = None
    """The training step the load restored: a custom path's ``TrainState.step`` after the
    user's load, an app-state case's step after ``dcp.load`` (P11; training resumes
    there). None where nothing restores a step."""
    sched_final: dict | None = None
    """The LR scheduler's ``state_dict()`` after resuming (P6: the learning rates it
    produced). None without a scheduler."""
    diagnosis: dict | None = None
    """Custom path: what the rank saw right after the user's load (user/diagnosis.py
    ``after_load``: params the optimizer no longer holds, state off its param's device)."""
    rng_loaded: dict | None = None
    """Custom path: ``SaveRecord.rng``'s digests right after the user's load (each equal to
    the same rank's at the save where the load restored that generator's state)."""
    next_save: Any = None
    """A chain's next link (``Case.links``): this rank's ``SaveRecord`` of the save through
    the same path after the resumed training (``Case.next_link``'s save side), or None."""
