"""Reading one ``torch.save`` file for ``inspect``, whatever it holds, with no process group.

Rules
-----
Loading: ``torch.load(mmap=True, weights_only=True)`` (torch's legacy non-zip format:
  without mmap), with ``torch.distributed.tensor`` imported so DTensors (FSDP2 sharded state
  ``torch.save``'d per rank) load. A file that is empty, not a zip archive nor torch's
  legacy format, a zip without ``data.pkl``, or a zip whose end is missing (truncated) is an
  error that says which. Every zip member's CRC-32 is checked (torch does not check them: a
  byte changed after saving loads silently); a mismatch is a warning. A file
  ``weights_only`` refuses (FSDP1 ``sharded_optim_state_dict`` files hold ``ShardedTensor``)
  is read only with ``unsafe_load=True``: a full unpickler, which runs code the file names,
  with ``ShardedTensor`` replaced by :class:`ShardedRecord` (its shards and metadata), so no
  process group is needed.
"""
from __future__ import annotations

import contextlib
import logging
import pickle
import re
import types
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from ..reshard.errors import UsageError
from .summary import Chunk

_LEGACY_MAGIC = (0x1950A86A20F9469CFC6C).to_bytes(10, "little")  # torch's legacy-format magic


@dataclass(frozen=True, kw_only=True)
class ShardedRecord:
    """A ``ShardedTensor`` read without a process group: global shape and dtype, every
    rank's shard placement, this file's shards, and the ranks/world size it was saved at."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    chunks: tuple[Chunk, ...]
    local: tuple[torch.Tensor, ...]
    rank: int | None
    world_size: int | None


class _ShardedTensorStandIn:
    """What the unpickler returns for the ShardedTensor class; ``_rebuild`` turns the pickled
    state of such an object into a :class:`ShardedRecord`."""


def _placement_rank(shard_md: Any) -> int | None:
    try:
        return shard_md.placement.rank()
    except Exception:  # noqa: BLE001  (a placement without a rank)
        return None


def _rebuild(func, new_type, args, state):
    if new_type is not _ShardedTensorStandIn:
        return torch._tensor._rebuild_from_type_v2(func, new_type, args, state)
    local_shards, meta, pg_state = state[0], state[1], state[2]
    chunks = tuple(Chunk(rank=_placement_rank(m), offsets=tuple(m.shard_offsets),
                         sizes=tuple(m.shard_sizes))
                   for m in meta.shards_metadata)
    return ShardedRecord(shape=tuple(meta.size), dtype=meta.tensor_properties.dtype, chunks=chunks,
                         local=tuple(s.tensor for s in local_shards),
                         rank=getattr(pg_state, "global_rank", None),
                         world_size=getattr(pg_state, "global_world_size", None))


def _unsafe_pickle_module() -> types.ModuleType:
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor

    # protocol-2 pickles name the nested class as getattr(ShardedTensor, "ProcessGroupState")
    _ShardedTensorStandIn.ProcessGroupState = ShardedTensor.ProcessGroupState

    class Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str):
            if (module, name) == ("torch.distributed._shard.sharded_tensor.api", "ShardedTensor"):
                return _ShardedTensorStandIn
            if (module, name) == ("torch._tensor", "_rebuild_from_type_v2"):
                return _rebuild
            return super().find_class(module, name)

    mod = types.ModuleType("fsdp_conformance_unsafe_pickle")
    mod.Unpickler, mod.load = Unpickler, pickle.load
    return mod


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No warnings while loading (weights_only notes, DeviceMesh unpickled without groups)."""
    log = logging.getLogger("torch.distributed.device_mesh")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


def _enable_dtensor() -> None:
    """``weights_only`` loads DTensors once ``torch.distributed.tensor`` is imported."""
    with contextlib.suppress(ImportError):
        import torch.distributed.tensor  # noqa: F401


def _container(path: Path, rank: int | None) -> str:
    """``"zip"`` or ``"legacy"`` (torch's pre-1.6 format); UsageError saying what the file
    is when it is neither."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError as e:
        raise UsageError(f"cannot open it: {e.strerror or e}", path=path, rank=rank) from e
    if size == 0:
        raise UsageError("empty file (0 bytes): not a torch.save checkpoint", path=path, rank=rank)
    if head.startswith(b"PK\x03\x04"):
        if not zipfile.is_zipfile(path):
            raise UsageError(f"truncated or corrupt: it starts like a torch.save zip archive but its "
                             f"end (the zip central directory) is missing ({size} bytes)",
                             path=path, rank=rank)
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except (zipfile.BadZipFile, OSError) as e:
            raise UsageError(f"corrupt zip archive: {e}", path=path, rank=rank) from e
        if not any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
            raise UsageError(f"a zip archive but not a torch.save checkpoint (no data.pkl; it "
                             f"holds {names[:4]})", path=path, rank=rank)
        return "zip"
    if _LEGACY_MAGIC in head:
        return "legacy"
    raise UsageError(f"not a torch.save file: neither a zip archive nor torch's legacy format "
                     f"(it starts with {head[:16]!r})", path=path, rank=rank)


def _refusal(exc: BaseException) -> str | None:
    """What ``torch.load(weights_only=True)`` refused (a global it will not unpickle, or its
    unpickler's error), or None if the failure was not a refusal."""
    text = str(exc)
    if "Weights only load failed" not in text:
        return None
    m = re.search(r"Unsupported global: GLOBAL (\S+)", text)
    if m:
        return f"it pickles {m.group(1)}"
    m = re.search(r"WeightsUnpickler error: ([^\n]+)", text)
    return m.group(1).strip() if m else text.splitlines()[0]


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def _damaged_member(path: Path) -> str | None:
    with contextlib.suppress(Exception), zipfile.ZipFile(path) as z:
        return z.testzip()
    return None


@dataclass(frozen=True, kw_only=True)
class LoadedFile:
    """What :func:`load_file` read: the object, whether the unsafe unpickler read it, and
    the first zip member whose CRC-32 does not match (None: all match, or not a zip)."""

    obj: Any
    unsafe: bool
    damaged: str | None


def load_file(path: Path, rank: int | None = None, unsafe: bool = False) -> LoadedFile:
    """Read a ``torch.save`` file (see the module docstring) and check its zip members'
    CRC-32 (torch does not: a bit flipped after saving loads silently); UsageError naming
    the file (and ``rank``) and why it cannot be read."""
    path = Path(path)
    container = _container(path, rank)
    _enable_dtensor()
    try:
        with _quiet():
            obj = torch.load(path, map_location="cpu", mmap=container == "zip", weights_only=True)
        return LoadedFile(obj=obj, unsafe=False,
                          damaged=_damaged_member(path) if container == "zip" else None)
    except Exception as e:  # noqa: BLE001  (whatever torch raises, said with the file's name)
        refused = _refusal(e)
        if refused is None:
            bad = _damaged_member(path) if container == "zip" else None
            why = (f"corrupt: the zip member {bad!r} fails its CRC check" if bad else
                   f"cannot read it: {_first_line(e)}")
            raise UsageError(why, path=path, rank=rank) from e
        if not unsafe:
            raise UsageError(
                f"torch.load(weights_only=True) refuses it: {refused}"
                + (" (FSDP1 sharded_optim_state_dict files do)" if "ShardedTensor" in refused else "")
                + ". Pass --unsafe-load to unpickle it anyway: that runs code the file names, so "
                  "only for a file you trust", path=path, rank=rank) from e
    try:
        with _quiet():
            obj = torch.load(path, map_location="cpu", weights_only=False,
                             pickle_module=_unsafe_pickle_module())
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"cannot read it even with --unsafe-load: {_first_line(e)}",
                         path=path, rank=rank) from e
    return LoadedFile(obj=obj, unsafe=True,
                      damaged=_damaged_member(path) if container == "zip" else None)
