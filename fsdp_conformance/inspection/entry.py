"""``inspect_path``: the summary of the optimizer checkpoint at a path, whichever its kind.

Rules
-----
Inputs (``inspect_path``; the kinds are ``reshard.inputs.detect_input``'s):
  * a file: ``torch.save`` of an optimizer dict (a mapping with a ``state`` mapping and a
    ``param_groups`` list of mappings; keyed by FQNs or by int ids) or of any object that
    holds one (a trainer checkpoint ``{"model": ..., "optim": osd, ...}``, nested up to
    ``MAX_DEPTH`` levels in mappings, lists and tuples). ``key`` (dotted: ``"optim"``,
    ``"optimizers.0"``) picks one when several are found; the summary says where it was
    (``location``).
  * a directory of per-rank files (``pattern``, default ``optim_rank{rank}.pt``, ranks
    ``0, 1, ...``): each rank's optimizer dict (found like in a file). The world size is
    the number of files.
  * a DCP directory (has ``.metadata``): shapes, dtypes and chunk placement come from the
    metadata alone; only non-tensor and 0-dim entries (``step``) and ``param_groups`` are
    read, and every tensor's values only with ``values=True``. Every data file the metadata
    names must exist.
Errors: :class:`~fsdp_conformance.reshard.errors.UsageError` (exit 2) naming the file (and
  rank) and why: missing, empty, truncated, not a torch file, refused by ``weights_only``
  without ``unsafe_load``, no optimizer dict in it, several and no ``key``, a malformed ``param_groups``, a DCP data
  file missing.
"""
from __future__ import annotations

from pathlib import Path

from ..reshard.inputs import DEFAULT_PATTERN, detect_input
from .dcp import summarise_dcp
from .one_file import summarise_file
from .per_rank import summarise_ranks
from .summary import Summary


def inspect_path(path: str | Path, *, key: str | None = None, pattern: str = DEFAULT_PATTERN,
                 unsafe_load: bool = False, values: bool = False) -> Summary:
    """Summarise the optimizer checkpoint at ``path`` (a file, a directory of per-rank files
    or a DCP directory; see the module docstring). Raises
    :class:`~fsdp_conformance.reshard.errors.UsageError` when it cannot be read."""
    path = Path(path)
    kind = detect_input(path)
    if kind == "full":
        return summarise_file(path, key, unsafe_load)
    if kind == "dcp":
        return summarise_dcp(path, key, values)
    return summarise_ranks(path, key, pattern, unsafe_load)
