"""Known torch limitations: failures of torch (not of the suite), each with the torch
versions it was seen on, the evidence, the upstream issue where one is known, and a model of
the bug (known/model.py): the exact wrong value it produces or the exact error it raises.

Rule: a (case, property) that an entry applies to is "known" only when the entry's model
explains what was observed (known/apply.py); anything else there is a failure. A primary
property (``props``) that passes is reported "fixed upstream?" so the entry can be retired.
``also`` lists properties that fail as a consequence in some cases only (a corrupted full
dict makes a resume differ, say): failing there as modelled is "known", passing there is a
plain pass. A property may name one API path (``"P3:set_full"``, FSDP2's differential
tests). Several entries can meet on one path (:func:`known_all` lists every one)."""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable

from ..cases import Case
from ..properties.catalogue import PROPS
from ..api_paths import PATH_NAMES, PATHS, api_path, paths_of
from .effects import (alias_to_last_state, drop_empty_mappings, drop_empty_states,
                      hybrid_rows_chunked_globally, ignored_state_of_dcp_writer,
                      ignored_weights_of_dcp_writer, untie_tied_model,
                      drop_frozen_state, dummy_step_state, empty_state_for_every_param,
                      frozen_state_as_fresh, initial_lr_from_scheduler_built_after,
                      held_once_vectors_cut_to_their_param, lr_set_by_scheduler_built_after,
                      state_left_as_fresh,
                      state_cast_to_param_dtype,
                      stateless_rekey_is_a_noop, tuples_to_lists, unshare_when_resharded,
                      unused_params_get_zero_grads)
from .model import Effect, Model, Outcome, Raises


@dataclass(frozen=True)
class KnownLimitation:
    key: str
    props: tuple[str, ...]  # ("P1",), ...
    applies: Callable[[Case], bool]
    torch_versions: str
    reason: str
    upstream: str = "not yet reported upstream (found by this suite)"
    also: tuple[str, ...] = ()  # consequence properties (see the module docstring)
    model: Model | None = None  # what the bug does, exactly (required: __post_init__)

    def __post_init__(self) -> None:
        if self.model is None:
            raise ValueError(f"known limitation {self.key!r} has no model of its bug")

    def primary(self, prop: str) -> bool:
        return prop in self.props

    def explains(self, detail: str) -> bool:
        """Whether the model explains a failure's ``detail`` by itself (an ``Effect`` never
        does: it needs the case judged again under it, known/apply.py)."""
        return not isinstance(self.model, Effect) and self.model.explains(detail)


# P15 outcomes (properties/fault_props.py words them)
SILENT = r".*: loaded silently on every rank: no error was raised"
UNNAMED = r".*: every rank raised, but the error does not name '.*':"
NAMES_NEITHER = r".*: every rank raised, but the error names neither the file nor the damage:"
STRANDED = (r".*: rank\(s\) \[[\d, ]+\] raised but rank\(s\) \[[\d, ]+\] were left waiting in "
            r"a collective:")

ALL_PROPS = PROPS  # the catalogue's (properties/catalogue.py)
# APIs whose save gathers a full dict with FSDP1's _optim_utils (the aliasing below): the
# FSDP1 observer and every FSDP1 path that saves a full dict (DSD's full save on FSDP1 calls
# FSDP.optim_state_dict too).
_FULL_GATHER_APIS = ("fsdp1",) + tuple(p.name for p in PATHS if p.family == "fsdp1" and p.full)


def _has_ignored(c: Case) -> bool:
    """The case's model has modules FSDP ignores (the zoo's ``buffers``, or a user's
    ``ignored``)."""
    from ..zoo import model_spec

    return bool(model_spec(c.model).ignored)


def _touches(c: Case, trait: str) -> bool:
    """The case's model has ``trait`` (``zoo.TRAITS``): a zoo model or a user's, matched by
    what the entry touches, not by a zoo model's name."""
    from ..zoo.models import TRAITS, touches

    if trait not in TRAITS:
        raise ValueError(f"unknown model trait {trait!r}; traits: {TRAITS}")
    return touches(c.model, trait)


def _some_rank_gets_no_chunk(c: Case) -> bool:
    """At the load world size, torch.chunk of some param's dim 0 gives fewer pieces than
    ranks (dcp-zero-local-shard-falls-back-to-old-keys)."""
    from ..zoo import model_shapes

    w = 2 if c.strategy == "HYBRID_SHARD" and c.dst_world_size >= 2 else c.dst_world_size
    return any(-(-rows // -(-rows // w)) < w for rows in model_shapes(c.model) if rows)


def _fsdp1(c: Case) -> bool:
    """An FSDP1 case (the differential observer "fsdp1" or a run path "fsdp1.*")."""
    return c.api == "fsdp1" or (c.api in PATH_NAMES and api_path(c.api).family == "fsdp1")


# FSDP2 API paths of the conformance run (sut/fsdp2_paths/); "fsdp2" is the differential
# observer (sut/fsdp2.py), whose properties name a path ("P3:set_full").
_FSDP2_RUN = paths_of("fsdp2")
# Run paths that go through torch.distributed.checkpoint.state_dict (DSD), on either FSDP:
# their records say they call set_optimizer_state_dict.
_DSD_RUN = tuple(p.name for p in PATHS if "set_optimizer_state_dict" in p.calls)


def _record(c: Case):
    """The run path's record (api_paths.py), None for an observer or a user's path."""
    return api_path(c.api) if c.api in PATH_NAMES else None


def _dsd_full_load(c: Case) -> bool:
    """A run path that loads a full dict with ``set_optimizer_state_dict(full_state_dict=True)``
    (its record writes a full dict and calls DSD), on either FSDP."""
    r = _record(c)
    return r is not None and r.full and "set_optimizer_state_dict" in r.calls


def _dsd_loads_its_dict(c: Case) -> bool:
    """A run path that hands ``set_optimizer_state_dict`` the dict it saved, read back with
    torch.load (a full file, or a rank's own file): no DCP template in between."""
    r = _record(c)
    return r is not None and r.writes != "dcp" and "set_optimizer_state_dict" in r.calls


def _dsd_sharded_load_on_fsdp2(c: Case) -> bool:
    """A run path that loads a sharded (DTensor) dict into ``fully_shard`` with
    ``set_optimizer_state_dict(full_state_dict=False)``: through DCP or a rank's own file."""
    r = _record(c)
    return r is not None and r.family == "fsdp2" and not r.full \
        and "set_optimizer_state_dict" in r.calls


def _reads_own_dtensor_file(c: Case) -> bool:
    """A run path each rank of which torch.loads a file of its own holding per-parameter
    DTensors (golden format ``dtensor_rank_files``)."""
    r = _record(c)
    return r is not None and r.file_format == "dtensor_rank_files"


def _dsd_load_on_fsdp1(c: Case) -> bool:
    """A run path that loads an FSDP1 model with ``set_optimizer_state_dict`` (which splits the
    dict, then hands it to ``FSDP.optim_state_dict_to_load``: state_dict.py:1094-1134)."""
    r = _record(c)
    return r is not None and r.family == "fsdp1" and "set_optimizer_state_dict" in r.calls


def _steps_whole_tensors(c: Case) -> bool:
    """Whether the case's optimizer reads a whole tensor to update an element of it and
    accepts a 1-D one (``zoo.optimizers.WHOLE_TENSOR`` but not ``MATRIX_ONLY``), and whose
    state is per param (not ``HELD_ONCE``: FSDP1 cannot save LBFGS's, entry
    fsdp1-reads-held-once-state-per-param, so nothing reads how it trains). Imported here,
    not at module load: torch."""
    from ..zoo.optimizers import HELD_ONCE, MATRIX_ONLY, WHOLE_TENSOR

    return c.optimizer in WHOLE_TENSOR - MATRIX_ONLY - HELD_ONCE


def _optimizer_touches(c: Case, trait: str) -> bool:
    """The case's optimizer has ``trait`` (``zoo.optimizers.OPTIMIZER_TRAITS``: a user's
    optimizer, seen fresh when its model was checked); imported here, not at module load."""
    from ..zoo.optimizers import optimizer_touches

    return optimizer_touches(c.optimizer, trait)


def _holds_state_once(c: Case) -> bool:
    """Whether the case's optimizer holds one state for all its params
    (``zoo.optimizers.HELD_ONCE``: LBFGS; imported here, not at module load: torch)."""
    from ..zoo.optimizers import HELD_ONCE

    return c.optimizer in HELD_ONCE


def _steps_pieces(c: Case, load_side: bool = False) -> bool:
    """Whether FSDP1's optimizer steps pieces of params on the save side (the load side):
    flat parameters always (a unit's params flattened into one 1-D tensor), original params
    where the reference layout shards their unit; unsharded original params keep their
    shape (properties/shard_training.py cuts them the same way)."""
    from ..properties.layouts import reference_layout

    if not c.use_orig_params:
        return True
    return any(u.sharded for u in reference_layout(c, load_side=load_side).units)


def _orig_cuts_factors(c: Case) -> bool:
    """An FSDP1 Adafactor case with original params saved where they are whole (factored
    state) and loaded where they are cut into pieces (not through DSD onto a rank that
    lacks a param: entry dsd-zero-grad-step-divides-by-empty-piece)."""
    return (c.family == "fsdp1" and c.use_orig_params and c.optimizer == "adafactor"
            and not _steps_pieces(c) and _steps_pieces(c, load_side=True)
            and not (_dsd_load_on_fsdp1(c) and _some_rank_lacks_a_param(c)))


def _some_rank_lacks_a_param(c: Case) -> bool:
    """Whether a load rank of an FSDP1 case holds no element of some param (its sharded
    unit's pieces on that rank miss the param: reference/layout.py ``param_pieces``)."""
    from ..properties.layouts import reference_layout

    lay = reference_layout(c, load_side=True)
    for unit in lay.units:
        if not unit.sharded:
            continue
        for r in range(lay.world_size):
            held = {pc.fqn for pc in unit.param_pieces(lay.shard_rank(r))}
            if set(unit.fqns) - held:
                return True
    return False


def _muon_rank_holds_no_row(c: Case, load_side: bool = False) -> bool:
    """A Muon case (``zoo.optimizers.steps_by_newton_schulz``) under fully_shard (no tensor
    parallelism) where a rank of the save side
    (load side) holds no row of a trainable 2-D param FSDP2 shards: ``torch.chunk``'s
    split of its rows over the shard group leaves that rank none (5 rows on 4 ranks: 2, 2,
    1, 0) (entries muon-cannot-step-an-empty-row-shard,
    dsd-init-steps-muon-on-an-empty-row-shard)."""
    from ..zoo.optimizers import steps_by_newton_schulz

    if c.family != "fsdp2" or c.tensor_parallel_of(load_side) \
            or not steps_by_newton_schulz(c.optimizer):
        return False
    return _empty_row_shard(c, load_side)


@functools.lru_cache(maxsize=256)
def _empty_row_shard(c: Case, load_side: bool) -> bool:
    from ..properties.layouts import fsdp2_reference_layout
    from ..zoo import build_model

    trainable = {n for n, p in build_model(c.model, c.seed).named_parameters()
                 if p.requires_grad and p.ndim == 2}
    lay = fsdp2_reference_layout(c, load_side)
    return any(p.sharded and p.fqn in trainable and p.local_shape(r)[0] == 0
               for p in lay.params for r in range(lay.world_size))


def _rank0_broadcasts(c: Case) -> bool:
    """A run path whose full load hands the dict to rank 0 alone, which sends the others
    theirs (its record's ``full_load == "broadcast"``; fsdp2.full's ``no_broadcast`` axis
    turns that off)."""
    r = _record(c)
    return r is not None and r.full_load == "broadcast" and not c.no_broadcast


def _rank0_scatters(c: Case) -> bool:
    """A run path whose full file rank 0 alone reads and scatters (``full_load``)."""
    r = _record(c)
    return r is not None and r.full_load == "scatter"


def _every_rank_reads_full_file(c: Case) -> bool:
    """A run path whose full file every rank reads with torch.load (a full path that does not
    scatter)."""
    r = _record(c)
    return r is not None and r.full and r.full_load != "scatter"


_LAZY_STATE = ("sgd_momentum", "adam", "adamw", "adadelta", "rmsprop")  # state at 1st step
_ALL_BUT = lambda *ps: tuple(p for p in ALL_PROPS if p not in ps)  # noqa: E731


def _crash_parts(c: Case):
    """``(point, killed ranks, layout)`` of a crash case, None for any other."""
    if not c.crash:
        return None
    from ..cases import crash_parts

    return crash_parts(c.crash, c.world_size)


def _crash_leaves_rank0_file_missing(c: Case) -> bool:
    """A crash case that kills rank 0 before its file is in the new folder."""
    parts = _crash_parts(c)
    return parts is not None and parts[2] == "fresh" and 0 in parts[1]


def _crash_kills_one_rank_file(c: Case) -> bool:
    """A crash case that kills one rank (not every rank) before its file is in the new
    folder."""
    parts = _crash_parts(c)
    return (parts is not None and parts[2] == "fresh" and len(parts[1]) == 1
            and c.world_size > 1)


def _dcp_overwrite_killed_after_data(c: Case) -> bool:
    """A crash case on a DCP-writing path whose second save, over the first, was killed
    after the plan exchange, before its commit (``before_file`` with a rank left to write
    its data, ``own_file``, ``commit``)."""
    parts = _crash_parts(c)
    if parts is None or c.api not in PATH_NAMES or api_path(c.api).writes != "dcp":
        return False
    point, ranks, layout = parts
    some_write = point != "before_file" or len(ranks) < c.world_size  # every rank stopped
    return layout == "over" and point in ("before_file", "own_file", "commit") and some_write


def _release(version: str) -> tuple[int, ...]:
    """(major, minor, patch) of a torch version string ("2.15.0+cu132" -> (2, 15, 0))."""
    return tuple(int(x) for x in re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version).groups("0"))


def _running_torch() -> tuple[int, ...]:
    from importlib import metadata

    return _release(metadata.version("torch"))


def _fixture_from(c: Case, first: str) -> bool:
    """A golden case whose fixture was written by torch ``first`` or later, loaded by a torch
    older than ``first``."""
    if not c.golden:
        return False
    written = _release(c.golden.split("/", 1)[0])
    return written >= _release(first) > _running_torch()


def _rank_files_with_tensor_state(c: Case) -> bool:
    """fsdp1.legacy_sharded files that hold ShardedTensor values: some tensor state of a
    sharded unit (flat units always; original params only when sharded)."""
    return (c.api == "fsdp1.legacy_sharded" and c.optimizer != "sgd"
            and (c.steps > 0 or c.optimizer == "adagrad")
            and (not c.use_orig_params or (c.world_size > 1 and c.strategy != "NO_SHARD")))


_STRIDES = (
    "torch 2.15 pickles a sixth field, `strides`, in TensorProperties (DCP's "
    "checkpoint/metadata.py __getstate__ :71-78, and ShardedTensor's "
    "_shard/sharded_tensor/metadata.py), while torch 2.13's __setstate__ unpacks exactly five "
    "(checkpoint/metadata.py:81-87, _shard/sharded_tensor/metadata.py:50). So a torch older "
    "than the writer cannot read the file: a rollback after an upgrade cannot load any DCP "
    "checkpoint (its .metadata) or per-rank ShardedTensor file written by the newer torch. "
    "Seen: every 2.15.0 fixture of those formats loaded by 2.13.0 and by 2.8.0 "
    "(fixtures/2.15.0). The "
    "field was added as 'optional for backward compatibility' (old files in new torch), "
    "not forward.")
_STRIDES_UPSTREAM = ("https://github.com/pytorch/pytorch/pull/192248 and "
                     "https://github.com/pytorch/pytorch/pull/194251 (add strides to "
                     "TensorProperties)")


def _ties(c: Case) -> tuple:
    """The model's ties whose users lie in different units under the save's or the load's
    plan (zoo/ties.py): the zoo's tied pair (embed.weight / out.weight) under 'split' /
    'split_out', or a user's model under its plan."""
    from ..zoo.ties import ties_across_units

    return tuple(dict.fromkeys(ties_across_units(c.model, c.plan)
                               + ties_across_units(c.model, c.dst_plan)))


def _tied_across_units(c: Case) -> bool:
    """FSDP1 with a tied param whose users sit in different units (FSDP2 refuses that
    wrapping outright)."""
    return _fsdp1(c) and bool(_ties(c))


def _tie_owned_by_later_user(c: Case) -> dict:
    """``{tied param's first FQN: its first user}`` for each tie across units that the unit
    of a later user owns (tied-across-units-orig-grad-not-reduced's ``local_grads``)."""
    return {t.names[0]: t.users[0] for t in _ties(c) if t.owned_by_later_user}


def _sharded(c: Case) -> bool:
    """FSDP really shards (every strategy is NO_SHARD on a 1-rank group)."""
    if c.world_size == 1 or c.strategy == "NO_SHARD":
        return False
    return not (c.strategy == "HYBRID_SHARD" and c.shard_world_size == 1)


_TIED_UPSTREAM = (
    "https://github.com/pytorch/pytorch/issues/128011 is docs/design.md's tied-weights class (there "
    "DSD's set_optimizer_state_dict expected every FQN of a shared param; fixed by #128685), "
    "not this FSDP1 failure; FSDP1 does not support shared params in different units: "
    "https://github.com/pytorch/pytorch/issues/83052")


_TWO_TENSOR_STATES = ("adam", "adamw", "adadelta", "nadam", "radam", "adamax", "rprop")
"""The zoo optimizers with two or more param-shaped state tensors per param (named here so
that reading the entries does not import torch)."""
_BETAS = ("adam", "adamw", "nadam", "radam", "adamax", "muon", "rprop")
"""The zoo optimizers with a tuple hyperparameter that steps under fully_shard (betas;
Muon's ns_coefficients; Rprop's etas and step_sizes, under torch 2.15: entry
rprop-cannot-step-dtensor). Adafactor's eps is a tuple too, but Adafactor cannot step a
fully_shard model (adafactor-cannot-step-dtensor), so a load into one raises first."""
_FLOAT32_STATE = ("sgd_momentum_fp32state", "nadam", "asgd")
"""The zoo optimizers that keep float32 state whatever the params' dtype: the float32 momentum
of zoo.optimizers.STATE_DTYPE_OPTIMIZERS, NAdam's 0-dim mu_product and ASGD's 0-dim eta and
mu (created with torch's default scalar dtype)."""


_MUON_ADD_REFUSED = Raises(exc="RuntimeError",
                           message=r"^aten\.add_\.Tensor: in-place operations that require "
                                   r"placement changes are not supported",
                           where=("_single_tensor_muon",))
"""Muon's param update refused by DTensor where a rank holds no row of the param (entries
muon-cannot-step-an-empty-row-shard, dsd-init-steps-muon-on-an-empty-row-shard)."""


KNOWN: tuple[KnownLimitation, ...] = (
    KnownLimitation(
        "orig-params-full-osd-aliasing", ("P1",),
        lambda c: c.use_orig_params and c.world_size > 1 and c.api in _FULL_GATHER_APIS
        and c.optimizer in _TWO_TENSOR_STATES
        and c.strategy != "NO_SHARD"
        and not (c.strategy == "HYBRID_SHARD" and c.shard_world_size == 1),
        "2.13 (CPU)",
        "full_optim_state_dict / optim_state_dict(FULL) with use_orig_params=True on CPU, "
        "when it offloads to CPU: every tensor state of a unit is gathered into one buffer "
        "(_optim_utils.py:1555), reused for each state name in sorted order (:1360, :1558), "
        "and taken as views of it (:1655-1666); with offload_to_cpu=True "
        "(FullOptimStateDictConfig's default; full_optim_state_dict always offloads) "
        "_unflatten_orig_param_states calls .cpu() (:1505-1507), which does not copy a CPU "
        "tensor, where without offload it clones (:1501-1503). So every tensor state comes "
        "back holding the values of the last one gathered: exp_avg holds exp_avg_sq "
        "(Adam/AdamW), acc_delta holds square_avg (Adadelta), and so for every optimizer with "
        "two or more param-shaped states (NAdam, RAdam, Adamax, Rprop: seen 2026-11-29 on "
        "every full path at 2 -> 3 and 3 -> 2), with rank0_only True or False "
        "(Adam at 2 and 3 ranks, Adadelta at 3); offload_to_cpu=False returns a correct dict. "
        "DSD's get_optimizer_state_dict(full_state_dict=True) on FSDP1 passes "
        "offload_to_cpu=cpu_offload (state_dict.py:348-351), so there only cpu_offload=True "
        "is affected. Minimal reproducer: notes/repro/fsdp1_full_osd_offload_aliasing.py. "
        "They are views of one storage, and torch.save keeps that: loaded at one rank the "
        "states still share it, so Adam's in-place updates of exp_avg and exp_avg_sq write "
        "the same memory and the resumed run goes to NaN (the plugin's example GatedNet, "
        "2 -> 1 ranks); loaded at more ranks, each rank copies its shard and they do not. "
        "Bitwise diff in the P1 detail. Not run on a GPU; there .cpu() copies, so the states "
        "should come back separate.",
        also=("P2", "P3", "P6", "P7", "P9"),
        model=Effect(what="every positive-dim tensor state of a param (not of an ignored module's) "
                     "holds the values of its last one "
                     "(Adam/AdamW: exp_avg := exp_avg_sq; Adadelta: acc_delta := square_avg)",
               save=alias_to_last_state, load=unshare_when_resharded)),
    KnownLimitation(
        "orig-params-frozen-full-osd", ("P1", "P4", "P5"),
        lambda c: _fsdp1(c) and c.use_orig_params and c.model == "frozen" and c.world_size == 1,
        "2.13",
        "full_optim_state_dict and sharded_optim_state_dict raise for a frozen param with use_orig_params=True at world "
        "size 1 (the frozen-params class of pytorch#110540): 'KeyError: Parameter containing: "
        "...' from param_to_fqns in _map_param_key_to_optim_keys (_optim_utils.py:1214; Adagrad, "
        "whose state is eager) or _unflatten_param_groups (:1270; Adam, SGD with momentum), so "
        "every save path at world size 1 fails whatever the load side; P5's FSDP -> plain "
        "rekey then has no full dict to start from.",
        "https://github.com/pytorch/pytorch/issues/110540 (same class)",
        model=Raises(exc="KeyError", message=r"^Parameter containing",
               where=("_map_param_key_to_optim_keys", "_unflatten_param_groups"))),
    KnownLimitation(
        "adagrad-eager-state-empty-piece", ("P3",),
        lambda c: _fsdp1(c) and c.use_orig_params and c.optimizer == "adagrad" and _sharded(c)
        and c.loads_where_saved,  # P3's own-state check
        "2.13",
        "Adagrad creates state eagerly for every param, so with use_orig_params=True a rank "
        "holding none of a param still has {'step': 0, 'sum': empty} for it; the sharded dict "
        "a load path produces has no entry there, so a reload does not equal the rank's own "
        "optim.state_dict() (Adagrad's eager-state class in docs/design.md).",
        also=("P4",),
        model=Effect(what="a param of which the rank holds no element has no state after the load "
                     "(before the save it had {'step': 0, 'sum': empty})",
               load=drop_empty_states)),
    KnownLimitation(
        "tied-across-units-flat-untied", ("P0", "P1", "P3", "P4"),
        lambda c: _tied_across_units(c) and not c.use_orig_params,
        "2.13",
        "use_orig_params=False, a tied param whose users sit in different units (zoo 'tied', "
        "plans 'split' / 'split_out', or a user's model whose plan splits a tie: "
        "zoo/ties.py; any strategy and world size): FSDP flattens the tensor "
        "twice and the tie is silently broken. The original params are marked flattened only "
        "with use_orig_params=True (_flat_param.py:464-466; passed only then, :793-794), so an "
        "enclosing unit's _get_orig_params (_init_utils.py:1195-1200) finds the alias still "
        "registered on its module and flattens it again. Seen: a unit the reference does not "
        "have (P0: root _fqns ['out.weight'] for 'split'), two optimizer states for one tensor, "
        "a full dict holding both embed.weight and out.weight with different momentum_buffer "
        "values (P1/P3/P4), which the unwrapped model cannot take (P5: out.weight is none of "
        "its param names; torch's rekey raises KeyError at fully_sharded_data_parallel.py:"
        "1782), and losses that leave the unwrapped model's at step 2 "
        "(sgd_momentum: 3.5767 vs 3.5736 at ws 1, 2, 3). FSDP1's docstring calls shared-param "
        "support limited (fully_sharded_data_parallel.py:215-218).",
        _TIED_UPSTREAM,
        also=("P2", "P6", "P7", "P11"),
        model=Effect(what="the tie is broken: the run is a correct run of the same model with "
                     "each unit's users of the tied tensor holding a copy of their own (the "
                     "zoo's 'tied': out.weight a parameter of its own that starts as a copy of "
                     "embed.weight, 'tied_untied'; zoo/ties.py untied_variant)",
                     runs_as=untie_tied_model)),
    KnownLimitation(
        "tied-across-units-flat-untied-rekey", ("P5",),
        lambda c: _tied_across_units(c) and not c.use_orig_params,
        "2.13",
        "The full dict of a broken tie (tied-across-units-flat-untied) holds a state for "
        "out.weight, which the unwrapped (tied) model does not have as a param name, so "
        "torch's rekey_optim_state_dict to PARAM_ID raises KeyError: 'out.weight' "
        "(fully_sharded_data_parallel.py:1782).",
        _TIED_UPSTREAM,
        model=Raises(exc="KeyError", message=r"^'out\.weight'$",
                     where=("rekey_optim_state_dict",))),
    KnownLimitation(
        "tied-across-units-orig-sharded-forward", ("P0", "P1", "P2", "P3", "P4", "P5"),
        lambda c: _tied_across_units(c) and c.use_orig_params and _sharded(c),
        "2.13",
        "use_orig_params=True with a sharded strategy, a tied param whose users sit in "
        "different units: the enclosing unit skips the (marked) param, so the module outside "
        "the owning unit runs on the owner's sharded 1-D view and the first forward raises "
        "('split': F.linear 'size mismatch, got input (16), mat (16x6), vec (22)' at ws 3; "
        "'split_out': F.embedding raises \"'weight' must be 2-D\"). Nothing can be saved.",
        _TIED_UPSTREAM,
        model=Raises(exc="RuntimeError",
               message=r"^size mismatch, got input|^'weight' must be 2-D")),
    KnownLimitation(
        "tied-across-units-orig-grad-not-reduced", ("P2",),
        lambda c: (_fsdp1(c) and bool(_tie_owned_by_later_user(c)) and c.use_orig_params
                   and c.world_size > 1 and not _sharded(c)),
        "2.13",
        "use_orig_params=True, NO_SHARD at world size >= 2, the tied param owned by the unit "
        "of its *later* user (plan 'split_out': unit 'out' owns embed.weight, which the root's "
        "`embed` uses first): the gradient that reaches embed.weight through `embed` is not "
        "all-reduced. Each rank steps embed.weight on the mean over ranks of its gradient "
        "through `out` plus its own rows' gradient through `embed` (not divided by the world "
        "size), so the ranks' embed.weight and its optimizer state train apart while every "
        "other param gets the mean (its state stays equal on every rank). Checked by a "
        "single-process model of the ranks (properties/baseline.py, `local_grads`): the "
        "losses (5.244028856075574 at ws 2, 5.247436895446319 at ws 3, against 5.243029752 "
        "unwrapped) and every rank's exp_avg / exp_avg_sq of embed.weight agree to 2.3e-16 "
        "relative after 2 Adam steps; neither '+ own / world size' nor the mean of the "
        "`embed` gradients with each rank's own `out` gradient fits (relative errors 0.3-0.57). "
        "Plain-torch reproducer (notes/repro/fsdp1_tied_no_shard_unreduced_grad.py, 2 ranks, "
        "one backward): each rank's grad of the tied param equals that sum exactly (max abs "
        "difference 0; 0.181 from the correct mean), every other param's grad the mean "
        "exactly. Mechanism not traced to a line: the root's `embed` runs on the original "
        "parameter outside the owning unit, whose post-backward hook reduces only the "
        "FlatParameter's gradient. "
        "Each rank's full and sharded dicts are its own state (NO_SHARD), so P1/P3/P4, judged "
        "per replica, pass; the ranks disagree (P2). With the owner being the earlier user "
        "(plan 'split') NO_SHARD is correct.",
        _TIED_UPSTREAM,
        model=Effect(what="rank r steps embed.weight on the mean over ranks of its gradient "
                          "through `out` plus its own rows' gradient through `embed`: the "
                          "ranks train apart",
                     local_grads=_tie_owned_by_later_user)),
    # --- FSDP2 (fully_shard) + torch.distributed.checkpoint.state_dict (props name a path) ---
    KnownLimitation(
        "dsd-flattened-full-load", ("P3:set_flattened",),
        lambda c: c.api == "fsdp2" and c.optimizer != "sgd",
        "2.13",
        "set_optimizer_state_dict(full_state_dict=True, flatten_optimizer_state_dict=True) cannot "
        "load what get_optimizer_state_dict returned with the same options, on any model: "
        "_load_optim_state_dict unflattens the loaded dict (state_dict.py:1100) but fetches the "
        "local dict switching only full_state_dict off (:1141-1143), so the flatten option still "
        "applies and the local dict comes back flattened (:974); _distribute_state_dict / "
        "_broadcast_state_dict then copy the loaded dict's non-tensor leaves "
        "('param_groups.0.params.0', ...) into it without a mapping entry "
        "(_state_dict_utils.py:672, :712) and _unflatten_state_dict raises KeyError (:822-829).",
        "not yet reported upstream (found by this suite; flattened-load class of "
        "https://github.com/pytorch/pytorch/issues/192224 and #192225)",
        model=Raises(exc="KeyError", message=r"^'param_groups\.",
               where=("_unflatten_state_dict",))),
    KnownLimitation(
        "dsd-stateless-full-load",
        ("P3:set_full", "P3:set_full_nonstrict", "P3:set_flattened", "P3"),
        lambda c: c.api in ("fsdp2", "fsdp2.full")
        and (c.optimizer == "sgd" or _optimizer_touches(c, "empty_state_at_start")),
        "2.13",
        "set_optimizer_state_dict(full_state_dict=True) cannot load a stateless optimizer (SGD "
        "without momentum) into a fully_shard model: the full-dict path takes its device from "
        "the first positive-dim tensor of the local optimizer state and asserts it found one "
        "(state_dict.py:1146-1157, 'Expected device to be set'); a stateless optimizer has none. "
        "Nor an optimizer whose fresh state holds entries without tensors (schedule-free "
        "AdamW in train mode: entry dsd-init-skips-optimizer-with-empty-state), whose local "
        "state DSD leaves without tensors. "
        "torch 2.8 asserts the same without a message (state_dict.py:1000, `assert device is "
        "not None`). The sharded path (full_state_dict=False) loads it. In the run (fsdp2.full) the "
        "load fails on every rank, so the resume (P6) and the re-save (P7) cannot happen. "
        "Golden fixtures (P12): a stored SGD full dict, from FSDP1 or FSDP2, does not load "
        "through fsdp2.full at any world size 1-4 (same assertion).",
        "not yet reported upstream (found by this suite; stateless-optimizer class of "
        "https://github.com/pytorch/pytorch/issues/111499 and #133415)",
        also=("P6", "P7", "P11", "P12"),
        model=Raises(exc="AssertionError", message=r"^(Expected device to be set)?$",
               where=("_load_optim_state_dict",))),
    KnownLimitation(
        "dsd-init-skips-optimizer-with-empty-state", ("P3", "P6", "P7"),
        lambda c: c.api in _DSD_RUN and not api_path(c.api).full
        and _optimizer_touches(c, "empty_state_at_start"),
        "2.13 (CPU)",
        "DSD decides whether a fresh optimizer's state is initialised by 'if optim.state: "
        "return' (state_dict.py:633-635, _init_optim_state, before get_optimizer_state_dict "
        "builds the template a DCP load fills and before set_optimizer_state_dict). An "
        "optimizer that holds state entries without tensors when built, as schedule-free "
        "AdamW after its train() (which reads self.state[p] for every param), is taken for "
        "initialised: the zero-gradient step that would create its state is skipped, the "
        "template has no tensors, dcp.load fills nothing, and the load leaves every param's "
        "state empty, without an error: the resumed run starts its z and exp_avg_sq afresh "
        "(P3 and the re-save P7: the saved tensors missing; P6: the run trains otherwise). "
        "The full-dict load raises instead (dsd-stateless-full-load). Seen with "
        "schedulefree 1.4.1 under the plugin (examples/test_outside_optimizers.py).",
        "not reported upstream that we found",
        model=Effect(what="every param's state is left as the fresh optimizer's: empty",
                     load=state_left_as_fresh)),
    KnownLimitation(
        "dsd-strict-param-without-grad", ("P3:set_full", "P3:set_sharded", "P3"),
        lambda c: (c.api == "fsdp2" or _dsd_loads_its_dict(c))
        and _touches(c, "param_without_grad")  # the zoo's "unused", or a user's model
        and c.optimizer not in ("sgd", "adagrad") and not c.nonstrict,  # strict=False: no check
        "2.13",
        "A trainable param that never got a gradient has no state in get_optimizer_state_dict's "
        "output, and set_optimizer_state_dict with the default strict=True rejects exactly that "
        "dict ('Missing optimizer state for parameter', state_dict.py:1032-1040): a save -> load "
        "round trip of the same model fails by default (full and sharded dicts alike: a full "
        "file, or each rank's own file of its DTensor shards; DCP's template fails first, "
        "dcp-template-dummy-state-missing-key). On the "
        "run's paths that load with broadcast_from_rank0 (fsdp2.full, fsdp1.dsd_full_broadcast) "
        "only rank 0 checks, so the other ranks are left waiting in the broadcast "
        "(dsd-broadcast-rank0-error-strands-others); either way the whole load side fails: "
        "every property of the case reads this error.",
        "not yet reported upstream for this case (partial-state class of "
        "https://github.com/pytorch/pytorch/issues/132628)",
        also=_ALL_BUT("P3"),
        model=Raises(exc="RuntimeError",
               message=r"^Missing optimizer state for parameter '[\w.]+' in checkpoint",
               where=("_split_optim_state_dict",), alongside=("StrandedRanksError",))),
    KnownLimitation(
        "dsd-nonstrict-dummy-state",
        ("P3:set_full_nonstrict", "P3:set_full_broadcast_nonstrict", "P3"),
        lambda c: c.model == "unused" and c.optimizer not in ("sgd", "adagrad") and (
            c.api == "fsdp2" or (c.api == "fsdp2.full" and c.nonstrict)),
        "2.13, 2.15 (the run's nonstrict cases)",
        "With strict=False the full-dict load succeeds but leaves state the checkpoint does not "
        "have: _init_optim_state's zero-grad, lr=0 step (state_dict.py:629-668, called at :1093) "
        "creates state for every trainable param without one (Adam: step=1 and zero moments; "
        "SGD momentum: a zero buffer), and the full-dict path merges the loaded dict into that "
        "local dict, keeping the keys the loaded dict lacks (state_dict.py:1158-1181, "
        "_state_dict_utils.py:640-720). A param with no state in the checkpoint resumes with "
        "step=1 instead of none (step-2 bias correction on its first real update).",
        "not yet reported upstream (dummy-step class: "
        "https://github.com/pytorch/pytorch/issues/133415, pytorch/torchtitan#4382)",
        also=("P6", "P7", "P10"),  # the run (fsdp2.full, Case.nonstrict): resumed from it
        model=Effect(what="every trainable param without state in the loaded dict has the state "
                     "one zero-gradient, lr=0 step creates (Adam: step 1 and its moments of a "
                     "zero gradient)",
               load=dummy_step_state)),
    KnownLimitation(
        "dsd-full-load-tuple-to-list",
        ("P11:set_full", "P11:set_full_broadcast", "P11:set_full_nonstrict",
         "P11:set_full_broadcast_nonstrict", "P11"),
        lambda c: c.api in ("fsdp2", "fsdp2.full") and c.optimizer in _BETAS,
        "2.13",
        "Every full-dict set_optimizer_state_dict path turns tuple hyperparameters into lists "
        "(Adam/AdamW betas (0.9, 0.999) -> [0.9, 0.999]; NAdam, RAdam and Adamax betas, "
        "Muon's ns_coefficients and, where Rprop steps under fully_shard (2.15), its etas "
        "and step_sizes alike): the loaded dict goes through "
        "_flatten_state_dict, which walks tuples like lists (_state_dict_utils.py:755), and "
        "_unflatten_state_dict / _set_element, which rebuild int path items as lists "
        "(:791-829), called from state_dict.py:1158-1181. The optimizer still steps, but its "
        "param_groups no longer equal the saved ones (P11) and a re-save differs (P7); in the "
        "run the resumed optimizer's param_groups differ from uninterrupted training's (P6). "
        "Golden fixtures (P12): every stored Adam/AdamW full dict (FSDP1 or FSDP2) loaded "
        "through fsdp2.full comes back with list betas.",
        also=("P6", "P7", "P12"),
        model=Effect(what="tuple hyperparameters come back as lists (betas (0.9, 0.999) -> "
                     "[0.9, 0.999])", load=tuples_to_lists)),
    KnownLimitation(
        "optim-load-casts-state-to-param-dtype", ("P3", "P7"),
        lambda c: c.optimizer in _FLOAT32_STATE and c.dtype != "fp32",
        "2.13, 2.15",
        "torch.optim.Optimizer.load_state_dict casts every tensor state but 'step' to its "
        "param's dtype when the param is floating point, an int64 counter as well as a float32 "
        "buffer (_process_value_according_to_param_policy, optim/optimizer.py:800-801; 'step' "
        "is kept unless the group is fused or capturable, :794-798). It is intended: the "
        "source comment (:781-782) says floating-point state is 'assumed to always match the "
        "type of params', and the cast came with pytorch#3658 (2017). Every load path ends in "
        "that call, so an optimizer that keeps float32 state for bfloat16 params (the zoo's "
        "sgd_momentum_fp32state, as mixed-precision optimizers do) saves float32 (P1, P2 pass) "
        "and resumes from bfloat16 state: the loaded state (P3), a re-save (P7), the unwrapped "
        "optimizer's load on the rekey path (P5) and the state after resuming (P6) are "
        "bfloat16, the values rounded. torch's own optimizers meet it too: NAdam's 0-dim "
        "mu_product and ASGD's 0-dim eta and mu are created float32 whatever the params' "
        "dtype (torch's default scalar dtype) and come back float64 for float64 params, so "
        "the resumed run differs from the uninterrupted one in the last digits (P6, seen on "
        "every path 2026-11-29), and a stored NAdam or ASGD checkpoint (golden fixtures, "
        "P12) loads back float64. No FSDP path keeps the dtype. It is the only cast: "
        "through DCP the template get_optimizer_state_dict makes for the fresh optimizer is "
        "float32 and dcp.load keeps it (FSDP2, 2 ranks). An optimizer can undo it: _cast "
        "calls the method as Optimizer._process_value_according_to_param_policy (:967), so "
        "overriding it in a subclass changes nothing, but an overridden load_state_dict, or a "
        "load_state_dict post-hook (register_load_state_dict_post_hook; it runs at :1020) "
        "given the loaded dict by a pre-hook, that puts the given tensors back keeps them "
        "float32 and bitwise equal to the saved ones, through DCP and the full-dict path "
        "alike. Minimal reproducer: notes/repro/optim_load_casts_state_to_param_dtype.py.",
        "https://github.com/pytorch/pytorch/issues/43706 (open: checkpoint restore of "
        "optimizers changes the dtype of floating-point state)",
        also=("P5", "P6", "P12"),
        model=Effect(what="every floating-point state tensor but step is cast to the params' "
                     "dtype on load", load=state_cast_to_param_dtype,
                     optim_loaded=state_cast_to_param_dtype)),
    KnownLimitation(
        "dsd-load-ignore-frozen-params-still-strict", ("P3",),
        lambda c: (c.app_state and c.ignore_frozen_params and not c.nonstrict
                   and c.model in ("frozen", "late_frozen")),  # the zoo's frozen models
        "2.13, 2.15 (its reproducer: also 2.8)",
        "A model state saved with StateDictOptions(ignore_frozen_params=True) does not load "
        "back through DCP with the same options: get_state_dict leaves the frozen params out "
        "(_get_model_state_dict, state_dict.py:549-555), which is all the option's docstring "
        "promises (:106-108); on the load side the option is read only in "
        "_verify_state_dict's empty-dict check (:419), and _load_model_state_dict passes "
        "strict=info.strict (StateDictOptions.strict, default True) to model.load_state_dict "
        "(:624), which raises 'Missing key(s) in state_dict' for every frozen param. In the "
        "run: the app state (model and optimizer through set_state_dict after dcp.load) of "
        "the zoo's frozen models does not load (P3; the resume P6, the re-save P7 and the "
        "groups P11 cannot happen); with strict=False as well it loads (the run's /nonstrict "
        "app-state cases). A full model dict saved with the option is another matter: "
        "set_model_state_dict(full_state_dict=True) without broadcast_from_rank0 loads it "
        "with strict=True, because _distribute_state_dict fills the rank's local dict (:617) "
        "and state_dict.update(local_state_dict) (:618) adds the frozen keys from the local "
        "model, whose frozen params keep their own values; with broadcast_from_rank0=True, "
        "strict=True raises the same 'Missing key(s)' on every rank "
        "(_broadcast_state_dict(strict=True) first drops the local keys the broadcast dict "
        "lacks, _state_dict_utils.py:687-690). Minimal reproducer: "
        "notes/repro/dsd_ignore_frozen_params_load.py (its DCP part seen on 2.8, 2.13 and "
        "2.15; its full-dict part on 2.13).",
        also=("P6", "P7", "P11"),
        model=Raises(exc="RuntimeError",
                     message=r"^Error\(s\) in loading state_dict for \w+:",
                     where=("load_state_dict", "_load_model_state_dict"))),
    KnownLimitation(
        "dsd-load-drops-group-keys-the-optimizer-lacks", ("P11",),
        lambda c: (c.api in ("fsdp2.full", "fsdp2.sharded", "fsdp1.dsd_sharded")
                   and c.scheduler_after_load and c.steps > 0  # else lr == initial_lr
                   and not c.no_broadcast  # raises instead: the next entry
                   and (c.api != "fsdp2.full" or c.dst_world_size > 1)),  # rank 0 keeps it
        "2.13, 2.15 (the full tier's cases; the reproducer also on 2.8)",
        "A param-group key in the checkpoint that the loading optimizer lacks (the LR "
        "scheduler's initial_lr, when the scheduler is built after the load) is lost on the "
        "way in by two of torch's loads, each its own way; the scheduler built then sets it "
        "to the loaded (decayed) lr (lr_scheduler.py, setdefault 'initial_lr'), 0.05 -> "
        "0.0405 after two ExponentialLR(0.9) steps. Through DCP (fsdp2.sharded, "
        "fsdp1.dsd_sharded), on every rank: dcp.load reads only the keys of its template, "
        "the fresh optimizer's dict, which has none (set_optimizer_state_dict itself keeps "
        "the key: the same sharded dict loaded in memory, without DCP, keeps initial_lr on "
        "every rank). fsdp2.full with broadcast_from_rank0: _broadcast_state_dict writes a "
        "non-tensor value only into keys the rank's local dict has "
        "(_state_dict_utils.py:670-673); rank 0 then adds the keys its full dict has and "
        "the local lacks (state_dict.py:1168-1176), the others have an empty dict there: ranks "
        "1.. lose initial_lr, rank 0 keeps it. Without broadcast_from_rank0 it is not lost but "
        "raises (entry dsd-full-load-no-broadcast-missing-group-key). The FSDP1 paths, "
        "fsdp1.dsd_full and Optimizer.load_state_dict keep it. (fsdp1.dsd_sharded at 2 -> 3 raises "
        "dcp-zero-local-shard-falls-back-to-old-keys first; seen at 3 -> 2.) Training is unchanged (the chainable schedulers "
        "step from group['lr']); a scheduler or code that reads initial_lr later (closed-form "
        "schedulers, a scheduler rebuilt with last_epoch) starts from the wrong value, and on "
        "fsdp2.full differently on each rank. Minimal reproducer: "
        "notes/repro/dsd_load_drops_initial_lr.py.",
        "https://github.com/pytorch/pytorch/issues/140900 (DCP does not load initial_lr when "
        "the scheduler is created afterwards; closed, the maintainers' advice: build the "
        "scheduler before loading)",
        also=("P3", "P6", "P7"),  # P3: an FSDP1 rank's local dict holds its param_groups
        model=Effect(what="each group's initial_lr is the loaded lr (fsdp2.sharded, "
                     "fsdp1.dsd_sharded: every rank; fsdp2.full: ranks other than 0)",
                     load=initial_lr_from_scheduler_built_after, load_by_rank=True)),
    KnownLimitation(
        "dsd-full-load-no-broadcast-missing-group-key", ("P3",),
        lambda c: c.api == "fsdp2.full" and c.no_broadcast and c.scheduler_after_load,
        "2.13 (the quick tier's fsdp2.full .../no_broadcast @load case)",
        "set_optimizer_state_dict(full_state_dict=True) without broadcast_from_rank0, every "
        "rank loading its own full dict, raises KeyError: 'param_groups.0.initial_lr' on "
        "every rank when the checkpoint's param groups hold a key the fresh optimizer lacks "
        "(the LR scheduler's initial_lr, the scheduler built after the load): "
        "_distribute_state_dict copies every non-tensor value into the rank's flattened local "
        "dict (_state_dict_utils.py:711-712), so the loop that adds the keys the local dict "
        "lacks together with their mapping (state_dict.py:1168-1175) skips that key, and "
        "_unflatten_state_dict, called at state_dict.py:1176, finds no mapping for it "
        "(_state_dict_utils.py:828). Nothing is loaded, so nothing resumes (P6), is saved "
        "again (P7) or has param groups to compare (P11). The setup of pytorch#126948 (keep "
        "initial_lr in set_optimizer_state_dict; closed), whose fix does not cover this load. "
        "Reproducer: notes/repro/dsd_load_drops_initial_lr.py (its 'full, no broadcast' "
        "line).",
        "https://github.com/pytorch/pytorch/issues/126948 (closed) and "
        "https://github.com/pytorch/pytorch/issues/140900 (closed)",
        also=("P6", "P7", "P11"),
        model=Raises(exc="KeyError", message=r"^'param_groups\.\d+\.initial_lr'$",
                     where=("_unflatten_state_dict",))),
    KnownLimitation(
        "scheduler-built-after-load-resets-lr", ("P11",),
        lambda c: (c.scheduler_after_load and c.scheduler not in ("", "exp")
                   and c.steps > 0 and not c.golden),
        "2.13 (the full tier's +sched:<schedule>@load cases)",
        "An LR scheduler built after the optimizer's state is loaded writes its step-0 "
        "learning rate into every param group: the constructor takes a first step "
        "(LRScheduler.__init__ -> _initial_step -> step, lr_scheduler.py:174-180, :284-296), "
        "and the scheduler's load_state_dict that follows restores the scheduler's own fields "
        "(last_epoch, _last_lr, a lambda's fields, the children of SequentialLR / "
        "ChainedScheduler) but not the groups' lr (:192-199). So the loaded lr (the "
        "schedule's value at the save) is replaced by its value at step 0, and OneCycleLR "
        "also rewrites initial_lr, max_lr and min_lr from its constructor's arguments. The "
        "first resumed step runs at that lr; a closed-form schedule (LambdaLR, OneCycleLR) "
        "is back on its curve at the next step, a chainable one (LinearLR inside "
        "SequentialLR / ChainedScheduler) keeps the error. Not an FSDP or DCP bug: every path "
        "shows it alike, plain Optimizer.load_state_dict included; ExponentialLR is immune "
        "(at step 0 it keeps group['lr']). Minimal reproducer, one process: "
        "notes/repro/scheduler_built_after_load_resets_lr.py.",
        "https://github.com/pytorch/pytorch/issues/119168 (restoring SequentialLR has side "
        "effects on the optimizer; closed, the maintainers: most schedulers do, load after "
        "building the scheduler) and https://github.com/pytorch/pytorch/issues/65342 "
        "(CosineAnnealingLR resets the lr when built before its state is loaded; open)",
        also=("P3", "P6", "P7"),  # P3: an FSDP1 rank's local dict holds its param_groups
        model=Effect(what="each group's lr (OneCycleLR: and initial_lr, max_lr, min_lr) is "
                     "the schedule's step-0 value, as building the schedule on the loaded "
                     "optimizer sets it",
                     load=lr_set_by_scheduler_built_after)),
    # --- found by the conformance run, FSDP2 paths (sut/fsdp2_paths/) ---------------------
    KnownLimitation(
        "dtensor-no-fused-sgd-adagrad", ALL_PROPS,
        lambda c: c.api in ("fsdp2",) + _FSDP2_RUN and c.impl == "fused"
        and c.optimizer in ("sgd", "sgd_momentum", "adagrad"),
        "2.13 (CPU)",
        "SGD and Adagrad with fused=True cannot step a fully_shard model: their params are "
        "DTensors and DTensor registers a sharding strategy only for the fused Adam/AdamW ops "
        "(torch/distributed/tensor/_ops/_pointwise_ops.py:544-552), so the first optim.step() "
        "raises 'Operator aten._fused_sgd_.default (aten._fused_adagrad_.default) does not have "
        "a sharding strategy registered' (_sharding_prop.py:1041). Nothing can be saved.",
        "not yet reported upstream (found by this suite; foreach/fused class of "
        "https://github.com/pytorch/pytorch/issues/130810)",
        model=Raises(exc="NotImplementedError",
               message=r"^Operator aten\._fused_(sgd|adagrad)_\.default does not have a sharding "
                       r"strategy registered", where=("propagate_op_sharding_non_cached",))),
    KnownLimitation(
        "rprop-cannot-step-dtensor", ALL_PROPS,
        lambda c: c.family == "fsdp2" and c.optimizer == "rprop"
        and c.strategy in ("FULL_SHARD", "SHARD_GRAD_OP") and _running_torch() < (2, 15),
        "2.13 (CPU); not 2.15",
        "torch.optim.Rprop cannot step a fully_shard model under torch 2.13: outside "
        "capturable mode it updates its step-size factors with boolean-mask assignments "
        "(sign[sign.gt(0)] = etaplus, optim/rprop.py:274-276 single-tensor, :381-383 "
        "foreach), an in-place index_put_ that DTensor refuses on a Shard(0) param: "
        "'aten.index_put_.default: in-place operations that require placement changes are not "
        "supported' (the first optim.step() raises; nothing can be saved; a DSD load raises "
        "the same in its zero-gradient step). Torch 2.15 steps it (its source lines :275, "
        ":382 are the same; what changed in DTensor is not pinned down): the full tier's 12 "
        "Rprop fully_shard cases train, save and load as single-process Rprop under 2.15.0 "
        "(2026-11-29; the one difference left is entry dsd-full-load-tuple-to-list). Its "
        "capturable branch uses torch.where instead (:270-272); not tried here.",
        model=Raises(exc="RuntimeError",
                     message=r"^aten\.index_put_\.default: in-place operations that require "
                             r"placement changes are not supported",
                     where=("_single_tensor_rprop", "_multi_tensor_rprop"))),
    KnownLimitation(
        "adafactor-cannot-step-dtensor", ALL_PROPS,
        lambda c: c.family == "fsdp2" and c.optimizer == "adafactor"
        and c.strategy in ("FULL_SHARD", "SHARD_GRAD_OP"),
        "2.13, 2.15 (CPU)",
        "torch.optim.Adafactor cannot step a fully_shard model: for a 2-D param it takes the "
        "column factor as torch.norm(grad, dim=-2, keepdim=True).square_() "
        "(optim/_adafactor.py:398-399), and the norm of a Shard(0) DTensor over its sharded "
        "dim is a _NormPartial placement that the in-place square_ (aten.pow_) would have to "
        "change: 'aten.pow_.Scalar: in-place operations that require placement changes are "
        "not supported' on every rank at the first optim.step() (nothing can be saved). "
        "Reproducer notes/repro/fsdp2_adafactor_cannot_step.py.",
        model=Raises(exc="RuntimeError",
                     message=r"^aten\.pow_\.Scalar: in-place operations that require placement "
                             r"changes are not supported",
                     where=("_single_tensor_adafactor",))),
    KnownLimitation(
        "muon-cannot-step-an-empty-row-shard", ALL_PROPS,
        lambda c: not c.golden and _muon_rank_holds_no_row(c),
        "2.13, 2.15 (CPU)",
        "torch.optim.Muon cannot step a fully_shard model where a rank holds no row of a 2-D "
        "param (FSDP2 splits rows with torch.chunk: the zoo's 2-row head.weight at 3 and 4 "
        "ranks, its 5-row block.2.weight at 4, split 2, 2, 1, 0): the update of "
        "such a Shard(0) param comes back Replicate from its bfloat16 Newton-Schulz "
        "iteration on DTensors (optim/_muon.py:55-66), and where a rank holds no row, no "
        "strategy of the in-place param.add_(update, alpha=-adjusted_lr) (:341) keeps "
        "Shard(0): 'aten.add_.Tensor: in-place operations that require placement changes "
        "are not supported' (its sharding propagation failing for a float64 Shard(0) param "
        "of shape 2x5 and a bfloat16 Replicate update) on every rank at the first "
        "optim.step() (nothing can be saved). At 2 ranks it steps. Reproducer notes/repro/fsdp2_muon_sharded.py "
        "(python ... 3).",
        model=_MUON_ADD_REFUSED),
    KnownLimitation(
        "dsd-init-steps-muon-on-an-empty-row-shard", ("P3", "P6", "P7", "P11"),
        lambda c: c.api in _DSD_RUN and _muon_rank_holds_no_row(c, load_side=True)
        and (c.golden or not _muon_rank_holds_no_row(c)),
        "2.13, 2.15 (CPU)",
        "A Muon checkpoint (saved where Muon can step: fully_shard at 1 or 2 ranks, FSDP1) "
        "cannot be loaded through DSD into a fully_shard model where a rank holds no row of a "
        "2-D param: set_optimizer_state_dict and get_optimizer_state_dict first step "
        "a fresh optimizer once with zero gradients (state_dict.py:662, "
        "_init_optim_state), and that step raises as training does (entry "
        "muon-cannot-step-an-empty-row-shard): 'aten.add_.Tensor: in-place "
        "operations that require placement changes are not supported' on every rank of the "
        "load (the properties a load decides: P3, P6, P7, P11; golden fixtures, P12, at 3 "
        "and 4 ranks).",
        also=("P12",),
        model=_MUON_ADD_REFUSED),
    KnownLimitation(
        "fsdp1-optimizer-steps-flat-shards", ("P2", "P6"),
        lambda c: c.family == "fsdp1" and _steps_whole_tensors(c) and _steps_pieces(c),
        "2.13, 2.15 (CPU)",
        "FSDP1 hands the optimizer each rank's 1-D shard of a unit's flat parameter (or, with "
        "use_orig_params, each param's 1-D piece on the rank: _flat_param.py flatten_tensors "
        ":838-893, _get_shard :1122), and Adafactor decides its state by the dimension of "
        "what it steps (optim/_adafactor.py:100-111): it keeps one unfactored 'variance' per "
        "shard instead of a 2-D param's 'row_var' and 'col_var', and scales its step by the "
        "RMS of the shard it steps (:381 the param's, :415 the update's), right padding "
        "included. So FSDP1 trains otherwise than single-process Adafactor (6e-3 apart after "
        "3 float64 steps on the zoo MLP), the saved full dict holds a param-shaped variance "
        "where a plain Adafactor holds the factors (a plain Adafactor loading it raises "
        "'row_var and col_var should be defined' at its next step: "
        "notes/repro/fsdp1_adafactor_flat_unfactored.py), and a resume at another world "
        "size steps other shards. Modelled exactly: the baseline trains one Adafactor per "
        "rank on the rank's shards (properties/shard_training.py).",
        "not reported upstream; FSDP1's docs say the optimizer sees the flat parameter",
        model=Effect(what="each rank's optimizer steps its own 1-D shards (unfactored "
                     "variance, the shard's RMS)", trains_on_shards=True)),
    KnownLimitation(
        "muon-refuses-fsdp1-shards", ALL_PROPS,
        lambda c: c.family == "fsdp1" and c.optimizer == "muon"
        and (_steps_pieces(c) or _steps_pieces(c, load_side=True)),
        "2.13",
        "torch.optim.Muon steps 2-D params only and checks it when built "
        "(optim/_muon.py:128-133: 'Muon only supports 2D parameters whereas we found a "
        "parameter with size: ...'). FSDP1 hands the optimizer 1-D tensors: a unit's flat "
        "parameter, or with use_orig_params each param's 1-D piece on the rank "
        "(_flat_param.py flatten_tensors :838-893); only unsharded original params (world "
        "size 1, NO_SHARD) keep their shape. So Muon cannot be built for a sharded FSDP1 "
        "model on any rank: the side that shards raises before its first step.",
        model=Raises(exc="ValueError", message=r"^Muon only supports 2D parameters",
                     where=("__init__",))),
    KnownLimitation(
        "fsdp1-orig-cuts-factored-state", ALL_PROPS,
        lambda c: _orig_cuts_factors(c) and not c.golden,
        "2.13",
        "An Adafactor state saved where FSDP1 keeps original params whole (world size 1, "
        "NO_SHARD) holds a 2-D param's factored second moment (row_var, col_var: not the "
        "param's shape). Loading it into sharded FSDP1 with use_orig_params cuts every "
        "positive-dim state tensor by the param's element range "
        "(_optim_utils.py:393-402 _shard_orig_param_state: value.flatten()[start:end + 1]), "
        "factors included: the first rank keeps whole factors, a rank past their length gets "
        "empty ones, and no rank gets the 'variance' Adafactor keeps for the 1-D piece it now "
        "steps, so the first resumed step raises 'variance should be defined when grad is a "
        "vector' (optim/_adafactor.py:405-406) on every rank. The reference refuses to cut "
        "such state (reference/shard.py). A stored checkpoint loaded so (golden fixtures, "
        "P12): entry fsdp1-orig-load-cuts-factored-state.",
        model=Raises(exc="AssertionError",
                     message=r"^variance should be defined when grad is a vector",
                     where=("_single_tensor_adafactor",))),
    KnownLimitation(
        "fsdp1-orig-load-cuts-factored-state", ("P12",),
        lambda c: _orig_cuts_factors(c) and bool(c.golden),
        "2.13 (CPU)",
        "The load of entry fsdp1-orig-cuts-factored-state, judged on its own: a stored "
        "Adafactor checkpoint with factored second moments (row_var, col_var; saved where "
        "FSDP1 keeps original params whole, world size 1) loaded into sharded FSDP1 with "
        "use_orig_params comes back, without an error, with each factor cut by its param's "
        "element range (_optim_utils.py:393-402, value.flatten()[start:end + 1]): the first "
        "rank keeps whole factors where it holds more elements of the param than the factor "
        "has, a rank past their length gets empty ones. So the ranks' states are not pieces "
        "of one state: the reference refuses to gather them, naming the param, the factor "
        "and the rank. Seen by `fsdp-conformance run --tier full -k \"golden and "
        "adafactor and fsdp1.sharded\"`.",
        "not reported upstream that we found",
        model=Outcome(headline=r"fixture \S+ \(saved by torch \S+ through \S+ at 1 rank\(s\)\) "
                      r"loaded through \S+ at [2-9]\d* rank\(s\): the ranks' loaded states do "
                      r"not form one state: sharded state tensor does not match the rank's "
                      r"piece of the param; at param '[^']+', key '(row_var|col_var)', rank "
                      r"\d+; expected \(\d+,\), got \(\d+,\)")),
    KnownLimitation(
        "dsd-zero-grad-step-divides-by-empty-piece", ALL_PROPS,
        lambda c: _dsd_load_on_fsdp1(c) and c.use_orig_params and c.optimizer == "adafactor"
        and _some_rank_lacks_a_param(c),
        "2.13",
        "Loading an FSDP1 model with use_orig_params through DSD (get_optimizer_state_dict / "
        "set_optimizer_state_dict on a fresh optimizer) first runs _init_optim_state "
        "(state_dict.py:629-668): it gives every param a zero gradient (:649), also the "
        "params of which this rank holds no element (a 0-element piece, whose gradient FSDP1 "
        "leaves None in training), and steps once with lr=0 (:662). Adafactor divides by the "
        "numel of what it steps (optim/_adafactor.py:381): ZeroDivisionError on every rank "
        "that lacks a piece, while the others wait in the load's collectives.",
        model=Raises(exc="ZeroDivisionError", message=r"^float division by zero",
                     where=("_single_tensor_adafactor",))),
    KnownLimitation(
        "fsdp1-unflattens-held-once-state", ALL_PROPS,
        lambda c: _fsdp1(c) and _holds_state_once(c) and not c.use_orig_params
        and not c.golden,
        "2.13, 2.15 (CPU)",
        "torch.optim.LBFGS keeps one state for all its params under the first "
        "(optim/lbfgs.py:349-352): 'd' and 'prev_flat_grad' are flat vectors over every "
        "param it holds, beside history lists and numbers. FSDP1's optimizer state dict "
        "reads the state under a flat parameter as that flat parameter's own, so with "
        "flat parameters (more than one FSDP unit) every save raises on every rank: at "
        "world size 1 unflattening 'd' by the first unit's numels raises 'split_with_sizes "
        "expects split_sizes to sum exactly to <every param's numel>' "
        "(_optim_utils.py:285 -> _flat_param.py:1901); at 2 or more ranks the all-gather of "
        "it as a shard of the first flat parameter raises 'ProcessGroupGloo::allgather: "
        "invalid tensor size' (_optim_utils.py:229; gloo checks the sizes, NCCL not tried "
        "here). Nothing can be saved. Reproducer notes/repro/lbfgs_state_held_once.py.",
        "not reported upstream that we found",
        model=Raises(exc="RuntimeError",
                     message=r"^(split_with_sizes expects split_sizes to sum exactly to"
                             r"|ProcessGroupGloo::allgather: invalid tensor size)",
                     where=("_unflatten_optim_state",))),
    KnownLimitation(
        "fsdp1-reads-held-once-state-per-param", ALL_PROPS,
        lambda c: _fsdp1(c) and _holds_state_once(c) and c.use_orig_params
        and not c.golden,
        "2.13, 2.15 (CPU)",
        "torch.optim.LBFGS keeps one state for all its params under the first "
        "(optim/lbfgs.py:349-352). FSDP1 with use_orig_params expects state under every "
        "param of a unit that has state under any: its optimizer state dict raises "
        "'<param> is not in the optimizer state. The FSDPParamInfo has the param keys [...] "
        "while the optimizer has the param keys [<the first>]' "
        "(_optim_utils.py:1804-1808, _convert_state_with_orig_params) on every rank, at "
        "every world size. Nothing can be saved. Reproducer "
        "notes/repro/lbfgs_state_held_once.py.",
        "not reported upstream that we found",
        model=Raises(exc="RuntimeError",
                     message=r"is not in the optimizer state\. The FSDPParamInfo has the "
                             r"param keys",
                     where=("_convert_state_with_orig_params",))),
    KnownLimitation(
        "lbfgs-cannot-step-dtensor", ALL_PROPS,
        lambda c: c.family == "fsdp2" and _holds_state_once(c) and c.world_size > 1,
        "2.13, 2.15 (CPU)",
        "torch.optim.LBFGS cannot step a fully_shard model whose params the mesh does not "
        "divide (every zoo model has a param of 13 rows): it flattens every gradient with "
        "p.grad.view(-1) (optim/lbfgs.py:293, _gather_flat_grad), and DTensor refuses to "
        "flatten an unevenly sharded Shard(0) tensor: 'Cannot flatten unevenly sharded "
        "tensor: dimension 0 (size 13) is not evenly divisible by mesh dimension 0' on every "
        "rank at the first optim.step() (nothing can be saved). At one rank it trains as "
        "single-process LBFGS (entry dsd-load-steps-lbfgs-without-closure for its load). "
        "Reproducer notes/repro/lbfgs_state_held_once.py.",
        "not reported upstream that we found",
        model=Raises(exc="RuntimeError",
                     message=r"^(Cannot flatten unevenly sharded tensor"
                             r"|Sharding propagation failed for aten\.view\.default)",
                     where=("_gather_flat_grad",))),
    KnownLimitation(
        "dsd-load-steps-lbfgs-without-closure", ("P3", "P6", "P7", "P11"),
        lambda c: _holds_state_once(c) and c.api in _DSD_RUN
        and (c.golden or (c.family == "fsdp2" and c.world_size == 1)),
        "2.13, 2.15 (CPU)",
        "DSD's set_optimizer_state_dict first initialises a fresh optimizer's state by "
        "stepping it once with zero gradients and optim.step(closure=None) "
        "(state_dict.py:662, _init_optim_state); torch.optim.LBFGS calls its closure "
        "(optim/lbfgs.py:357): TypeError: 'NoneType' object is not callable on every rank "
        "of the load, whatever was saved. So a resume (a fresh LBFGS, params without grads) "
        "cannot load through DSD (the properties a load decides: P3, P6, P7, P11); the save "
        "works where LBFGS can train (fully_shard at one rank: P1, P2, P8-P10 pass). Behind it: where the "
        "params still have grads, _init_optim_state returns early (:641-644) and the strict "
        "split refuses LBFGS's dict, state under the first param only: 'Missing optimizer "
        "state for parameter ... in checkpoint' (:1035-1039). Golden fixtures (P12): a "
        "stored LBFGS checkpoint (fully_shard at one rank) loads through no DSD path, "
        "FSDP1's (fsdp1.dsd_*) included, at any world size. Reproducer "
        "notes/repro/lbfgs_state_held_once.py.",
        "not reported upstream that we found",
        also=("P12",),
        model=Raises(exc="TypeError", message=r"^'NoneType' object is not callable",
                     where=("_init_optim_state",))),
    KnownLimitation(
        "fsdp1-orig-load-cuts-held-once-state", ("P12",),
        lambda c: _fsdp1(c) and c.golden and _holds_state_once(c) and c.use_orig_params
        and c.api not in _DSD_RUN and c.api != "fsdp1.legacy_scatter"
        and _steps_pieces(c, load_side=True),
        "2.13, 2.15 (CPU)",
        "FSDP1's load with use_orig_params cuts every positive-dim state tensor of a param "
        "by that param's element range on the rank (_optim_utils.py:393-402, "
        "_shard_orig_param_state: value.flatten()[start:end + 1]), whatever its shape. "
        "LBFGS holds its state once, under its first param (optim/lbfgs.py:349-352): 'd' "
        "and 'prev_flat_grad' are vectors over every param (330 elements on the zoo MLP), "
        "so a stored LBFGS checkpoint (fully_shard at one rank; no FSDP1 path can save "
        "LBFGS) loaded into sharded FSDP1 comes back, without an error, with each vector cut "
        "to its first param's elements (91 of 330) in that param's shape; the history lists "
        "and numbers are kept. Unsharded (one rank) it loads whole. Golden fixtures only "
        "(P12): the DSD paths raise first (dsd-load-steps-lbfgs-without-closure), "
        "scatter_full_optim_state_dict raises (fsdp1-scatter-moves-numbers-to-cpu). Seen "
        "by `fsdp-conformance run --tier full -k \"golden and lbfgs\"`.",
        "not reported upstream that we found",
        model=Effect(what="LBFGS's vectors over every param ('d', 'prev_flat_grad') cut to "
                     "the first param's elements, in its shape",
                     load=held_once_vectors_cut_to_their_param)),
    KnownLimitation(
        "fsdp1-scatter-moves-numbers-to-cpu", ("P12",),
        lambda c: c.api == "fsdp1.legacy_scatter" and _holds_state_once(c),
        "2.13, 2.15 (CPU)",
        "scatter_full_optim_state_dict (rank0_only) moves every state value rank 0 was given "
        "back to the CPU with param_state.cpu() (_optim_utils.py:533, "
        "_flatten_optim_state_dict), so state that is not all tensors cannot be scattered: "
        "LBFGS's state holds Python numbers and history lists beside its tensors "
        "(optim/lbfgs.py:349-352, 'func_evals', 'n_iter', 'old_dirs', ...): "
        "AttributeError: '<type>' object has no attribute 'cpu' on rank 0 while the other "
        "ranks wait in the scatter. Golden fixtures only (P12: no FSDP1 path can save "
        "LBFGS): a stored LBFGS checkpoint at any world size. Seen by `fsdp-conformance run "
        "--tier full -k \"golden and lbfgs and legacy_scatter\"`.",
        "not reported upstream that we found",
        model=Raises(exc="AttributeError",
                     message=r"^'(int|float|list|NoneType)' object has no attribute 'cpu'",
                     where=("_flatten_optim_state_dict",))),
    KnownLimitation(
        "dsd-get-optim-dummy-step", ("P1", "P2", "P10"),
        lambda c: c.api in _DSD_RUN and c.steps == 0 and c.optimizer in _LAZY_STATE,
        "2.13",
        "get_optimizer_state_dict changes the optimizer it saves: before the first step it "
        "runs _init_optim_state (state_dict.py:916 -> :629-668), a step with zero grads and "
        "lr=0, so an optimizer with no state yet gets state for every trainable param (Adam: "
        "step=1, zero moments) and the checkpoint holds it. The saved dict is not the "
        "optimizer's state before the save (P1), not the single-process run's (P2: no state "
        "there, P10), the load restores step=1 (P3 against the rank's own state) and the "
        "resumed run takes bias correction of step 3 where uninterrupted training takes step "
        "2 (P6).",
        "not yet reported upstream (dummy-step class: "
        "https://github.com/pytorch/pytorch/issues/125708, #133415)",
        also=("P3", "P6"),
        model=Effect(what="every trainable param without state gets the state of one step with a zero "
                     "gradient and lr=0 (step=1, zero moments)", save=dummy_step_state)),
    KnownLimitation(
        "dsd-broadcast-rank0-error-strands-others", ("P15",),
        lambda c: _rank0_broadcasts(c) and c.fault in ("missing_fqn", "mixed_keys", "wrong_model"),
        "2.13",
        "set_optimizer_state_dict(full_state_dict=True, broadcast_from_rank0=True) checks the "
        "dict on rank 0 only (the other ranks pass {}): when rank 0 rejects it ('Missing "
        "optimizer state for parameter', state_dict.py:1037 in _split_optim_state_dict, "
        "called at :1096 before any broadcast), the other ranks are already waiting in the "
        "broadcast and stay there until the process-group timeout (a hang on a real job; "
        "docs/design.md bug class 9). On fully_shard (fsdp2.full) they wait in "
        "_broadcast_state_dict's broadcast_object_list (_state_dict_utils.py:662, called at "
        "state_dict.py:1161); on an FSDP1 model (fsdp1.dsd_full_broadcast) DSD turns "
        "broadcast_from_rank0 into FSDP1's rank0_only load (state_dict.py:350) and they wait in "
        "_broadcast_processed_state's broadcast_object_list (_optim_utils.py:338, from "
        "FSDP.optim_state_dict_to_load at state_dict.py:1134; the stranded rank's stack in the "
        "unused-model case shows it). For 'wrong_model' the error names this model's first "
        "param, not the foreign dict.",
        model=Outcome(headline=r".*: rank\(s\) \[0\] raised but rank\(s\) \[[\d, ]+\] were left waiting "
                          r"in a collective:",
                 raises=(Raises(exc="RuntimeError",
                               message=r"^Missing optimizer state for parameter '[\w.]+' in checkpoint"),))),
    KnownLimitation(
        "dsd-full-load-wrong-model-names-own-param", ("P15",),
        lambda c: _dsd_full_load(c) and not _rank0_broadcasts(c) and c.fault == "wrong_model",
        "2.13",
        "set_optimizer_state_dict(full_state_dict=True) with another model's full dict raises "
        "on every rank 'Missing optimizer state for parameter <this model's first param>' "
        "(_split_optim_state_dict, state_dict.py:1037): it names a param the dict lacks, not "
        "the foreign keys the dict has (conv1.weight), so the user is not told that the file "
        "is another model's. (The paths that broadcast from rank 0 raise the same on rank 0 and "
        "strand the others: dsd-broadcast-rank0-error-strands-others.)",
        model=Outcome(headline=r".*: every rank raised, but the error does not name '[\w.]+':",
                      raises=(Raises(exc="RuntimeError",
                                     message=r"^Missing optimizer state for parameter "
                                             r"'[\w.]+' in checkpoint"),))),
    KnownLimitation(
        "dsd-full-load-ignores-unknown-fqn", ("P15",),
        lambda c: _dsd_full_load(c) and c.fault == "extra_fqn",
        "2.13",
        "A full optimizer dict with state and a param-group entry for a param the model does "
        "not have loads without a word: _split_optim_state_dict walks the optimizer's own "
        "params only (state_dict.py:1011-1045), so unknown FQNs are dropped silently, even with "
        "strict=True.",
        model=Outcome(headline=SILENT)),
    KnownLimitation(
        "dsd-full-load-casts-dtype", ("P15",),
        lambda c: c.api == "fsdp2.full" and c.fault == "dtype",
        "2.13",
        "A state tensor of another dtype (float16 in a float64 model) loads silently: "
        "_distribute_tensors copies the broadcast tensor into the local shard with copy_ "
        "(_state_dict_utils.py:636), which casts, so the resumed state is rounded to float16 "
        "with no error or warning.",
        model=Outcome(headline=SILENT)),
    KnownLimitation(
        "dsd-shape-error-unnamed", ("P15",),
        lambda c: c.api == "fsdp2.full" and c.fault == "shape",
        "2.13",
        "A state tensor of the wrong shape is rejected on every rank with 'The size of tensor a "
        "(7) must match the size of tensor b (45) at non-singleton dimension 1', raised by "
        "copy_ in _distribute_tensors (_state_dict_utils.py:636): it names neither the param "
        "nor the state key.",
        model=Outcome(headline=UNNAMED,
                 raises=(Raises(exc="RuntimeError", message=r"^The size of tensor a \(\d+\) must "
                               r"match the size of tensor b \(\d+\) at non-singleton dimension"),))),
    KnownLimitation(
        "dcp-template-dummy-state-missing-key", ("P3",),
        lambda c: c.api in ("fsdp2.sharded", "fsdp1.dsd_sharded")
        and _touches(c, "param_without_grad") and c.steps > 0 and c.optimizer in _LAZY_STATE,
        "2.13",
        "The documented DCP resume recipe fails when a trainable param had no optimizer state "
        "at the save (it never got a gradient): the template get_optimizer_state_dict builds "
        "for the fresh optimizer holds state for every trainable param (_init_optim_state's "
        "zero-grad step, state_dict.py:1093 -> :629-668), and dcp.load refuses a template key "
        "the checkpoint lacks ('Missing key in checkpoint state_dict: "
        "optim.state.unused.weight.step', default_planner.py:495). DefaultLoadPlanner("
        "allow_partial_load=True) loads it, but leaves the dummy step=1 state "
        "(dsd-nonstrict-dummy-state).",
        "not yet reported upstream (partial-state class of "
        "https://github.com/pytorch/pytorch/issues/132628)",
        also=("P4", "P6", "P7", "P11"),
        model=Raises(exc="RuntimeError",
               message=r"^Missing key in checkpoint state_dict: ([\w.]+\.)?state\.[\w.]+\.",
               where=("create_local_plan", "create_default_local_load_plan"),
               alongside=("CheckpointException",))),
    KnownLimitation(
        "dcp-drops-empty-state-dict", ("P8",),
        lambda c: (c.api in ("fsdp2.sharded", "fsdp1.dsd_sharded") and c.optimizer == "sgd"
                   and not c.flatten_optimizer_state_dict)  # flattened: no mapping at all
        or (c.api == "fsdp1.sharded" and (c.steps == 0 or c.optimizer == "sgd")),
        "2.13",
        "A stateless optimizer's dict saved with DCP does not read back whole: DCP records "
        "leaves only and an empty mapping has none (_traverse.py:57-60), so the 'state': {} "
        "entry is gone (dcp_to_torch_save gives a dict without 'state'). Loading through "
        "set_optimizer_state_dict still works here, since the template has no state either "
        "(FSDP1's optim_state_dict_to_load raises: dcp-drops-empty-optimizer-state). The same "
        "loss shows in fsdp1.sharded's P8 (an optimizer with no state yet, or SGD).",
        model=Effect(what="DCP reads back no mapping without leaves: the empty 'state': {} "
                     "is gone",
               stored=drop_empty_mappings)),
    KnownLimitation(
        "dcp-dedups-unsynchronised-ignored-state", (),
        lambda c: c.api in ("fsdp2.sharded", "fsdp1.dsd_sharded") and _has_ignored(c)
        and c.world_size > 1,
        "2.13",
        "Optimizer state of params FSDP2 ignores (plain tensors that every rank trains on its "
        "own rows, so the ranks' values differ) is written once by DCP, from whichever rank "
        "the save planner picks: dedup_save_plans keeps one copy of a key every rank writes, "
        "choosing the rank with the least data planned so far, not rank 0 "
        "(_dedup_save_plans.py:42-55). The checkpoint then holds another rank's state than "
        "rank 0's full dict, every rank resumes from that copy, and a re-save differs. Which "
        "rank is chosen depends on the sizes, so this entry has no primary property.",
        also=("P3", "P7", "P8"),
        model=Effect(what="the ignored params' state (and, where a user's load restores "
                     "them, their weights) read back and loaded on every rank is the state of "
                     "the rank whose DCP file holds it (__<rank>_<n>.distcp, from the "
                     "checkpoint's metadata), not rank 0's",
                     stored=ignored_state_of_dcp_writer, load=ignored_state_of_dcp_writer,
                     weights=ignored_weights_of_dcp_writer)),
    KnownLimitation(
        "dsd-sharded-load-drops-frozen-state", ("P3",),
        lambda c: (_dsd_sharded_load_on_fsdp2(c) or _dsd_load_on_fsdp1(c))
        and c.optimizer != "sgd" and (
            _touches(c, "frozen_at_save")
            or (_touches(c, "frozen_from_start") and c.optimizer == "adagrad")),
        "2.13",
        "set_optimizer_state_dict keeps the loaded state of a param only if it requires grad "
        "(_split_optim_state_dict, state_dict.py:1032), so the saved state of frozen params is "
        "silently dropped on load: after a sharded load they have no state at all, a re-save "
        "differs, and the resumed optimizer differs from uninterrupted training. Seen on a "
        "param frozen from the start with Adagrad (which creates {'step': 0, 'sum': 0} at "
        "construction, and DSD saves it) and on a param trained and then frozen before the "
        "save (zoo `late_frozen`: SGD momentum, Adam, Adagrad lose `step` 2 and the trained "
        "state). DSD on an FSDP1 model (fsdp1.dsd_full, fsdp1.dsd_full_broadcast, "
        "fsdp1.dsd_sharded) splits the loaded "
        "dict the same way before FSDP.optim_state_dict_to_load (state_dict.py:1094-1097), so "
        "its loads drop the frozen params' state too (a whole FlatParameter's without "
        "use_orig_params). Unfreezing such a param later raises nothing: the optimizer creates the "
        "missing state in its step (adagrad.py:158, `if len(state) == 0`), from zero, so "
        "Adam restarts at step 1 (notes/repro/dsd_frozen_state_dropped.py).",
        "https://github.com/pytorch/pytorch/issues/192202 (open; fix proposed in "
        "https://github.com/pytorch/pytorch/pull/192307)",
        also=("P6", "P7", "P10"),
        model=Effect(what="the state of params that do not require grad is dropped by the load",
               load=drop_frozen_state)),
    KnownLimitation(
        "dsd-dropped-frozen-state-breaks-next-dcp-load", ("P3",),
        lambda c: c.links > 1 and c.api in ("fsdp2.sharded", "fsdp1.dsd_sharded")
        and _touches(c, "frozen_from_start") and c.optimizer == "adagrad",
        "2.13 (the full tier's chains of the frozen model with Adagrad)",
        "What dsd-sharded-load-drops-frozen-state leaves breaks the next resume: after one "
        "DCP load the params frozen from the start have no optimizer state, so the next "
        "checkpoint (saved after resuming) has none for them, while a fresh Adagrad makes "
        "{'step': 0, 'sum': 0} for every param at construction and DSD's template for the "
        "next load holds it: dcp.load refuses the template key the checkpoint lacks ('Missing "
        "key in checkpoint state_dict: optim.state.inp.weight.step', default_planner.py:495). "
        "A trainer with frozen params and an optimizer that makes state eagerly cannot load its "
        "second checkpoint after a resume through DCP (found by the chains of checkpoints, "
        "Case.links). Reproducer: notes/repro/dsd_frozen_state_next_dcp_load.py.",
        "https://github.com/pytorch/pytorch/issues/192202 (the dropped state: open; fix "
        "proposed in https://github.com/pytorch/pytorch/pull/192307)",
        also=("P6", "P7", "P11"),  # P7: a user's load -> save -> load meets it at once
        model=Raises(exc="RuntimeError",
               message=r"^Missing key in checkpoint state_dict: ([\w.]+\.)?state\.[\w.]+\.",
               where=("create_local_plan", "create_default_local_load_plan"),
               alongside=("CheckpointException",))),
    KnownLimitation(
        "dsd-full-load-resets-frozen-state", ("P3",),
        lambda c: c.api == "fsdp2.full" and c.model == "late_frozen" and c.optimizer != "sgd",
        "2.13",
        "The full path (set_optimizer_state_dict(full_state_dict=True, broadcast_from_rank0="
        "True)) drops the loaded state of params that do not require grad in the same "
        "_split_optim_state_dict (state_dict.py:1032), then fills the optimizer from its own "
        "local template (_load_optim_state_dict, state_dict.py:1139-1177: the local template broadcast into), so a frozen param "
        "keeps what the fresh optimizer holds: nothing for SGD momentum and Adam, Adagrad's "
        "construction-time {'step': 0, 'sum': 0}. Seen on a param trained and then frozen "
        "before the save (zoo `late_frozen`); a saved Adagrad sum of 7.0 loads as 0.0 "
        "(notes/repro/dsd_full_load_drops_frozen_state.py), Adam's state is {} and restarts "
        "at step 1 after unfreezing (notes/repro/dsd_frozen_state_dropped.py). For a param "
        "frozen from the start the fresh state equals the saved one, so nothing shows there.",
        "https://github.com/pytorch/pytorch/issues/192202 (the same _split_optim_state_dict "
        "rule; open)",
        also=("P6", "P7"),
        model=Effect(what="the state of params that do not require grad is the fresh "
                          "optimizer's after the load",
               load=frozen_state_as_fresh)),
    KnownLimitation(
        "dcp-corrupt-tensor-unicode-error", ("P15",),
        lambda c: c.api == "fsdp2.sharded" and c.fault == "corrupt_file",
        "2.13",
        "Flipped bytes in a DCP data file surface as 'UnicodeDecodeError: 'utf-8' codec can't "
        "decode byte ...' from the weights-only unpickler (_weights_only_unpickler.py:232) that "
        "FileSystemReader runs on each stored tensor (filesystem.py:899): it names neither the "
        "file nor the damage, and DCP files carry no checksum to say so.",
        model=Outcome(headline=NAMES_NEITHER,
                 raises=(Raises(exc="UnicodeDecodeError", message=r"^'utf-8' codec can't decode byte"),))),
    # --- found by the conformance run (FSDP1 paths, sut/fsdp1_paths/) ------------------------
    # --- files written by a newer torch, loaded by this one (golden fixtures, P12) ---------
    KnownLimitation(
        "dcp-metadata-strides-unreadable-by-older-torch", ("P12",),
        lambda c: c.api == "fsdp1.sharded" and _fixture_from(c, "2.15.0"),
        "2.13 reading 2.15 files", _STRIDES + " fsdp1.sharded: load_sharded_optimizer_state_dict "
        "-> FileSystemReader.read_metadata -> pickle.load raises in TensorProperties.__setstate__.",
        _STRIDES_UPSTREAM,
        model=Raises(exc="ValueError", message=r"^too many values to unpack \(expected 5\)$",
                     where=("__setstate__",))),
    KnownLimitation(
        "dcp-load-strides-unreadable-by-older-torch", ("P12",),
        lambda c: c.api in ("fsdp2.sharded", "fsdp1.dsd_sharded") and _fixture_from(c, "2.15.0"),
        "2.13 reading 2.15 files", _STRIDES + " fsdp2.sharded: dcp.load's local_step reports it "
        "as 'global metadata read failed' (state_dict_loader.py:265), wrapped in a "
        "CheckpointException.",
        _STRIDES_UPSTREAM,
        model=Raises(exc="AssertionError",
                     message=r"^metadata is None; global metadata read failed: too many values "
                             r"to unpack \(expected 5\)",
                     alongside=("CheckpointException",))),
    KnownLimitation(
        "dcp-load-strides-unreadable-by-older-torch-2.8", ("P12",),
        lambda c: c.api == "fsdp2.sharded" and _fixture_from(c, "2.15.0"),
        "2.8 reading 2.15 files", _STRIDES + " fsdp2.sharded in torch 2.8: dcp.load raises the "
        "ValueError itself, wrapped in a CheckpointException (2.13 reports it as an "
        "AssertionError, the entry above).",
        _STRIDES_UPSTREAM,
        model=Raises(exc="ValueError", message=r"^too many values to unpack \(expected 5\)$",
                     where=("__setstate__",), alongside=("CheckpointException",))),
    KnownLimitation(
        "sharded-tensor-strides-unreadable-by-older-torch", ("P12",),
        lambda c: _rank_files_with_tensor_state(c) and _fixture_from(c, "2.15.0"),
        "2.13 reading 2.15 files", _STRIDES + " fsdp1.legacy_sharded: torch.load(weights_only="
        "False) of a per-rank file raises in ShardedTensor's TensorProperties.__setstate__ "
        "(after the weights-only attempt refused ShardedTensor, sharded-tensor-not-weights-only).",
        _STRIDES_UPSTREAM,
        model=Raises(exc="ValueError", message=r"^too many values to unpack \(expected 5\)$",
                     where=("__setstate__",), alongside=("UnpicklingError",))),
    KnownLimitation(
        "sharded-tensor-not-weights-only", ("P8",), _rank_files_with_tensor_state,
        "2.13",
        "sharded_optim_state_dict returns ShardedTensor values (for tensor state of a sharded "
        "unit); a per-rank torch.save of it "
        "cannot be read with torch.load(weights_only=True), the default since torch 2.6 "
        "(ShardedTensor is not on the weights-only allowlist). DCP is the supported format.",
        model=Raises(exc="UnpicklingError", message=r"^Weights only load failed")),
    KnownLimitation(
        "sharded-tensor-unpickle-hybrid", ALL_PROPS,
        lambda c: c.api == "fsdp1.legacy_sharded" and c.strategy == "HYBRID_SHARD",
        "2.13",
        "Per-rank files of sharded_optim_state_dict under HYBRID_SHARD cannot be loaded at all: "
        "unpickling a ShardedTensor compares its shard group with the default group and "
        "raises 'Local world size at save time was 2, but at load time was 4'.",
        model=Raises(exc="RuntimeError",
               message=r"^Local (rank|world size) at save time was \d+, but at load time was \d+$",
               where=("__setstate__",), alongside=("UnpicklingError",))),
    KnownLimitation(
        "dcp-zero-local-shard-falls-back-to-old-keys", ("P3", "P12"),
        lambda c: c.api == "fsdp1.dsd_sharded" and c.optimizer != "sgd"
        and _some_rank_gets_no_chunk(c),
        "2.13",
        "FSDP1's sharded optimizer state (what get_optimizer_state_dict returns for an FSDP1 "
        "model) is one ShardedTensor per state, chunked along dim 0 over the world size "
        "(_shard_utils.py:41-48): a rank past the last of torch.chunk's pieces holds no local "
        "shard. The DCP load planner drops such a ShardedTensor from the rank's keys "
        "(_sharded_tensor_utils.py:38-39), counts its keys as missing, and switches the rank "
        "to the pre-2.4 flattening (default_planner.py:357-370), in which the whole "
        "param_groups list is one key 'optim.param_groups' that the checkpoint does not have: "
        "in dcp.load of the documented template each such rank raises 'Missing key in "
        "checkpoint state_dict: optim.param_groups.' (:495) while planning, and every rank "
        "raises CheckpointException holding it. The trigger is torch.chunk(dim 0, load world "
        "size) giving fewer pieces than ranks, not dim 0 < world size: at 4 ranks 5 rows "
        "(2+2+1) and 6 rows (2+2+2) fail, 7 rows (2+2+2+1) load. It is not a resharding bug: "
        "2 rows saved and loaded at 3 ranks fail, and the save's world size does not matter "
        "(6 rows saved at 2 ranks load at 3 and fail at 4); use_orig_params True and False "
        "alike. In the zoo, mlp's head has 2 rows, so 3 and 4 ranks fail, 1 and 2 load; the "
        "bounds model's last layer has 3 rows, so its P13/P14 case at 4 ranks has no load to "
        "time. Minimal reproducer: notes/repro/dsd_fsdp1_zero_local_shards.py.",
        "https://github.com/pytorch/pytorch/pull/163480 (describes this failure; closed) and "
        "https://github.com/pytorch/pytorch/issues/137327 (the 2.3/2.4 key formats)",
        also=("P4", "P6", "P7", "P10", "P11", "P13", "P14", "P16"),
        model=Raises(exc="RuntimeError",
                     message=r"^Missing key in checkpoint state_dict: optim\.param_groups\.$",
                     where=("create_default_local_load_plan",),
                     alongside=("CheckpointException",))),
    KnownLimitation(
        "dcp-drops-empty-optimizer-state", ("P3",),
        lambda c: c.api == "fsdp1.sharded" and (c.steps == 0 or c.optimizer == "sgd"),
        "2.13",
        "An optimizer with no state (before its first step, or stateless SGD) saved through optim_state_dict "
        "SHARDED + DCP does not load: DCP stores no entry for the empty 'state' dict, so "
        "load_sharded_optimizer_state_dict returns a dict without 'state' and "
        "optim_state_dict_to_load raises '`optim_state_dict` must have the keys \"state\"' "
        "(_optim_utils.py:443). Golden fixtures (P12): a stored SGD DCP checkpoint (written "
        "by fsdp1.sharded or fsdp2.sharded) does not load through fsdp1.sharded at any world "
        "size 1-4 (same error); fsdp2.sharded loads both.",
        also=("P4", "P6", "P7", "P10", "P11", "P12"),
        model=Raises(exc="ValueError", message=r'^`optim_state_dict` must have the keys "state"',
               where=("_flatten_optim_state_dict",))),
    KnownLimitation(
        "sharded-ignored-module-state-stays-sharded", ALL_PROPS,
        lambda c: c.api == "fsdp1.sharded" and c.model == "buffers",
        "2.13",
        "optim_state_dict SHARDED + DCP + optim_state_dict_to_load leaves the optimizer state "
        "of params in ignored modules as ShardedTensor objects; the next optimizer step raises "
        "in its first in-place op on that state ('torch function lerp_ / mul_ / addcmul_, with "
        "args: (ShardedTensor(...' for Adam / SGD with momentum / Adagrad). Ignored-modules "
        "class of pytorch#112515.",
        "https://github.com/pytorch/pytorch/issues/112515 (ignored-modules class)",
        model=Raises(exc="RuntimeError",
               message=r"^torch function '(lerp_|mul_|addcmul_|add_)', with args: \(ShardedTensor\(")),
    KnownLimitation(
        "orig-params-unused-param-zero-grad-state", ("P2",),
        lambda c: _fsdp1(c) and c.model == "unused" and c.plan == "root"
        and (c.world_size > 1 or not c.use_orig_params),
        "2.13",
        "A param that never gets a gradient but shares a FlatParameter with params that do "
        "gets optimizer state: with use_orig_params=False the optimizer only sees the "
        "FlatParameter, with True the param gets a zero gradient view; either way the "
        "optimizer creates state for it (and weight decay / momentum act on it); a non-FSDP model has "
        "no state for it (params-without-grads class, docs/design.md bug class 3).",
        also=("P6", "P10"),
        model=Effect(what="the never-used params train on zero gradients wherever they share a "
                     "FlatParameter with used params (the optimizer creates and steps their "
                     "state)",
               zero_grads=unused_params_get_zero_grads)),
    KnownLimitation(
        "unused-param-zero-grad-state-after-load", ("P6",),
        lambda c: _fsdp1(c) and c.model == "unused" and c.plan != "root" and c.dst_plan == "root"
        and c.optimizer in _LAZY_STATE and (c.dst_world_size > 1 or not c.use_orig_params),
        "2.13",
        "The load-side form of orig-params-unused-param-zero-grad-state: saved with the unused "
        "param in its own unit (no state), loaded where it shares a FlatParameter with used "
        "params, the first step after resuming creates state for it (a zero gradient), which "
        "uninterrupted non-FSDP training never has.",
        model=Effect(what="the never-used params train on zero gradients after the load, where "
                     "they share a FlatParameter with used params",
               zero_grads=unused_params_get_zero_grads)),
    KnownLimitation(
        "orig-params-unused-param-resave-raises", ("P7",),
        lambda c: c.use_orig_params and c.model == "unused" and c.dst_plan == "root"
        and c.plan != "root" and c.api in _FULL_GATHER_APIS + ("fsdp1.sharded",),
        "2.13",
        "A full or sharded dict without state for an unused param (as saved when that param "
        "had its own unit) loads into a model where the param shares a FlatParameter with "
        "used params, and then saving the optimizer raises 'unused.weight is not in the "
        "optimizer state' (_optim_utils.py:1804): pytorch#110540 exempted frozen params from "
        "this check, not params that simply have no state yet.",
        "https://github.com/pytorch/pytorch/pull/110540 (frozen params only)",
        also=("P4", "P6", "P10"),
        model=Raises(exc="RuntimeError", message=r"^unused\.weight is not in the optimizer state",
               where=("_convert_state_with_orig_params",))),
    KnownLimitation(
        "torch-load-skips-crc", ("P15",),
        lambda c: c.fault == "corrupt_file" and (
            c.api in _FULL_GATHER_APIS + ("fsdp2.full",) or _reads_own_dtensor_file(c)),
        "2.13",
        "torch.save writes a CRC32 per record but torch.load does not check it (built with "
        "MINIZ_DISABLE_ZIP_READER_CRC32_CHECKS), so flipped bytes inside tensor data load "
        "silently as wrong values (a full file, and a rank's own file of DTensor shards, "
        "where the fault's bytes land in tensor data too).",
        "https://github.com/pytorch/pytorch/issues/126952",
        model=Outcome(headline=SILENT)),
    KnownLimitation(
        "torch-load-truncated-oserror", ("P15",),
        lambda c: c.fault == "truncated_file" and _every_rank_reads_full_file(c),
        "2.13",
        "torch.load of a truncated file raises 'OSError: [Errno 22] Invalid argument', which "
        "names neither the file nor the problem (DCP's reader says 'archive is corrupted').",
        model=Outcome(headline=NAMES_NEITHER,
                 raises=(Raises(exc="OSError", message=r"^\[Errno 22\] Invalid argument$"),))),
    KnownLimitation(
        "fsdp1-missing-param-loads-silently", ("P15",),
        lambda c: c.fault == "missing_fqn" and c.api in ("fsdp1.full", "fsdp1.legacy_full"),
        "2.13",
        "A full optimizer dict that lacks a param (no state, absent from every param group) "
        "loads without a word: the param silently restarts with no optimizer state.",
        model=Outcome(headline=SILENT)),
    KnownLimitation(
        "fsdp1-shape-error-unnamed", ("P15",),
        lambda c: c.fault in ("shape", "wrong_model") and c.api in _FULL_GATHER_APIS,
        "2.13",
        "A state tensor of the wrong shape (or another model's checkpoint) is rejected with "
        "'Tensor optimizer state does not have same shape as its parameter: torch.Size([9]) "
        "torch.Size([2, 5])', which names neither the param nor the state key "
        "(_optim_utils.py:753).",
        model=Outcome(headline=UNNAMED,
                 raises=(Raises(exc="ValueError", message=r"^Tensor optimizer state does not have "
                               r"same shape as its parameter: torch\.Size\(\[[\d, ]*\]\) "
                               r"torch\.Size\(\[[\d, ]*\]\)$"),))),
    KnownLimitation(
        "fsdp1-mixed-keys-attributeerror", ("P15",),
        lambda c: c.fault == "mixed_keys" and c.api in _FULL_GATHER_APIS
        and not _dsd_full_load(c),  # DSD names the mixed keys (or rank 0 strands the others)
        "2.13",
        "A full dict keyed by FQNs with one int key fails with an internal "
        "\"AttributeError: 'int' object has no attribute 'unflat_param_names'\" instead of "
        "saying that the keys mix names and ids.",
        model=Outcome(headline=UNNAMED,
                 raises=(Raises(exc="AttributeError",
                               message=r"^'int' object has no attribute 'unflat_param_names'$"),))),
    KnownLimitation(
        "per-rank-file-error-others-load", ("P15",),
        lambda c: c.fault == "truncated_file" and _reads_own_dtensor_file(c),
        "2.13",
        "With one torch.save'd file per rank holding the rank's DTensor shards, and a load "
        "without collectives (set_optimizer_state_dict(full_state_dict=False) of the dict the "
        "rank read), a damaged file fails on its own rank only, with 'OSError: [Errno 22] "
        "Invalid argument' from the zip reader (torch._C.PyTorchFileReader, "
        "serialization.py:807), which names neither the file nor the damage; the other ranks "
        "load their intact files and go on. Nothing checks the checkpoint as a whole, so the "
        "job is left half-loaded (DCP's directory is checked as one: its reader says "
        "'archive is corrupted').",
        # the rank that raised is the one whose file is damaged, and no other
        model=Outcome(headline=r".* in optim_rank(\d+)\.pt: rank\(s\) \[\1\] raised but "
                      r"rank\(s\) \[[\d, ]+\] loaded silently:",
                 raises=(Raises(exc="OSError", message=r"^\[Errno 22\] Invalid argument$"),))),
    KnownLimitation(
        "scatter-missing-param-typeerror", ("P15",),
        lambda c: c.fault == "missing_fqn" and _rank0_scatters(c),
        "2.13",
        "scatter_full_optim_state_dict with a param missing from the full dict fails on the "
        "other ranks with an internal \"TypeError: _PosDimTensorInfo.__new__() missing 1 "
        "required positional argument: 'dtype'\".",
        model=Outcome(headline=r".*: rank\(s\) \[[\d, ]+\] raised but rank\(s\) \[0\] loaded silently:",
                 raises=(Raises(exc="TypeError", message=r"^_PosDimTensorInfo\.__new__\(\) missing 1 "
                               r"required positional argument: 'dtype'$"),))),
    KnownLimitation(
        "dcp-sharded-optim-load-ignores-hybrid-groups", ("P3",),
        lambda c: c.api == "fsdp1.sharded" and c.strategy == "HYBRID_SHARD",
        "2.13",
        "load_sharded_optimizer_state_dict takes no process group (FSDP1's sharded model state "
        "gives it none) and chunks every unflattened state T along dim 0 over the *global* "
        "world: rank g holds torch.chunk(T, 4)[g] or nothing (torch/distributed/checkpoint/"
        "optimizer.py:309-316, fsdp/_shard_utils.py:41-45). optim_state_dict_to_load then "
        "all-gathers that ShardedTensor over the HYBRID_SHARD *shard* group "
        "(fsdp/_optim_utils.py:603-607 -> _state_dict_utils.py:32-67), each member's 4-way "
        "chunk flattened and zero-padded to the 2-way chunk size ceil(R/2)*n//R, so shard "
        "group {a, b} rebuilds T' = [chunk_a | zeros | chunk_b | zeros][:n] and keeps its "
        "2-way shard of that: rows at the wrong offsets, zeros in the gaps, and group {2, 3} "
        "never sees the first half of T (checked bitwise on all 4 ranks: "
        "notes/repro/fsdp1_hsdp_dcp_load_chunks.py). The loaded state is wrong (P3); the two "
        "replicas hold different states T', so each shard group's re-save is its own T' (P7), "
        "and the resumed run trains two replicas that step from different states on the "
        "mean gradient of all 4 ranks (P6).",
        "https://github.com/pytorch/pytorch/pull/111096 (introduced the global rank/world "
        "size there)",
        also=("P6", "P7"),
        model=Effect(what="each state T of positive dimension := the T' the rank's shard "
                          "group rebuilds from torch.chunk(T, 4) (chunks of its members, "
                          "each zero-padded to the 2-way chunk size), sharded in the group; "
                          "the replicas resume from their own T'",
                     shards_from=hybrid_rows_chunked_globally)),
    KnownLimitation(
        "orig-params-full-osd-aliasing-load-side", (),
        lambda c: c.use_orig_params and c.world_size == 1 and c.dst_world_size > 1
        and c.api in _FULL_GATHER_APIS and c.optimizer in _TWO_TENSOR_STATES
        and c.strategy == "FULL_SHARD",
        "2.13 (CPU)",
        "The orig-params-full-osd-aliasing bug on the load side: saved at world size 1 (not "
        "affected), loaded at >1 ranks, the dict saved again right after loading comes back "
        "with exp_avg holding exp_avg_sq (P7).",
        also=("P7",),
        model=Effect(what="the dict saved right after the load: every positive-dim tensor state of "
                     "a param holds the values of its last one",
               save=alias_to_last_state)),
    KnownLimitation(
        "rekey-empty-state-is-a-noop", ("P5",),
        lambda c: c.api == "fsdp1.rekey" and (c.steps == 0 or c.optimizer == "sgd"),
        "2.13",
        "rekey_optim_state_dict decides the current key type from the keys of 'state'; with "
        "no state (stateless SGD, or before the first step) all([]) is true for both types, so "
        "it returns the dict unchanged (fully_sharded_data_parallel.py:1733-1741): a PARAM_ID "
        "dict that still lists FQN strings in its param_groups.",
        model=Effect(what="a dict without state is returned unchanged: its param groups "
                     "still list FQNs where the PARAM_ID dict has ids",
               rekeyed=stateless_rekey_is_a_noop)),
    KnownLimitation(
        "per-rank-file-error-strands-others", ("P15",),
        lambda c: c.fault in ("truncated_file", "corrupt_file") and c.api == "fsdp1.legacy_sharded",
        "2.13",
        "With per-rank files, the rank whose file is damaged raises in torch.load while the "
        "others enter flatten_sharded_optim_state_dict's collectives and wait for it until the "
        "process-group timeout (a hang on a real job; docs/design.md bug class 9). What the "
        "damaged rank raises depends on where the fault's bytes land in the file: with the "
        "same 64 bytes flipped, torch 2.13.0 raises 'pickle stream refers to out-of-band "
        "data', torch 2.15.0 'pickle data was truncated' (every run, both seen in the gate); "
        "the model takes them as one observation (interchangeable), so an upgrade that "
        "moves the bytes does not change the entry's digest.",
        model=Outcome(headline=STRANDED, interchangeable=True,
                 raises=(Raises(exc="OSError", message=r"^\[Errno 22\] Invalid argument$",
                               alongside=("UnpicklingError",)),
                         Raises(exc="UnpicklingError", message=r"^pickle stream refers to "
                                r"out-of-band data but no \*buffers\* argument was given$"),
                         Raises(exc="UnpicklingError", message=r"^pickle data was truncated$")))),
    KnownLimitation(
        "dsd-full-flattened-load-keyerror", ("P3",),
        lambda c: c.api == "fsdp2.full" and c.flatten_optimizer_state_dict
        and not c.no_broadcast,  # without the broadcast: 'param_groups.0.params.0', unmodelled
        "2.13",
        "set_optimizer_state_dict(full_state_dict=True, flatten_optimizer_state_dict=True) "
        "cannot load the flattened full dict get_optimizer_state_dict returned with the same "
        "options, whatever the model: a plain nn.Module at world size 1 raises the same as "
        "FSDP2. _load_optim_state_dict turns the flattened dict back into the nested form "
        "(state_dict.py:1100-1102); its full_state_dict branch (:1140) then reads the rank's "
        "own local dict with _get_optim_state_dict (:1142), which flattens that one because "
        "the option is set (:974-977). Put through _flatten_state_dict (:1158-1159), the two "
        "have different param_groups keys ('param_groups.0.lr' against "
        "'param_groups.0.weight.lr'), and the dict to load is rebuilt from the local dict's "
        "keys and paths (:1168-1176). With broadcast_from_rank0 (how fsdp2.full loads), "
        "_broadcast_state_dict writes a non-tensor value only into keys the local dict has "
        "(_state_dict_utils.py:670-673): rank 0's dict to load has 'param_groups' but no "
        "'state', and it raises KeyError: 'state' in optim.load_state_dict (:1186 -> "
        "optimizer.py:997); the other ranks pass {} and raise KeyError: 'param_groups' "
        "(:1179). Without it, _distribute_state_dict copies every non-tensor value of the full "
        "dict into the local dict under its own key (_state_dict_utils.py:711-712), so the "
        "loop at :1168-1175, which adds the keys the local dict lacks together with their "
        "paths, skips them, and every rank raises KeyError: 'param_groups.0.params.0' in "
        "_unflatten_state_dict (:1176 -> _state_dict_utils.py:828). Nothing is loaded, so "
        "nothing resumes (P6), is saved again (P7) or has param groups to compare (P11). The "
        "sharded path with the same option loads (its template is flattened too). Workaround: "
        "load the flattened full dict with flatten_optimizer_state_dict=False (a dict without "
        "'state' is unflattened whatever the option says, :1095-1102); every tensor state "
        "loads. Minimal reproducer: notes/repro/dsd_full_flattened_load_keyerror.py.",
        "not found upstream (the flattened-dict family: "
        "https://github.com/pytorch/pytorch/issues/192224, "
        "https://github.com/pytorch/pytorch/issues/192225)",
        also=("P6", "P7", "P11"),
        model=Raises(exc="KeyError", message=r"^'(state|param_groups)'$",
                     where=("load_state_dict", "_load_optim_state_dict"))),
    KnownLimitation(
        "dsd-flattened-load-empty-state-for-stateless", ("P3",),
        lambda c: _dsd_sharded_load_on_fsdp2(c) and c.flatten_optimizer_state_dict
        and c.optimizer == "sgd",
        "2.13",
        "A stateless optimizer (plain SGD) loaded from a flattened optimizer state dict "
        "(flatten_optimizer_state_dict=True) gets an empty state entry {} for every param: "
        "_unflatten_optim_state_dict sets state[fqn] = {} for every param that requires grad "
        "before it looks for 'state.<fqn>.*' keys (state_dict.py:862-868), and the saved "
        "dict (correctly) has none. The loaded optimizer's state is {param: {}} instead "
        "of {} (P3, P10), and so is every later state (P6). Seen on every sharded load into "
        "fully_shard (through DCP, and from a rank's own file); the full path with the "
        "option does not load at all (dsd-full-flattened-load-keyerror).",
        "https://github.com/pytorch/pytorch/issues/192225 (open)",
        also=("P6", "P10"),
        model=Effect(what="every param of a stateless optimizer gets state {} by the load",
                     load=empty_state_for_every_param)),
    KnownLimitation(
        "dcp-overwrite-reads-uncommitted-data", ("P16",),
        _dcp_overwrite_killed_after_data,
        "2.13, 2.15",
        "A DCP save into the folder of an earlier checkpoint that is killed after some or all "
        "of its ranks wrote their data files, before the coordinator committed .metadata, "
        "leaves the earlier save's .metadata over the new data files, and the load reads them "
        "without an error. FileSystemWriter overwrites by default (overwrite=True, "
        "filesystem.py:595; :653-661 only warns 'Detected an existing checkpoint'), writes "
        "each data file in place under its final name (create_stream(file_name, 'wb'), :422) "
        "and commits .metadata last through .metadata.tmp and a rename (finish, :758-790); "
        "metadata names the data by file name and offset only. Seen here: a rank killed as it "
        "opens its data file ('before_file', after the plan exchange) while the others write "
        "theirs gives a mix of both saves, entry by entry and, resharded, inside tensors "
        "(exp_avg of step 3 with the step counter of step 2); killed at 'own_file' or "
        "'commit' every rank gets the killed save's state; sync and async_save, FSDP1 and "
        "FSDP2. Killed at 'start' nothing of save 2 is written (a rank that dies before the "
        "plan exchange stops every rank), and a torn data file makes the load raise "
        "EOFError: both pass. Minimal reproducer: "
        "notes/repro/dcp_overwrite_killed_before_commit.py. Workaround: a new folder per "
        "checkpoint, renamed into place when complete (examples/crash_consistency.py).",
        "no upstream issue found; default overwrite: "
        "https://github.com/pytorch/pytorch/pull/125877, overwrite=False by default proposed "
        "in https://github.com/pytorch/pytorch/pull/192183 (open)",
        model=Outcome(headline=r".*: loaded silently (save 2 on every rank, although|a mix of "
                               r"save 1 and save 2 \(.*\);) save 2 is not complete on disk "
                               r"\(dcp/\.metadata is the earlier save's, not its own "
                               r"commit\):")),
    KnownLimitation(
        "scatter-rank0-missing-file-strands-others", ("P16",),
        lambda c: _rank0_scatters(c) and _crash_leaves_rank0_file_missing(c),
        "2.13",
        "The P16 face of scatter-rank0-error-strands-others: a save killed before rank 0 "
        "renamed its full file into the new folder leaves no optim.pt; with "
        "scatter_full_optim_state_dict only rank 0 reads the file, so it raises "
        "FileNotFoundError while the other ranks wait in the broadcast until the "
        "process-group timeout (a hang on a real job). The harness shows their stacks.",
        model=Outcome(headline=STRANDED,
                 raises=(Raises(exc="FileNotFoundError",
                                message=r"^\[Errno 2\] No such file or directory: .*optim\.pt'$"),))),
    KnownLimitation(
        "per-rank-missing-file-strands-others", ("P16",),
        lambda c: c.api == "fsdp1.legacy_sharded" and _crash_kills_one_rank_file(c),
        "2.13",
        "The P16 face of per-rank-file-error-strands-others: a save killed before one rank "
        "renamed its own file into the new folder leaves that rank without optim_rank<r>.pt; "
        "it raises FileNotFoundError in torch.load while the others enter "
        "flatten_sharded_optim_state_dict's collectives and wait for it until the "
        "process-group timeout (a hang on a real job). Every rank killed: every rank raises "
        "and the case passes.",
        model=Outcome(headline=STRANDED,
                 raises=(Raises(exc="FileNotFoundError",
                                message=r"^\[Errno 2\] No such file or directory: "
                                        r".*optim_rank\d+\.pt'$"),))),
    KnownLimitation(
        "scatter-rank0-error-strands-others", ("P15",),
        lambda c: c.fault == "truncated_file" and _rank0_scatters(c),
        "2.13",
        "With scatter_full_optim_state_dict only rank 0 reads the file; when that fails the "
        "other ranks wait in the broadcast until the process-group timeout (a hang on a real "
        "job; docs/design.md bug class 9). The harness shows their stacks and rebuilds the pool.",
        model=Outcome(headline=STRANDED,
                 raises=(Raises(exc="OSError", message=r"^\[Errno 22\] Invalid argument$"),))),
)


def known_all(case: Case, prop: str) -> list[KnownLimitation]:
    """Every entry matching ``(case, prop)`` (``props`` or ``also``)."""
    return [k for k in KNOWN if (prop in k.props or prop in k.also) and k.applies(case)]


def known_for(case: Case, prop: str) -> KnownLimitation | None:
    for k in KNOWN:
        if (prop in k.props or prop in k.also) and k.applies(case):
            return k
    return None
