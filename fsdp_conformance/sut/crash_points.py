"""Kill points inside a save, on a rank (P16): hooks on torch's writers that SIGKILL this
rank's process at a chosen point, so that what a preemption leaves behind is what the load
meets.

Rules
- ``armed(plan, rank, out)`` holds the hooks for the duration of one save's write; a rank the
  plan does not kill runs unhooked. The process is killed with SIGKILL (no handler, no
  ``finally``, no flush: what the kernel holds of the files is what is left), after this
  rank's open stream is flushed where the point is inside a file, so the bytes left are a
  function of the case alone.
- The points, on torch's own writers (never on the suite's code):
    start     on entering the write, before anything is written;
    staging   ``dcp.async_save``'s staging (its stager's ``stage``) is entered: the copy of
              the state the background write will read is not made (a synchronous save
              never stages: n/a there);
    before_file
              about to open its first data file: a ``torch.save`` to a path is entered;
              DCP's file writer (``_write_files_from_queue``) is entered, after the plan
              exchange, so the other ranks write their files;
    torn      inside this rank's first data file: a ``torch.save`` to a path writes the
              first ``fraction`` of its bytes; a DCP data file stops after its
              ``max(1, fraction x items)``-th item (``fraction``: seeded by the case);
    own_file  after this rank's data: a ``torch.save`` to a path has returned (a writer that
              renames a temporary file afterwards has not renamed it yet); DCP's
              ``write_data`` has written every file of this rank (inside ``async_save``'s
              background thread where the save is asynchronous);
    commit    DCP's ``finish`` is entered on the coordinator: every rank's data files are
              written, ``.metadata`` is not.
- Files the suite writes beside the checkpoint (``SUITE_FILES``: the model's params and the
  scheduler's state, not under test) never trigger a point.
- A save that completes on every rank never met its point: the controller says the point
  does not exist in that save (a save without a DCP commit, say).
"""
from __future__ import annotations

import io
import os
import signal
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..api_paths import MODEL_FILE, SCHED_FILE

SUITE_FILES = (MODEL_FILE, SCHED_FILE)
"""The suite's own files beside a checkpoint (harness-written, not under test)."""


@dataclass(frozen=True, kw_only=True)
class KillPlan:
    """Where a save is killed (``cases.crash_parts`` of ``Case.crash``)."""

    point: str
    """``"start"``, ``"staging"``, ``"before_file"``, ``"torn"``, ``"own_file"`` or
    ``"commit"`` (module rules)."""
    ranks: tuple[int, ...]
    """The ranks killed there."""
    fraction: float = 0.5
    """Where inside the first data file a ``torn`` kill lands (0-1, seeded by the case)."""


def plan_of(crash: str, world_size: int, seed: int) -> KillPlan:
    """The ``KillPlan`` of a ``Case.crash`` value (the torn fraction from ``seed``)."""
    import random

    from ..cases import crash_parts

    point, ranks, _ = crash_parts(crash, world_size)
    return KillPlan(point=point, ranks=ranks,
                    fraction=round(random.Random(f"torn:{seed}").uniform(0.2, 0.8), 3))


def die(stream: Any = None) -> None:
    """SIGKILL this process now (``stream``: flushed first, module rules)."""
    if stream is not None:
        try:
            stream.flush()
            os.fsync(stream.fileno())
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def _suite_file(f: Any) -> bool:
    name = Path(os.fspath(f)).name
    return any(name == s or name.startswith(f".{s}.tmp") for s in SUITE_FILES)


@contextmanager
def armed(plan: KillPlan | None, rank: int) -> Iterator[None]:
    """The hooks of ``plan`` on this rank while the block runs (module rules)."""
    if plan is None or rank not in plan.ranks:
        yield
        return
    if plan.point == "start":
        die()
    import torch
    from torch.distributed.checkpoint import filesystem as fs
    from torch.distributed.checkpoint import staging

    saved = {"torch.save": torch.save, "write_item": fs._write_item,
             "write_files": fs._write_files_from_queue,
             "write_data": fs._FileSystemWriter.write_data,
             "finish": fs._FileSystemWriter.finish}
    stagers = [c for c in (getattr(staging, "DefaultStager", None),
                           getattr(staging, "BlockingAsyncStager", None)) if c is not None]
    real_save = saved["torch.save"]
    counts = {"items": 0, "limit": 0}

    def save_hook(obj, f, *args, **kwargs):
        if not isinstance(f, (str, os.PathLike)) or _suite_file(f):
            return real_save(obj, f, *args, **kwargs)
        if plan.point == "before_file":
            die()
        if plan.point == "torn":
            buf = io.BytesIO()
            real_save(obj, buf, *args, **kwargs)
            data = buf.getvalue()
            with open(f, "wb") as out:
                out.write(data[: int(len(data) * plan.fraction)])
                die(out)
        result = real_save(obj, f, *args, **kwargs)
        if plan.point == "own_file":
            die()
        return result

    def write_data_hook(self, dcp_plan, planner):
        counts["limit"] = max(1, int(len(dcp_plan.items) * plan.fraction))
        fut = saved["write_data"](self, dcp_plan, planner)
        if plan.point == "own_file":
            fut.wait()
            die()
        return fut

    def write_item_hook(transforms, stream, *args, **kwargs):
        result = saved["write_item"](transforms, stream, *args, **kwargs)
        counts["items"] += 1
        if plan.point == "torn" and counts["items"] >= counts["limit"]:
            die(stream)
        return result

    def write_files_hook(*args, **kwargs):
        if plan.point == "before_file":
            die()
        return saved["write_files"](*args, **kwargs)

    def stage_hook(orig):
        def stage(self, *args, **kwargs):
            if plan.point == "staging":
                die()
            return orig(self, *args, **kwargs)

        return stage

    def finish_hook(self, *args, **kwargs):
        if plan.point == "commit":
            die()
        return saved["finish"](self, *args, **kwargs)

    patches = [(torch, "save", save_hook), (fs, "_write_item", write_item_hook),
               (fs, "_write_files_from_queue", write_files_hook),
               (fs._FileSystemWriter, "write_data", write_data_hook),
               (fs._FileSystemWriter, "finish", finish_hook)]
    patches += [(c, "stage", stage_hook(c.stage)) for c in stagers]
    undo = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, hook in patches:
        setattr(owner, name, hook)
    try:
        yield
    finally:
        for owner, name, old in undo:
            setattr(owner, name, old)
