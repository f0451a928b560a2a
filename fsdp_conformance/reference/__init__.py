"""The reference ("oracle"): what FSDP must do to optimizer state, with plain tensor ops.

It never imports ``torch.distributed.fsdp`` or ``torch.distributed.checkpoint``.
Each module states its rules in its docstring; notes/reference-spec.md cites the
torch 2.13 source they were read from and lists where torch deviates.

Neutral forms
-------------
full dict
    ``{"state": {fqn: {state_name: tensor | scalar}}, "param_groups": [{...hyper...,
    "params": [fqn, ...]}]}`` -- what ``FSDP.full_optim_state_dict`` returns: keys are
    original FQNs without wrapper prefixes (``_fsdp_wrapped_module.``); tensors have
    the param's shape; a tied param appears once, under the FQN FSDP keeps for it.
local dict
    a rank's ``optim.state_dict()`` with int ids replaced by the strings of
    ``ModelLayout.optimizer_keys()``: ``"<unit>._flat_param"`` (root ``"_flat_param"``)
    for ``use_orig_params=False``, original FQNs for ``True`` (and for params of
    ignored modules). :func:`to_named` / :func:`to_ids` convert.
    Per-element state is 1-D of ``UnitLayout.shard_numel`` for a flat unit (right
    padding included), 1-D of the rank's piece for a sharded original param (no entry
    when the rank holds none of it), the param's shape under NO_SHARD.

Entry points
------------
layout:  :func:`build_layout`, :func:`layout_from_spec`, :func:`fsdp2_layout`,
         :class:`ModelLayout`, :class:`UnitLayout`, :class:`ParamSlot`, :class:`Piece`
state:   :func:`gather_full`, :func:`shard_full`, :func:`flatten_sharded`,
         :func:`to_pieces`, :func:`sharded_to_pieces`, :func:`dtensor_box`,
         :func:`reshard`, :func:`shard_full_per_unit`, :func:`rekey_to_names`, :func:`rekey_to_ids`,
         :func:`to_named`, :func:`to_ids`, :func:`fsdp2_shard`, :func:`fsdp2_gather`,
         :func:`fsdp2_flatten`,
         :func:`unflatten_osd` (DSD's flattened optimizer state dict -> the full dict form)
errors:  :class:`StateDictMismatch` and subclasses
"""

from .errors import (
    DtypeMismatch,
    LayoutError,
    MissingKeyError,
    MixedKeyTypes,
    RankCountMismatch,
    ScalarStateConflict,
    ShapeMismatch,
    StateDictMismatch,
    UnknownKeyError,
)
from .flatten import dtensor_box, flatten_sharded, sharded_to_pieces, to_pieces
from .fsdp2 import fsdp2_flatten, fsdp2_gather, fsdp2_shard
from .fsdp2_layout import Fsdp2Layout, Fsdp2Param, fsdp2_layout
from .gather import gather_full, gather_param_groups, gather_unit
from .keys import to_ids, to_named, unflatten_osd
from .layout import ModelLayout, ParamSlot, Piece, UnitLayout
from .layout_build import align_numel_for, build_layout, flat_offsets, layout_from_spec
from .rekey import rekey_to_ids, rekey_to_names
from .reshard import reshard, shard_full_per_unit
from .shard import shard_full, shard_param_groups, shard_unit

__all__ = [
    "DtypeMismatch", "LayoutError", "MissingKeyError", "MixedKeyTypes", "RankCountMismatch",
    "ScalarStateConflict", "ShapeMismatch", "StateDictMismatch", "UnknownKeyError",
    "dtensor_box", "flatten_sharded", "sharded_to_pieces", "to_pieces", "fsdp2_flatten", "fsdp2_gather", "fsdp2_shard", "gather_full", "gather_param_groups",
    "gather_unit", "to_ids", "to_named", "unflatten_osd", "Fsdp2Layout", "Fsdp2Param", "ModelLayout", "ParamSlot",
    "Piece", "UnitLayout", "align_numel_for", "build_layout", "flat_offsets", "fsdp2_layout",
    "layout_from_spec", "rekey_to_ids", "rekey_to_names", "reshard", "shard_full", "shard_full_per_unit",
    "shard_param_groups", "shard_unit",
]
