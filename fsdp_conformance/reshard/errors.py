"""The errors of an offline conversion (``fsdp-conformance reshard``) and of reading a
checkpoint offline (``inspect`` raises the same :class:`UsageError`).

Rules
-----
Each error names the file, and where they apply the rank, the param (FQN or optimizer key)
and the state key, unless the message already says them; ``exit_code`` is what the CLI
returns: :class:`UsageError` 2 (bad arguments, unreadable or missing input, refused
output), :class:`CheckpointMismatch` 1 (the checkpoint does not fit the layout).
"""
from __future__ import annotations

from ..usage import NamedError, UsageError


class ConvertError(NamedError):
    """A conversion that cannot go on; ``exit_code`` is what the CLI returns."""

    exit_code = 1


class CheckpointMismatch(ConvertError):
    """The checkpoint does not fit the layout it is read with (wrong model, plan, world size)."""

    exit_code = 1



__all__ = ["CheckpointMismatch", "ConvertError", "NamedError", "UsageError"]
