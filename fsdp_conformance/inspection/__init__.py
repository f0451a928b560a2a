"""What is in an optimizer checkpoint (``fsdp-conformance inspect``): keys, params with and
without state, shapes, dtypes, steps, param groups, the world size and layout the files
imply, and anything suspicious. CPU only, no process group, no FSDP internals.

Rules
-----
One job per module, each stating its own rules: ``summary`` (the records and their JSON),
``load`` (reading one torch file), ``locate`` (the optimizer dict inside it), ``describe``
(state values, groups, order, sizes), ``findings`` (the checks every format shares),
``one_file`` / ``per_rank`` / ``dcp`` (one summary per input kind), ``entry``
(``inspect_path``), ``render`` (the human view), ``cli`` (the command). Imports go one way,
in that order; input kinds, ``UsageError`` and DCP reading are ``fsdp_conformance.reshard``'s.
No module imports another's ``_private`` name. The package name shadows nothing: every
module here imports with ``from __future__ import annotations`` and absolute stdlib
imports, so ``import inspect`` anywhere still means the stdlib. This package re-exports the
public names.
"""
from __future__ import annotations

from .describe import FLAT_MARKER, describe_value, guess_optimizer
from .entry import inspect_path
from .findings import findings_for
from .load import LoadedFile, ShardedRecord, load_file
from .locate import (MAX_DEPTH, find_optimizer_dicts, is_optimizer_dict, location_str,
                     select_optimizer_dict)
from .render import DEFAULT_LIMIT, render, render_text
from .summary import SCHEMA, SHARDED_KINDS, Chunk, Finding, GroupInfo, ParamInfo, StateInfo, Summary

__all__ = ["Chunk", "DEFAULT_LIMIT", "FLAT_MARKER", "Finding", "GroupInfo", "LoadedFile",
           "MAX_DEPTH", "ParamInfo", "SCHEMA", "SHARDED_KINDS", "ShardedRecord", "StateInfo",
           "Summary", "describe_value", "find_optimizer_dicts", "findings_for", "guess_optimizer",
           "inspect_path", "is_optimizer_dict", "load_file", "location_str", "render",
           "render_text", "select_optimizer_dict"]
