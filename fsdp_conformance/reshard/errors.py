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

import os


class ConvertError(Exception):
    """A conversion that cannot go on; ``exit_code`` is what the CLI returns."""

    exit_code = 1

    def __init__(self, message: str, *, path: str | os.PathLike | None = None,
                 rank: int | None = None, param: str | None = None, key: str | None = None):
        self.path = None if path is None else str(path)
        self.rank, self.param, self.key = rank, param, key
        where = [w for w, v in (("param", param), ("key", key)) if v is not None
                 and repr(v) not in message]
        where = [f"{w} {(param if w == 'param' else key)!r}" for w in where]
        if rank is not None and f"rank {rank}" not in message:
            where.append(f"rank {rank}")
        if where:
            message += f" (at {', '.join(where)})"
        super().__init__(f"{self.path}: {message}" if self.path else message)


class UsageError(ConvertError):
    """Bad arguments, an unreadable or missing input, or an output that would overwrite."""

    exit_code = 2


class CheckpointMismatch(ConvertError):
    """The checkpoint does not fit the layout it is read with (wrong model, plan, world size)."""

    exit_code = 1



__all__ = ["CheckpointMismatch", "ConvertError", "UsageError"]
