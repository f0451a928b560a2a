"""What is in an optimizer checkpoint (``fsdp-conformance inspect``): keys, params with and
without state, shapes, dtypes, steps, param groups, the world size and layout the files
imply, and anything suspicious. CPU only, no process group, no FSDP internals.

Rules
-----
Inputs (``inspect_path``; the kinds are ``convert.detect_input``'s):
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
Order: params listed in param groups first (group by group, in their order), then params
  with state in no group, in the order of ``state``.
Sizes (``StateInfo``): ``shape`` is the whole tensor's (known for a whole tensor, a
  ShardedTensor, a DTensor and a DCP entry; None for per-rank 1-D pieces, whose sizes are
  ``rank_numel``); ``numel`` counts the whole tensor's elements when its shape is known,
  else the pieces' (padding included); ``nbytes`` counts the bytes stored in the files read
  (every rank's piece or copy).
Layout implied (per-rank files, by each param's first per-element state): one file ->
  nothing is sharded; ShardedTensor -> chunks of dim 0, global shape and saving world size
  recorded in the file; DTensor -> its placements and mesh size; the same multi-dim shape
  on every rank -> replicated (and then so are 1-D tensors of equal sizes on every rank);
  otherwise equal 1-D sizes on every rank -> FSDP1 FlatParameter shards (the total ``W*S``
  is a multiple of ``W``: the flat param was padded to it); 1-D sizes that differ, or state
  on some ranks only -> ``use_orig_params=True`` slices (a rank that owns no element of a
  param has no state for it). One file (not a directory) with FlatParameter keys, or
  ShardedTensors or DTensors saved at a world size above 1, is one rank's part of a sharded
  checkpoint. DCP: the saving world size is ``1 + the largest rank`` in the data file
  names (``__<rank>_<n>.distcp``), each chunk's rank is the file that holds it.
Findings: ``warning`` (``strict`` turns any into exit 1) or ``note`` (a fact that is normal
  for what it names): an empty ``state``; params listed in a group with no state (a note
  when the optimizer is stateless, SGD with momentum 0); state for a param in no group; a
  param in two groups; an empty group; int and str keys mixed; params whose state has
  different names; ``step`` differing across params or ranks; ``step`` stored as a Python
  number for some params and a tensor for others; NaN/Inf in a state tensor; per-element
  state in several floating dtypes; names with FSDP wrapper prefixes; one rank's part of a
  sharded checkpoint in a single file; a zip member failing its CRC-32; param groups or
  steps that disagree across ranks; a ShardedTensor or DTensor world size other than the
  number of files; rank files with a gap in their numbering; state on some ranks only (a
  note).
Errors: :class:`convert.UsageError` (exit 2) naming the file (and rank) and why: missing,
  empty, truncated, not a torch file, refused by ``weights_only`` without ``unsafe_load``,
  no optimizer dict in it, several and no ``key``, a malformed ``param_groups``, a DCP data
  file missing.
"""
from __future__ import annotations

import contextlib
import logging
import math
import pickle
import re
import types
import warnings
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import torch

from .convert import DEFAULT_PATTERN, WRAPPER_PREFIXES, DcpFull, UsageError, detect_input, rank_files

SCHEMA = "fsdp-conformance/inspect/1"
MAX_DEPTH = 4
FLAT_MARKER = "_flat_param"
SHARDED_KINDS = ("sharded tensor", "dtensor")
_DISTCP = re.compile(r"__(\d+)_\d+\.distcp$")
_LEGACY_MAGIC = (0x1950A86A20F9469CFC6C).to_bytes(10, "little")  # torch's legacy-format magic


# ------------------------------------------------------------------------------------
# the summary
# ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Chunk:
    """One stored piece of a tensor: the rank that wrote it (None: unknown), where it starts
    and its size, per dim."""

    rank: int | None
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


@dataclass(frozen=True)
class StateInfo:
    """One state value of one param (sizes: see the module docstring). ``kind`` is "tensor",
    "scalar tensor" (0-dim), "sharded tensor", "dtensor", "int", "float", "bool", "str",
    "none", "unread" or "other:<type>"; ``nonfinite`` is the NaN/Inf count (None: values not
    read); ``value`` is set for scalars (0-dim tensors and Python numbers); ``world_size`` is
    the one a ShardedTensor or DTensor records; ``placements`` a DTensor's; ``rank_numel``
    the element count of each rank's piece (per-rank files; one file's own piece of a
    ShardedTensor or DTensor)."""

    name: str
    kind: str
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    numel: int = 0
    nbytes: int = 0
    value: Any = None
    nonfinite: int | None = None
    rank_numel: tuple[int | None, ...] | None = None
    chunks: tuple[Chunk, ...] = ()
    world_size: int | None = None
    placements: str | None = None

    @property
    def per_element(self) -> bool:
        """A tensor with one value per element of its param (not a 0-dim ``step``)."""
        return self.kind in ("tensor",) + SHARDED_KINDS and (self.shape is None or len(self.shape) > 0)


@dataclass(frozen=True)
class ParamInfo:
    """A param key (FQN or int id) with its state, the groups that list it and its step
    (``step_kind``: "tensor", "int" or "float"); ``ranks_with_state`` for per-rank files."""

    key: str | int
    groups: tuple[int, ...]
    state: tuple[StateInfo, ...]
    step: Any = None
    step_kind: str | None = None
    ranks_with_state: tuple[int, ...] | None = None


@dataclass(frozen=True)
class GroupInfo:
    """One param group: its position, hyperparameters (JSON-safe values) and param keys."""

    index: int
    hyper: dict[str, Any]
    params: tuple[str | int, ...]


@dataclass(frozen=True)
class Finding:
    """Something worth saying: ``level`` "warning" (suspicious) or "note" (normal for what
    it names); ``code`` a stable name (``no-state``, ``step-disagree`` ...)."""

    level: str
    code: str
    message: str


@dataclass(frozen=True)
class Summary:
    """Everything ``inspect`` reports about one checkpoint (see the module docstring).
    ``format`` is "file", "rank-files" or "dcp"; ``key_type`` "fqn", "int", "mixed" or
    "none"; ``world_size`` None when nothing in the input says it."""

    path: str
    format: str
    description: str
    location: str
    key_type: str
    optimizer: str | None
    params: tuple[ParamInfo, ...]
    groups: tuple[GroupInfo, ...]
    world_size: int | None
    layout: tuple[str, ...]
    state_bytes: int
    values_read: bool
    unsafe_loaded: bool
    files: tuple[str, ...]
    findings: tuple[Finding, ...] = field(default=())

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.level == "warning")

    def counts(self) -> dict[str, int]:
        """Params with state, listed in groups, listed without state, with state in no group."""
        listed = {k for g in self.groups for k in g.params}
        with_state = {p.key for p in self.params if p.state}
        return {"with_state": len(with_state), "in_groups": len(listed),
                "in_groups_without_state": len(listed - with_state),
                "with_state_in_no_group": len(with_state - listed)}

    def to_json(self) -> dict:
        """Every field (schema ``SCHEMA``), plus ``counts``; :meth:`from_json` reads it back."""
        return {"schema": SCHEMA, "path": self.path, "format": self.format,
                "description": self.description, "location": self.location,
                "key_type": self.key_type, "optimizer": self.optimizer,
                "world_size": self.world_size, "layout": list(self.layout),
                "counts": self.counts(), "state_bytes": self.state_bytes,
                "values_read": self.values_read, "unsafe_loaded": self.unsafe_loaded,
                "files": list(self.files),
                "params": [_param_json(p) for p in self.params],
                "param_groups": [{"index": g.index, "hyperparameters": g.hyper,
                                  "params": list(g.params)} for g in self.groups],
                "findings": [{"level": f.level, "code": f.code, "message": f.message}
                             for f in self.findings]}

    @classmethod
    def from_json(cls, doc: Mapping) -> "Summary":
        """The Summary :meth:`to_json` wrote; ValueError naming the field when ``doc`` is not
        one (another schema, a missing field)."""
        if not isinstance(doc, Mapping) or doc.get("schema") != SCHEMA:
            got = doc.get("schema") if isinstance(doc, Mapping) else type(doc).__name__
            raise ValueError(f"schema {got!r}, expected {SCHEMA!r}")
        try:
            return cls(doc["path"], doc["format"], doc["description"], doc["location"],
                       doc["key_type"], doc["optimizer"],
                       tuple(_param_from_json(p) for p in doc["params"]),
                       tuple(GroupInfo(g["index"], dict(g["hyperparameters"]), tuple(g["params"]))
                             for g in doc["param_groups"]),
                       doc["world_size"], tuple(doc["layout"]), doc["state_bytes"],
                       doc["values_read"], doc["unsafe_loaded"], tuple(doc["files"]),
                       tuple(Finding(f["level"], f["code"], f["message"]) for f in doc["findings"]))
        except (KeyError, TypeError) as e:
            raise ValueError(f"not an inspect summary: missing or malformed field {e}") from None


def _param_json(p: ParamInfo) -> dict:
    def state(s: StateInfo) -> dict:
        return {"name": s.name, "kind": s.kind, "dtype": s.dtype,
                "shape": None if s.shape is None else list(s.shape), "numel": s.numel,
                "nbytes": s.nbytes, "value": s.value, "nonfinite": s.nonfinite,
                "rank_numel": None if s.rank_numel is None else list(s.rank_numel),
                "chunks": [{"rank": c.rank, "offsets": list(c.offsets), "sizes": list(c.sizes)}
                           for c in s.chunks],
                "world_size": s.world_size, "placements": s.placements}

    return {"key": p.key, "groups": list(p.groups), "step": p.step, "step_kind": p.step_kind,
            "ranks_with_state": None if p.ranks_with_state is None else list(p.ranks_with_state),
            "state": [state(s) for s in p.state]}


def _param_from_json(d: Mapping) -> ParamInfo:
    def opt_tuple(v):
        return None if v is None else tuple(v)

    state = tuple(StateInfo(s["name"], s["kind"], s["dtype"], opt_tuple(s["shape"]), s["numel"],
                            s["nbytes"], s["value"], s["nonfinite"], opt_tuple(s["rank_numel"]),
                            tuple(Chunk(c["rank"], tuple(c["offsets"]), tuple(c["sizes"]))
                                  for c in s["chunks"]), s["world_size"], s["placements"])
                  for s in d["state"])
    return ParamInfo(d["key"], tuple(d["groups"]), state, d["step"], d["step_kind"],
                     opt_tuple(d["ranks_with_state"]))


# ------------------------------------------------------------------------------------
# loading
# ------------------------------------------------------------------------------------
@dataclass(frozen=True)
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
    chunks = tuple(Chunk(_placement_rank(m), tuple(m.shard_offsets), tuple(m.shard_sizes))
                   for m in meta.shards_metadata)
    return ShardedRecord(tuple(meta.size), meta.tensor_properties.dtype, chunks,
                         tuple(s.tensor for s in local_shards),
                         getattr(pg_state, "global_rank", None),
                         getattr(pg_state, "global_world_size", None))


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


@dataclass(frozen=True)
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
        return LoadedFile(obj, False, _damaged_member(path) if container == "zip" else None)
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
    return LoadedFile(obj, True, _damaged_member(path) if container == "zip" else None)


def _damage_findings(files: Sequence[Path], loaded: Sequence[LoadedFile]) -> list[Finding]:
    return [Finding("warning", "crc-mismatch",
                    f"{f}: zip member {lf.damaged!r} fails its CRC-32 check: the file changed "
                    "after torch.save wrote it; values read from it may be wrong")
            for f, lf in zip(files, loaded) if lf.damaged]


def is_optimizer_dict(obj: Any) -> bool:
    """A mapping with a ``state`` mapping and a ``param_groups`` list or tuple."""
    return (isinstance(obj, Mapping) and isinstance(obj.get("state"), Mapping)
            and isinstance(obj.get("param_groups"), (list, tuple)))


def find_optimizer_dicts(obj: Any, max_depth: int = MAX_DEPTH) -> list[tuple[tuple, Mapping]]:
    """Every optimizer dict in ``obj`` (itself, or nested in mappings/lists/tuples up to
    ``max_depth`` levels), as ``(path of keys, dict)``, outermost first; an optimizer dict's
    insides are not searched."""
    found: list[tuple[tuple, Mapping]] = []

    def walk(o: Any, where: tuple, depth: int) -> None:
        if is_optimizer_dict(o):
            found.append((where, o))
            return
        if depth >= max_depth:
            return
        if isinstance(o, Mapping):
            for k, v in o.items():
                walk(v, where + (k,), depth + 1)
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                walk(v, where + (i,), depth + 1)

    walk(obj, (), 0)
    return found


def location_str(where: tuple) -> str:
    """``('optim',)`` -> ``["optim"]``; ``()`` -> ``""`` (the top level)."""
    return "".join(f"[{k!r}]".replace("'", '"') for k in where)


def _check_groups(osd: Mapping, path: Path, rank: int | None) -> None:
    """Every param group is a mapping whose ``params`` (if any) is a list of int or str keys."""
    for i, g in enumerate(osd["param_groups"]):
        if not isinstance(g, Mapping):
            raise UsageError(f"param_groups[{i}] is a {type(g).__name__}, expected a dict of "
                             "hyperparameters and 'params'", path=path, rank=rank)
        ps = g.get("params", [])
        if not isinstance(ps, (list, tuple)):
            raise UsageError(f"param_groups[{i}]['params'] is a {type(ps).__name__}, expected a "
                             "list of param ids or FQNs", path=path, rank=rank)
        for j, k in enumerate(ps):
            if not isinstance(k, (int, str)):
                raise UsageError(f"param_groups[{i}]['params'][{j}] is a {type(k).__name__}, "
                                 "expected an int id or a str FQN", path=path, rank=rank)


def select_optimizer_dict(obj: Any, key: str | None, path: Path,
                          rank: int | None = None) -> tuple[tuple, Mapping]:
    """The one optimizer dict of ``obj`` (``key``: dotted path to it), its param groups
    checked; UsageError when there is none, several and no ``key``, or ``key`` names none."""
    found = find_optimizer_dicts(obj)
    names = [".".join(map(str, w)) or "<top level>" for w, _ in found]
    if key is not None:
        sel = [(w, d) for w, d in found if ".".join(map(str, w)) == key]
        if len(sel) != 1:
            raise UsageError(f"--key {key!r} names no optimizer dict; found: {names or 'none'}",
                             path=path, rank=rank)
    elif len(found) > 1:
        raise UsageError(f"{len(found)} optimizer dicts in this file ({names}); pick one with "
                         "--key", path=path, rank=rank)
    elif found:
        sel = found
    elif isinstance(obj, Mapping) and not obj:
        raise UsageError("an empty dict, no optimizer state: what full_optim_state_dict / "
                         "optim_state_dict with rank0_only=True return on ranks other than 0",
                         path=path, rank=rank)
    else:
        what = (f"a mapping with keys {sorted(map(str, obj))[:8]}" if isinstance(obj, Mapping)
                else f"a {type(obj).__name__}")
        raise UsageError(f"no optimizer state dict (a mapping with a 'state' mapping and a "
                         f"'param_groups' list) in it, up to {MAX_DEPTH} levels deep: it is {what}",
                         path=path, rank=rank)
    _check_groups(sel[0][1], path, rank)
    return sel[0]


# ------------------------------------------------------------------------------------
# describing values
# ------------------------------------------------------------------------------------
def _nonfinite(t: torch.Tensor) -> int:
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return 0
    return int(t.numel() - torch.isfinite(t).sum().item())


def _scalar(v: Any) -> Any:
    """A JSON-safe form of a hyperparameter or scalar state value (NaN/Inf as their repr)."""
    if isinstance(v, torch.Tensor):
        return _scalar(v.item()) if v.numel() == 1 else f"tensor{tuple(v.shape)}"
    if isinstance(v, (list, tuple)):
        return [_scalar(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _scalar(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else repr(v)
    return repr(v)


def _dtype(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


def _is_dtensor(v: Any) -> bool:
    return type(v).__name__ == "DTensor" and hasattr(v, "_local_tensor")


def describe_value(name: str, v: Any) -> StateInfo:
    """What one state value is (values are read: NaN/Inf are counted)."""
    if isinstance(v, ShardedRecord):
        return StateInfo(name, "sharded tensor", _dtype(v.dtype), v.shape, math.prod(v.shape),
                         sum(t.numel() * t.element_size() for t in v.local),
                         nonfinite=sum(_nonfinite(t) for t in v.local),
                         rank_numel=(sum(t.numel() for t in v.local),), chunks=v.chunks,
                         world_size=v.world_size)
    if _is_dtensor(v):
        local = v._local_tensor
        return StateInfo(name, "dtensor", _dtype(v.dtype), tuple(v.shape), math.prod(v.shape),
                         local.numel() * local.element_size(), nonfinite=_nonfinite(local),
                         rank_numel=(local.numel(),),
                         world_size=math.prod(tuple(v.device_mesh.shape)),
                         placements=", ".join(str(p) for p in v.placements))
    if isinstance(v, torch.Tensor):
        nbytes = v.numel() * v.element_size()
        if v.dim() == 0:
            return StateInfo(name, "scalar tensor", _dtype(v.dtype), (), 1, nbytes,
                             value=_scalar(v), nonfinite=_nonfinite(v))
        return StateInfo(name, "tensor", _dtype(v.dtype), tuple(v.shape), v.numel(), nbytes,
                         nonfinite=_nonfinite(v))
    if isinstance(v, (bool, int, float, str)):
        return StateInfo(name, type(v).__name__, value=_scalar(v))
    if v is None:
        return StateInfo(name, "none")
    return StateInfo(name, f"other:{type(v).__name__}")


def _step_of(state: Iterable[StateInfo]) -> tuple[Any, str | None]:
    for s in state:
        if s.name == "step":
            return s.value, "tensor" if s.kind == "scalar tensor" else s.kind
    return None, None


def _key_type(keys: Iterable[Any]) -> str:
    kinds = {"int" if isinstance(k, int) else "fqn" if isinstance(k, str) else type(k).__name__
             for k in keys}
    return "none" if not kinds else kinds.pop() if len(kinds) == 1 else "mixed"


def _groups(raw: Sequence[Mapping]) -> tuple[GroupInfo, ...]:
    return tuple(GroupInfo(i, {str(k): _scalar(v) for k, v in g.items() if k != "params"},
                           tuple(g.get("params", ()))) for i, g in enumerate(raw))


def _group_index(groups: Sequence[GroupInfo]) -> dict[Any, tuple[int, ...]]:
    out: dict[Any, list[int]] = {}
    for g in groups:
        for k in g.params:
            out.setdefault(k, []).append(g.index)
    return {k: tuple(v) for k, v in out.items()}


def _ordered(params: Sequence[ParamInfo], groups: Sequence[GroupInfo]) -> tuple[ParamInfo, ...]:
    """Params in group order, then those in no group (see the module docstring)."""
    pos = {k: i for i, k in enumerate(dict.fromkeys(k for g in groups for k in g.params))}
    return tuple(sorted(params, key=lambda p: pos.get(p.key, len(pos))))


def guess_optimizer(groups: Sequence[GroupInfo]) -> str | None:
    """The optimizer class the param groups' keys point to (torch.optim defaults)."""
    if not groups:
        return None
    hyper = groups[0].hyper
    keys = set(hyper)
    if {"betas", "amsgrad"} <= keys:
        if "decoupled_weight_decay" not in keys:
            return "Adam or AdamW"
        return "AdamW" if hyper["decoupled_weight_decay"] else "Adam"
    if {"momentum", "dampening", "nesterov"} <= keys:
        return "SGD"
    if {"lr_decay", "initial_accumulator_value"} <= keys:
        return "Adagrad"
    if {"alpha", "centered"} <= keys:
        return "RMSprop"
    if "rho" in keys:
        return "Adadelta"
    return None


def _stateless(groups: Sequence[GroupInfo], optimizer: str | None) -> bool:
    """SGD with momentum 0 in every group keeps no state at all."""
    return optimizer == "SGD" and bool(groups) and all(
        not g.hyper.get("momentum") for g in groups)


# ------------------------------------------------------------------------------------
# findings
# ------------------------------------------------------------------------------------
def _few(items: Iterable, n: int = 6) -> str:
    items = list(items)
    s = ", ".join(repr(x) for x in items[:n])
    return s + (f", ... ({len(items)} in all)" if len(items) > n else "")


def findings_for(params: Sequence[ParamInfo], groups: Sequence[GroupInfo], key_type: str,
                 optimizer: str | None) -> list[Finding]:
    """The findings every format shares (see the module docstring)."""
    out: list[Finding] = []
    stateless = _stateless(groups, optimizer)
    listed = _group_index(groups)
    with_state = [p.key for p in params if p.state]
    if key_type == "mixed":
        keys = list(dict.fromkeys(list(listed) + with_state))
        out.append(Finding("warning", "mixed-keys",
                           f"keys mix int ids ({_few([k for k in keys if isinstance(k, int)], 3)}) "
                           f"and names ({_few([k for k in keys if isinstance(k, str)], 3)}): "
                           "no optimizer or FSDP API loads such a dict"))
    if not with_state:
        if stateless:
            out.append(Finding("note", "empty-state", "state is empty: normal for SGD with "
                               "momentum 0 (stateless)"))
        else:
            out.append(Finding("warning", "empty-state",
                               f"state is empty{f' for {optimizer}' if optimizer else ''}: "
                               "the optimizer never stepped, or its state was not saved"))
    else:
        have = set(with_state)
        missing = [k for k in listed if k not in have]
        if missing:
            level = "note" if stateless else "warning"
            why = ("normal for SGD with momentum 0" if stateless else
                   "normal for frozen params and params that never got a gradient; otherwise "
                   "their state was lost")
            out.append(Finding(level, "no-state",
                               f"{len(missing)} of {len(listed)} params in param groups have no "
                               f"state ({why}): {_few(missing)}"))
    orphans = [k for k in with_state if k not in listed]
    if orphans:
        out.append(Finding("warning", "not-in-group",
                           f"{len(orphans)} params have state but are in no param group: "
                           f"{_few(orphans)}"))
    twice = [k for k, gs in listed.items() if len(gs) > 1]
    if twice:
        out.append(Finding("warning", "in-two-groups",
                           f"params listed in more than one param group: {_few(twice)}"))
    for g in groups:
        if not g.params:
            out.append(Finding("warning", "empty-group", f"param group {g.index} has no params "
                               f"(hyperparameters {_few(sorted(g.hyper), 4)})"))
    names = Counter(tuple(sorted(s.name for s in p.state)) for p in params if p.state)
    if len(names) > 1:
        example = {n: next(p.key for p in params if tuple(sorted(s.name for s in p.state)) == n)
                   for n in names}
        out.append(Finding("warning", "state-names-differ",
                           "params hold different state: " + "; ".join(
                               f"{list(n)} x{c} (e.g. {example[n]!r})"
                               for n, c in names.most_common())))
    out += _step_findings(params)
    bad = [(p.key, s.name, s.nonfinite) for p in params for s in p.state if s.nonfinite]
    if bad:
        out.append(Finding("warning", "nonfinite",
                           f"NaN/Inf in {len(bad)} state tensors: " + ", ".join(
                               f"{k!r}[{n!r}] ({c} elements)" for k, n, c in bad[:6])
                           + (" ..." if len(bad) > 6 else "")))
    dtypes = Counter(s.dtype for p in params for s in p.state
                     if s.per_element and s.dtype in _FLOAT_DTYPES)
    if len(dtypes) > 1:
        out.append(Finding("warning", "dtype-mixture",
                           "per-element state in several dtypes: " + ", ".join(
                               f"{d} x{n}" for d, n in sorted(dtypes.items()))))
    prefixed = [p.key for p in params if isinstance(p.key, str) and FLAT_MARKER not in p.key
                and any(w in p.key for w in WRAPPER_PREFIXES)]
    prefixed += [k for k in listed if isinstance(k, str) and FLAT_MARKER not in k
                 and any(w in k for w in WRAPPER_PREFIXES) and k not in prefixed]
    if prefixed:
        out.append(Finding("warning", "wrapper-prefix",
                           f"{len(prefixed)} names carry wrapper prefixes ({_few(WRAPPER_PREFIXES, 3)}"
                           f"): the wrapped model's names, not the plain FQNs a loader of another "
                           f"wrapping expects: {_few(prefixed, 3)}"))
    return out


_FLOAT_DTYPES = {"float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"}


def _step_findings(params: Sequence[ParamInfo]) -> list[Finding]:
    out = []
    steps = [(p.key, p.step) for p in params if p.step is not None]
    values = Counter(v for _, v in steps)
    if len(values) > 1:
        first = {v: next(k for k, x in steps if x == v) for v in values}
        out.append(Finding("warning", "step-disagree",
                           "step differs across params: " + ", ".join(
                               f"{v!r} x{n} (e.g. {first[v]!r})" for v, n in values.most_common())))
    kinds = Counter(p.step_kind for p in params if p.step_kind is not None)
    if len(kinds) > 1:
        first = {k: next(p.key for p in params if p.step_kind == k) for k in kinds}
        out.append(Finding("warning", "step-kind-mixed",
                           "step is a tensor for some params and a Python number for others: "
                           + ", ".join(f"{k} x{n} (e.g. {first[k]!r})"
                                       for k, n in sorted(kinds.items()))))
    return out


# ------------------------------------------------------------------------------------
# one file
# ------------------------------------------------------------------------------------
def _params_from_state(state: Mapping, listed: Mapping[Any, tuple[int, ...]]) -> list[ParamInfo]:
    """One ParamInfo per key of ``state`` (described), then per listed key without state."""
    params = []
    for k, st in state.items():
        infos = tuple(describe_value(str(n), v) for n, v in st.items()) \
            if isinstance(st, Mapping) else (describe_value("<value>", st),)
        step, kind = _step_of(infos)
        params.append(ParamInfo(k, listed.get(k, ()), infos, step, kind))
    params += [ParamInfo(k, gs, ()) for k, gs in listed.items() if k not in state]
    return params


def _recorded_world(params: Iterable[ParamInfo]) -> set[int | None]:
    return {s.world_size for p in params for s in p.state if s.kind in SHARDED_KINDS}


def _file_layout(params: Sequence[ParamInfo], key_type: str,
                 unsafe: bool) -> tuple[list[str], list[Finding], int | None]:
    """Layout lines, findings and the saving world size (when recorded) of one file."""
    lines: list[str] = []
    findings: list[Finding] = []
    flat = [p.key for p in params if isinstance(p.key, str) and FLAT_MARKER in p.key]
    sharded = Counter(next(s.kind for s in p.state if s.kind in SHARDED_KINDS) for p in params
                      if any(s.kind in SHARDED_KINDS for s in p.state))
    recorded = sorted(w for w in _recorded_world(params) if w is not None)
    if flat:
        findings.append(Finding("warning", "one-rank-file",
                                f"keys name FSDP1 flat parameters ({_few(flat, 3)}): this is one "
                                "rank's local dict (a FlatParameter shard), not a full dict; "
                                "inspect the directory of every rank's file"))
        lines.append("FlatParameter keys: one rank's local FSDP1 dict")
    what = " and ".join(f"{n} params as {'ShardedTensor' if k == 'sharded tensor' else 'DTensor'}"
                        for k, n in sorted(sharded.items()))
    if sharded and recorded == [1]:
        lines.append(f"{what} saved at world size 1: the file holds the whole state")
    elif sharded:
        findings.append(Finding("warning", "one-rank-file",
                                f"{what}: this file holds one rank's shards of a checkpoint saved "
                                f"at world size {_few(recorded) or '?'}, not the whole state; "
                                "inspect the directory of every rank's file"))
        lines.append(f"{what} (global shapes recorded): one rank's file of a sharded "
                     f"checkpoint saved at world size {_few(recorded) or '?'}")
    elif not flat and key_type == "fqn":
        lines.append("whole (unsharded) tensors keyed by FQN: a full dict, loadable at any "
                     "world size")
    elif not flat and key_type == "int":
        lines.append("keyed by int ids (optim.state_dict()): the names are not in the file; "
                     "a plain model's dict, or one rank's local dict")
    if unsafe:
        lines.append("read with --unsafe-load")
    return lines, findings, recorded[0] if len(recorded) == 1 else None


def _summarise_file(path: Path, key: str | None, unsafe: bool) -> Summary:
    lf = load_file(path, None, unsafe)
    obj, was_unsafe = lf.obj, lf.unsafe
    where, osd = select_optimizer_dict(obj, key, path)
    groups = _groups(osd["param_groups"])
    params = _ordered(_params_from_state(osd["state"], _group_index(groups)), groups)
    key_type = _key_type([p.key for p in params])
    optimizer = guess_optimizer(groups)
    findings = findings_for(params, groups, key_type, optimizer)
    layout, more, world = _file_layout(params, key_type, was_unsafe)
    desc = ("torch.save'd optimizer dict" if not where else
            f"torch.save'd {type(obj).__name__} holding an optimizer dict at {location_str(where)}")
    return Summary(str(path), "file", desc, location_str(where), key_type, optimizer,
                   params, groups, world, tuple(layout), _bytes(params), True, was_unsafe,
                   (str(path),), tuple(_damage_findings([path], [lf]) + findings + more))


def _bytes(params: Iterable[ParamInfo]) -> int:
    return sum(s.nbytes for p in params for s in p.state)


# ------------------------------------------------------------------------------------
# per-rank files
# ------------------------------------------------------------------------------------
def _merge_state(name: str, per_rank: Sequence[StateInfo | None]) -> StateInfo:
    """One state value over every rank's file (``None``: the rank has no such value)."""
    present = [s for s in per_rank if s is not None]
    first = present[0]
    rank_numel = tuple(None if s is None else s.numel for s in per_rank)
    nonfinite = sum(s.nonfinite or 0 for s in present)
    nbytes = sum(s.nbytes for s in present)
    if first.kind in SHARDED_KINDS:
        local = tuple(None if s is None else s.rank_numel[0] for s in per_rank)
        return StateInfo(name, first.kind, first.dtype, first.shape, first.numel, nbytes,
                         nonfinite=nonfinite, rank_numel=local, chunks=first.chunks,
                         world_size=first.world_size, placements=first.placements)
    if first.kind == "tensor":
        shapes = {s.shape for s in present}
        whole = len(shapes) == 1 and len(present) == len(per_rank) and (
            len(first.shape) > 1 or len(per_rank) == 1)
        return StateInfo(name, "tensor", first.dtype, first.shape if whole else None,
                         first.numel if whole else sum(s.numel for s in present), nbytes,
                         nonfinite=nonfinite, rank_numel=rank_numel)
    return StateInfo(name, first.kind, first.dtype, first.shape, first.numel, nbytes,
                     value=first.value, nonfinite=nonfinite if first.nonfinite is not None else None)


def _rank_layout(params: Sequence[ParamInfo], world: int) -> tuple[list[str], list[Finding]]:
    """The layout the per-rank sizes imply (see the module docstring)."""
    kinds: Counter = Counter()
    flat_total = 0
    placements: set[str] = set()
    firsts = [s for p in params if (s := next((s for s in p.state if s.per_element), None))]
    # whole multi-dim tensors on every rank: nothing is sharded, 1-D ones are whole too
    replicated = any(s.kind == "tensor" and s.shape is not None for s in firsts)
    for s in firsts:
        sizes = [n for n in (s.rank_numel or ()) if n is not None]
        equal = len(sizes) == world and len(set(sizes)) == 1
        if s.kind in SHARDED_KINDS:
            kinds[s.kind] += 1
            if s.placements:
                placements.add(s.placements)
        elif world == 1:
            kinds["whole"] += 1
        elif s.shape is not None or (replicated and equal):
            kinds["replicated"] += 1
        elif equal:
            kinds["flat"] += 1
            flat_total += sizes[0] * world
        else:
            kinds["orig"] += 1
    recorded = sorted(w for w in _recorded_world(params) if w is not None)
    texts = {  # kind: what that many params are
        "whole": "in one rank file: world size 1, nothing sharded",
        "flat": f"as FSDP1 FlatParameter shards: the same number of elements on every rank "
                f"({flat_total} in all, a multiple of {world}: each flat param was padded to a "
                f"multiple of the world size)",
        "orig": "as per-rank slices of different sizes (use_orig_params=True: a rank that owns "
                "none of a param's elements has no state for it)",
        "replicated": "whole on every rank (replicated: NO_SHARD, DDP or not sharded)",
        "sharded tensor": f"as ShardedTensor (FSDP1 sharded_optim_state_dict): chunks of dim 0, "
                          f"saved at world size {_few(recorded)}",
        "dtensor": f"as DTensor (FSDP2 sharded optimizer state), placements "
                   f"{_few(sorted(placements))} on a mesh of {_few(recorded)} ranks",
    }
    lines = [f"{kinds[k]} params {text}" for k, text in texts.items() if kinds[k]] or \
        ["no per-element state: nothing to infer a sharding from"]
    findings = []
    if recorded and recorded != [world]:
        findings.append(Finding("warning", "world-size-mismatch",
                                f"the sharded tensors were saved at world size {_few(recorded)} "
                                f"but there are {world} rank files"))
    return lines, findings


def _rank_gap(directory: Path, pattern: str, world: int) -> list[Finding]:
    rx = re.compile("^" + re.escape(pattern).replace(r"\{rank\}", r"(\d+)") + "$")
    extra = sorted(int(m.group(1)) for f in directory.iterdir() if (m := rx.match(f.name)))
    extra = [r for r in extra if r > world]
    if not extra:
        return []
    return [Finding("warning", "rank-gap",
                    f"files for ranks {_few(extra)} exist but {pattern.format(rank=world)!r} "
                    f"does not: only ranks 0..{world - 1} were read")]


def _rank_files_or_hint(path: Path, pattern: str) -> list[Path]:
    try:
        return rank_files(path, pattern)
    except UsageError as e:
        found = sorted(f.name for f in path.iterdir() if f.is_file())[:8]
        dcp = sorted(f.name for f in path.iterdir() if (f / ".metadata").is_file())[:4]
        hint = f"; DCP checkpoints below it: {dcp}" if dcp else ""
        raise UsageError(f"{str(e).split(': ', 1)[-1]}; files here: {found or 'none'} (a file: "
                         f"pass it; other per-rank names: --pattern){hint}", path=path) from e


def _summarise_ranks(path: Path, key: str | None, pattern: str, unsafe: bool) -> Summary:
    files = _rank_files_or_hint(path, pattern)
    world = len(files)
    loaded = [load_file(f, r, unsafe) for r, f in enumerate(files)]
    osds = [select_optimizer_dict(lf.obj, key, files[r], r) for r, lf in enumerate(loaded)]
    groups = _groups(osds[0][1]["param_groups"])
    findings = _damage_findings(files, loaded)
    listed = _group_index(groups)
    for r, (_, osd) in enumerate(osds[1:], start=1):
        other = _groups(osd["param_groups"])
        if [(g.hyper, g.params) for g in other] != [(g.hyper, g.params) for g in groups]:
            findings.append(Finding("warning", "rank-groups-disagree",
                                    f"rank {r}'s param groups differ from rank 0's "
                                    f"({files[r].name} vs {files[0].name})"))
        for k, gs in _group_index(other).items():
            listed.setdefault(k, gs)
    per_rank = [{p.key: {s.name: s for s in p.state}
                 for p in _params_from_state(osd["state"], {}) if p.state} for _, osd in osds]
    keys = dict.fromkeys(k for ps in per_rank for k in ps)
    params, disagree = [], []
    for k in keys:
        by_rank = [ps.get(k, {}) for ps in per_rank]
        names = dict.fromkeys(n for d in by_rank for n in d)
        state = tuple(_merge_state(n, [d.get(n) for d in by_rank]) for n in names)
        steps = {i: _step_of(d.values())[0] for i, d in enumerate(by_rank) if "step" in d}
        if len(set(steps.values())) > 1:
            disagree.append(f"{k!r} (" + ", ".join(f"rank {i}: {v!r}" for i, v in steps.items())
                            + ")")
        step, kind = _step_of(state)
        params.append(ParamInfo(k, listed.get(k, ()), state, step, kind,
                                tuple(i for i, d in enumerate(by_rank) if d)))
    if disagree:
        findings.append(Finding("warning", "rank-step-disagree",
                                f"step differs across ranks for {len(disagree)} params: "
                                + "; ".join(disagree[:4]) + (" ..." if len(disagree) > 4 else "")))
    params += [ParamInfo(k, gs, (), ranks_with_state=()) for k, gs in listed.items() if k not in keys]
    params = _ordered(params, groups)
    key_type = _key_type([p.key for p in params])
    optimizer = guess_optimizer(groups)
    findings = findings_for(params, groups, key_type, optimizer) + findings
    partial = [p.key for p in params if p.state and len(p.ranks_with_state or ()) < world]
    if partial:
        findings.append(Finding("note", "partial-ranks",
                                f"{len(partial)} params have state on some ranks only (normal "
                                f"for use_orig_params=True slices): {_few(partial)}"))
    lines, more = _rank_layout(params, world)
    findings += more + _rank_gap(path, pattern, world)
    unsafe_used = any(lf.unsafe for lf in loaded)
    layout = [f"{world} per-rank files ({pattern}): world size {world}"] + lines
    if unsafe_used:
        layout.append("read with --unsafe-load")
    locs = sorted({location_str(w) for w, _ in osds})
    desc = f"{world} per-rank files" + (f", optimizer dict at {_few(locs)}" if locs != [""] else "")
    return Summary(str(path), "rank-files", desc, ",".join(locs), key_type, optimizer,
                   params, groups, world, tuple(layout), _bytes(params), True, unsafe_used,
                   tuple(str(f) for f in files), tuple(findings))


# ------------------------------------------------------------------------------------
# DCP
# ------------------------------------------------------------------------------------
def _dcp_ranks(path: Path, md: Any) -> tuple[dict, set[int]]:
    """``({(flat key, offsets): rank}, every rank that wrote a data file)``; UsageError when
    a data file the metadata names is missing."""
    where = {}
    named = set()
    for idx, info in (getattr(md, "storage_data", None) or {}).items():
        rel = str(getattr(info, "relative_path", ""))
        named.add(rel)
        m = _DISTCP.search(rel)
        where[(idx.fqn, tuple(idx.offset or ()))] = int(m.group(1)) if m else None
    missing = sorted(r for r in named if r and not (path / r).is_file())
    if missing:
        raise UsageError(f"data files named by .metadata are missing: {_few(missing, 4)}",
                         path=path)
    ranks = {int(m.group(1)) for f in path.iterdir() if (m := _DISTCP.search(f.name))}
    return where, ranks


def _ranks(n: int) -> str:
    return f"{n} rank" + ("" if n == 1 else "s")


def _chunk_semantics(shape: tuple[int, ...], chunks: Sequence[Chunk], world: int) -> bool:
    """Whether ``chunks`` are ``torch.chunk(tensor, world, dim=0)`` (every other dim whole;
    empty chunks ignored)."""
    if not shape:
        return True
    want = [c.shape[0] for c in torch.empty(shape[0], 0).chunk(world)] if shape[0] else []
    got = sorted(chunks, key=lambda c: c.offsets)
    got = [c for c in got if math.prod(c.sizes) > 0 or len(got) == 1]
    return ([c.sizes[0] for c in got] == want or (not want and len(got) <= 1)) and all(
        tuple(c.sizes[1:]) == tuple(shape[1:]) for c in got)


def _summarise_dcp(path: Path, key: str | None, values: bool) -> Summary:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    dcp = DcpFull(path, key, option="--key")
    md = dcp.metadata
    where, ranks = _dcp_ranks(path, md)
    world = max(ranks) + 1 if ranks else None
    entries = dcp.entries()
    read = dcp.fetch(list(entries), skip=() if values else dcp.per_element())
    groups = _groups(dcp.param_groups())
    listed = _group_index(groups)
    params, chunked, other = [], 0, []
    for fqn, ents in entries.items():
        infos = []
        for flat, name, _ in ents:
            meta = md.state_dict_metadata[flat]
            got = describe_value(name, read[fqn][name]) if name in read.get(fqn, {}) else None
            if isinstance(meta, TensorStorageMetadata):
                shape = tuple(meta.size)
                dtype = meta.properties.dtype
                numel = math.prod(shape)
                chunks = tuple(Chunk(where.get((flat, tuple(c.offsets))), tuple(c.offsets),
                                     tuple(c.sizes)) for c in meta.chunks)
                infos.append(StateInfo(name, "tensor" if shape else "scalar tensor", _dtype(dtype),
                                       shape, numel, numel * dtype.itemsize,
                                       value=None if got is None else got.value,
                                       nonfinite=None if got is None else got.nonfinite,
                                       chunks=chunks if shape else ()))
                if shape and world:
                    if _chunk_semantics(shape, chunks, world):
                        chunked += 1
                    else:
                        other.append(f"{fqn}[{name!r}]")
            else:
                infos.append(got if got is not None else StateInfo(name, "unread"))
        step, kind = _step_of(infos)
        params.append(ParamInfo(fqn, listed.get(fqn, ()), tuple(infos), step, kind))
    params += [ParamInfo(k, gs, ()) for k, gs in listed.items() if k not in entries]
    params = _ordered(params, groups)
    key_type = _key_type([p.key for p in params])
    optimizer = guess_optimizer(groups)
    findings = findings_for(params, groups, key_type, optimizer)
    data_files = sorted(f.name for f in path.iterdir() if _DISTCP.search(f.name))
    layout = [f"saved by {_ranks(world)} (data files {_few(data_files, 4)})" if world else
              "saving ranks unknown (no __<rank>_<n>.distcp data files)"]
    if chunked:
        layout.append(f"{chunked} state tensors stored as torch.chunk pieces of dim 0 over "
                      f"{_ranks(world)} (FSDP1 SHARDED / FSDP2 Shard(0))")
    if other:
        layout.append(f"{len(other)} state tensors placed otherwise: {_few(other, 4)}")
    layout.append("DCP stores global tensors: loadable at any world size")
    layout.append("tensor values " + ("read" if values else "not read (only steps and param "
                                      "groups; --values reads them and checks for NaN/Inf)"))
    prefix = ".".join(map(str, dcp.prefix))
    desc = "DCP checkpoint" + (f", optimizer dict under {prefix!r}" if prefix else "")
    return Summary(str(path), "dcp", desc, location_str(dcp.prefix), key_type, optimizer,
                   params, groups, world, tuple(layout), _bytes(params), values, False,
                   tuple(str(path / f) for f in [".metadata"] + data_files), tuple(findings))


# ------------------------------------------------------------------------------------
# entry point
# ------------------------------------------------------------------------------------
def inspect_path(path: str | Path, *, key: str | None = None, pattern: str = DEFAULT_PATTERN,
                 unsafe_load: bool = False, values: bool = False) -> Summary:
    """Summarise the optimizer checkpoint at ``path`` (a file, a directory of per-rank files
    or a DCP directory; see the module docstring). Raises :class:`convert.UsageError` when
    it cannot be read."""
    path = Path(path)
    kind = detect_input(path)
    if kind == "full":
        return _summarise_file(path, key, unsafe_load)
    if kind == "dcp":
        return _summarise_dcp(path, key, values)
    return _summarise_ranks(path, key, pattern, unsafe_load)


__all__ = ["Chunk", "Finding", "GroupInfo", "LoadedFile", "ParamInfo", "SCHEMA", "ShardedRecord",
           "StateInfo", "Summary", "describe_value", "find_optimizer_dicts", "inspect_path",
           "load_file"]
