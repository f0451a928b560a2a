"""Offline conversion of a saved optimizer checkpoint to another world size or wrapping
(``fsdp-conformance reshard``). CPU only, no process group; the values are the reference's,
so the result is what FSDP must load at the destination.

Rules
-----
One job per module, each stating its own rules: ``errors`` (what fails and its exit code),
``layout`` (the source and destination layouts), ``inputs`` (input kind, per-rank files,
loading and cleaning a rank's dict), ``dcp`` (a DCP directory read per param), ``outputs``
(no-replace, all-or-nothing writing), ``conversion`` (``convert``: read, re-shard, write).
Imports go one way: errors <- layout, inputs <- dcp, outputs <- conversion; no module
imports another's ``_private`` name. This package re-exports the public names; the CLI
parser of ``reshard`` is ``cli.py``'s.
"""
from __future__ import annotations

from .conversion import ConvertResult, convert
from .dcp import DcpFull
from .errors import CheckpointMismatch, ConvertError, UsageError
from .inputs import (DEFAULT_PATTERN, WRAPPER_PREFIXES, clean_name, clean_osd, detect_input,
                     first_float_dtype, load_rank_files, rank_files, rank_loader, torch_load)
from .layout import DTYPES, LayoutSpec, build_layout_for, build_module, parse_plan
from .outputs import check_output_path, rename_noreplace, write_full_file, write_rank_files

__all__ = [
    "CheckpointMismatch", "ConvertError", "ConvertResult", "DEFAULT_PATTERN", "DTYPES", "DcpFull",
    "LayoutSpec", "UsageError", "WRAPPER_PREFIXES", "build_layout_for", "build_module",
    "check_output_path", "clean_name", "clean_osd", "convert", "detect_input",
    "first_float_dtype", "load_rank_files", "parse_plan", "rank_files", "rank_loader",
    "rename_noreplace", "torch_load", "write_full_file", "write_rank_files",
]
