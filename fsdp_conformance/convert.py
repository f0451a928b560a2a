"""Offline conversion of a saved optimizer checkpoint to another world size or wrapping
(``fsdp-conformance reshard``). CPU only, no process group; the values are the reference's
(``reference.reshard`` / ``reference.shard_full_per_unit``), so the result is what FSDP
must load at the destination.

Rules
-----
Inputs (``detect_input``; ``kind`` forces one):
  * ``full``: a file, ``torch.save`` of a full FQN-keyed dict (``FSDP.full_optim_state_dict``,
    ``FSDP.optim_state_dict`` under FULL_STATE_DICT). Loaded with
    ``torch.load(mmap=True, weights_only=True)``: tensor bytes are read when a unit needs them.
  * ``dcp``: a directory holding ``.metadata``: a ``torch.distributed.checkpoint`` save of an
    FQN-keyed optimizer dict (FSDP1 SHARDED/FULL ``optim_state_dict``, FSDP2
    ``get_optimizer_state_dict``, or any dict with ``state``/``param_groups``), alone or
    under a top-level key (``{"optim": osd}``; ``dcp_key`` picks one when several hold an
    optimizer dict). DCP stores global tensors, so this is a full dict read one
    destination unit at a time (``_load_state_dict_from_keys``, no process group).
  * ``ranks``: a directory of per-rank files named by ``pattern`` (default
    ``optim_rank{rank}.pt``), ranks ``0..W-1``: each rank's ``torch.save`` of its local
    optimizer state dict, keyed by int ids (``optim.state_dict()``; id ``i`` is the i-th
    key of ``ModelLayout.optimizer_keys()``, i.e. an optimizer over ``fsdp_model.parameters()``
    in order) or by names (FQNs; ``"<unit>._flat_param"`` for flat units). Each file is
    loaded lazily, with ``torch.load(mmap=True, weights_only=True)``.
  FSDP wrapper prefixes (``_fsdp_wrapped_module.`` ...) are removed from every name read.
Layouts (``LayoutSpec``): the model is a zoo name or ``"module:callable"`` (a factory called
  with no arguments, built on the meta device when it allows it, so no parameter memory is
  used); the plan is a zoo plan name or a comma-separated list of submodule FQNs that are
  their own FSDP unit (the root always is). ``dtype`` is the dtype that sets FSDP's
  alignment with ``use_orig_params=True`` (the param dtype, or ``MixedPrecision.param_dtype``);
  ``None`` takes the dtype of the checkpoint's first per-element state tensor.
Outputs (``out_format``):
  * ``ranks``: a new directory with one file per destination rank (``pattern``), each a
    ``torch.save`` of the rank's local dict, keyed by int ids (``keys="ids"``, loadable with
    ``optim.load_state_dict`` on an optimizer over ``fsdp_model.parameters()``) or by names;
    ``keys="auto"``: like the input's per-rank files, ids for a full or DCP input. Plus
    ``manifest.json`` describing the destination layout.
  * ``full``: a new file, ``torch.save`` of the full FQN-keyed dict (the reference gather).
Safety: the output path must not exist (nor be a dangling link); nothing is ever written
  over the input or any existing path. Files are written into a temporary sibling
  (``.<name>.tmp-*``), fsynced, and put in place with one no-replace rename (a directory:
  ``renameat2(RENAME_NOREPLACE)`` where the kernel has it; a file: ``link`` + ``unlink``),
  so the output appears complete or not at all.
Errors: :class:`UsageError` (bad arguments, unreadable or missing input, refused output;
  exit 2) and :class:`CheckpointMismatch` (the checkpoint does not fit the layout; exit 1).
  Both name the file, and where they apply the rank, the param (FQN or optimizer key) and
  the state key.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import importlib
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Sequence

import torch
from torch import nn

from . import reference as ref
from .reference.errors import StateDictMismatch
from .reference.keys import check_key_types, per_element_names_from_full
from .reference.reshard import shard_full_per_unit
from .reference.shard import check_full

DEFAULT_PATTERN = "optim_rank{rank}.pt"
WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
DTYPES = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16,
          "fp16": torch.float16}


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


def clean_name(name: str) -> str:
    """``name`` without FSDP/activation-checkpointing/compile wrapper prefixes."""
    for p in WRAPPER_PREFIXES:
        name = name.replace(p, "")
    return name


# ------------------------------------------------------------------------------------
# layouts
# ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayoutSpec:
    """Where a checkpoint lives: model, wrapping plan, world size, FSDP flags."""

    model: str
    plan: str | Sequence[str] = "root"
    world_size: int = 1
    use_orig_params: bool = False
    strategy: str = "FULL_SHARD"
    shard_world_size: int | None = None
    ignored: Sequence[str] | None = None  # None: the zoo model's ignored modules, else ()
    dtype: torch.dtype | None = None

    def describe(self) -> str:
        plan = self.plan if isinstance(self.plan, str) else ",".join(self.plan) or "root"
        s = (f"{self.model}:{plan}, {self.world_size} rank{'s' if self.world_size != 1 else ''}, "
             f"{'orig params' if self.use_orig_params else 'flat'}, {self.strategy}")
        if self.shard_world_size:
            s += f" (shard groups of {self.shard_world_size})"
        return s


def build_module(model: str, dtype: torch.dtype | None = None) -> tuple[nn.Module, dict, tuple]:
    """``(module, plans, ignored)`` for a zoo name or a ``"module:callable"`` factory.

    The module is built on the meta device when the factory allows it (shapes only). A zoo
    model without ``dtype`` gets the zoo's default dtype (float64); a factory keeps its own.
    """
    from .zoo import MODELS

    if ":" not in model:
        if model not in MODELS:
            raise UsageError(f"unknown model {model!r}: not a zoo model ({', '.join(sorted(MODELS))}) "
                             "and not 'module:callable'")
        spec = MODELS[model]
        factory, plans, ignored = spec.factory, dict(spec.plans), tuple(spec.ignored)
        dtype = dtype or torch.float64
    else:
        mod_name, _, attr = model.partition(":")
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            mod = importlib.import_module(mod_name)
        except Exception as e:  # noqa: BLE001  (any import failure is a usage error)
            raise UsageError(f"--model {model!r}: cannot import {mod_name!r}: {e}") from e
        factory = mod
        for part in attr.split("."):
            factory = getattr(factory, part, None)
        if not callable(factory):
            raise UsageError(f"--model {model!r}: {attr!r} is not a callable in {mod_name!r}")
        plans, ignored = {}, ()
    try:
        with torch.device("meta"):
            module = factory()
    except Exception:  # noqa: BLE001  (factories that cannot build on meta build for real)
        module = factory()
    if not isinstance(module, nn.Module):
        raise UsageError(f"--model {model!r} returned {type(module).__name__}, not an nn.Module")
    if dtype is not None:
        module = module.to(dtype)
    return module, plans, ignored


def parse_plan(plan: str | Sequence[str], plans: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """A zoo plan name -> its FQNs; otherwise a comma-separated FQN list ("" or "root": none)."""
    if isinstance(plan, str):
        if plan in plans:
            return tuple(plans[plan])
        if plan in ("", "root"):
            return ()
        return tuple(p.strip() for p in plan.split(",") if p.strip())
    return tuple(plan)


def build_layout_for(spec: LayoutSpec, dtype: torch.dtype | None = None) -> ref.ModelLayout:
    """The reference layout of ``spec`` (``dtype`` fills in ``spec.dtype`` when that is None)."""
    module, plans, zoo_ignored = build_module(spec.model, spec.dtype or dtype)
    wrap = parse_plan(spec.plan, plans)
    ignored = tuple(spec.ignored) if spec.ignored is not None else zoo_ignored
    try:
        return ref.build_layout(module, wrap, spec.world_size, use_orig_params=spec.use_orig_params,
                                strategy=spec.strategy, shard_world_size=spec.shard_world_size,
                                ignored=ignored)
    except ref.LayoutError as e:
        raise UsageError(f"layout {spec.describe()}: {e}") from e


# ------------------------------------------------------------------------------------
# inputs
# ------------------------------------------------------------------------------------
def detect_input(path: str | os.PathLike) -> str:
    """``"full"`` for a file, ``"dcp"`` for a directory with ``.metadata``, else ``"ranks"``."""
    p = Path(path)
    if not p.exists():
        raise UsageError("input does not exist", path=p)
    if p.is_file():
        return "full"
    if (p / ".metadata").is_file():
        return "dcp"
    return "ranks"


def rank_files(directory: str | os.PathLike, pattern: str = DEFAULT_PATTERN,
               world_size: int | None = None) -> list[Path]:
    """The per-rank files ``pattern.format(rank=r)`` for ``r < world_size`` (all must exist),
    or, without ``world_size``, for the ranks ``0, 1, ...`` that exist."""
    d = Path(directory)
    if "{rank" not in pattern:
        raise UsageError(f"--pattern {pattern!r} must contain '{{rank}}'")
    if world_size is None:
        files = []
        while (d / pattern.format(rank=len(files))).is_file():
            files.append(d / pattern.format(rank=len(files)))
        if not files:
            raise UsageError(f"no per-rank file {pattern.format(rank=0)!r} (pattern {pattern!r}) and "
                             "no DCP .metadata in this directory", path=d)
        return files
    files = [d / pattern.format(rank=r) for r in range(world_size)]
    for r, f in enumerate(files):
        if not f.is_file():
            raise UsageError(f"missing the file of rank {r} (source world size {world_size})",
                             path=f, rank=r)
    extra = d / pattern.format(rank=world_size)
    if extra.exists():
        raise UsageError(f"a file for rank {world_size} exists but the source world size is "
                         f"{world_size}: wrong --src-world-size?", path=extra, rank=world_size)
    return files


def _torch_load(path: Path, rank: int | None = None) -> Any:
    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as e:  # noqa: BLE001  (truncated, corrupt, not a torch file, unsafe pickle)
        who = "the optimizer state" if rank is None else f"rank {rank}'s optimizer state"
        raise UsageError(f"cannot read {who}: "
                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                         path=path, rank=rank) from e


def _clean_osd(osd: Any, path: Path, rank: int | None) -> dict:
    """Checks the outer shape of an optimizer dict; removes wrapper prefixes from names."""
    if not isinstance(osd, Mapping) or "state" not in osd or not isinstance(osd["state"], Mapping):
        got = sorted(map(str, osd))[:6] if isinstance(osd, Mapping) else type(osd).__name__
        raise UsageError(f"not an optimizer state dict (no 'state' mapping; found {got})",
                         path=path, rank=rank)
    try:
        kt = check_key_types(osd["state"], rank=rank)
    except StateDictMismatch as e:
        raise CheckpointMismatch(str(e), path=path, rank=rank, key="state") from e

    def name(k):
        return clean_name(k) if isinstance(k, str) else k

    state = {name(k): v for k, v in osd["state"].items()} if kt is str else dict(osd["state"])
    groups = []
    for g in osd.get("param_groups", []):
        g2 = dict(g)
        if "params" in g2:
            g2["params"] = [name(k) for k in g2["params"]]
        groups.append(g2)
    return {"state": state, "param_groups": groups}


def rank_loader(files: Sequence[Path], layout: ref.ModelLayout) -> tuple[Callable[[int], dict], dict]:
    """``(load(rank) -> neutral local dict, info)``; ``info["key_type"]`` is filled with
    ``int`` or ``str`` by the first load (rank 0)."""
    keys = layout.optimizer_keys()
    info: dict[str, Any] = {"key_type": None}

    def load(r: int) -> dict:
        osd = _clean_osd(_torch_load(files[r], r), files[r], r)
        kt = check_key_types(osd["state"])
        if kt is None and osd["param_groups"]:
            kt = type(osd["param_groups"][0]["params"][0]) if osd["param_groups"][0].get("params") else None
        if info["key_type"] is None:
            info["key_type"] = kt
        try:
            return ref.to_named(osd, keys, rank=r)
        except StateDictMismatch as e:
            hint = ""
            if kt is int:
                n = 1 + max([k for g in osd["param_groups"] for k in g.get("params", [])]
                            + list(osd["state"]), default=-1)
                hint = (f"; the checkpoint has {n} optimizer ids, the source layout {len(keys)} "
                        f"({keys[:6]}{' ...' if len(keys) > 6 else ''}): check --model, --plan, "
                        "--use-orig-params")
            raise CheckpointMismatch(f"does not fit the source layout: {e}{hint}", path=files[r],
                                     rank=r, param=e.param, key=e.key) from e

    return load, info


class DcpFull:
    """A DCP checkpoint's optimizer dict, read per param (see the module docstring)."""

    def __init__(self, path: str | os.PathLike, key: str | None = None,
                 option: str = "--dcp-key"):
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        self.path = Path(path)
        try:
            md = FileSystemReader(str(self.path)).read_metadata()
        except Exception as e:  # noqa: BLE001
            raise UsageError(f"cannot read DCP metadata: {type(e).__name__}: {e}", path=self.path) from e
        pdata = md.planner_data or {}
        found: dict[tuple, dict] = {}
        for flat, meta in md.state_dict_metadata.items():
            path_ = tuple(pdata.get(flat, (flat,)))
            for i, part in enumerate(path_):
                if part == "state" and len(path_) == i + 3:
                    d = found.setdefault(path_[:i], {"state": {}, "groups": []})
                    fqn, name = str(path_[i + 1]), path_[i + 2]
                    ndim = len(meta.size) if isinstance(meta, TensorStorageMetadata) else -1
                    d["state"].setdefault(fqn, []).append((flat, name, ndim))
                    break
                if part == "param_groups" and len(path_) > i + 1 and isinstance(path_[i + 1], int):
                    found.setdefault(path_[:i], {"state": {}, "groups": []})["groups"].append(flat)
                    break
        if key is not None:
            sel = [p for p in found if ".".join(map(str, p)) == key]
        else:
            sel = list(found)
        names = sorted(".".join(map(str, p)) or "<top level>" for p in found)
        if len(sel) != 1:
            if not found:
                raise UsageError("no optimizer state ('state'/'param_groups') in this DCP checkpoint; "
                                 f"its keys start {sorted(md.state_dict_metadata)[:6]}", path=self.path)
            raise UsageError(f"{option} {key!r} selects {len(sel)} of the optimizer dicts found "
                             f"({names}); pass one of them", path=self.path)
        self.metadata = md  # torch.distributed.checkpoint Metadata (shapes, dtypes, chunks)
        self.prefix = sel[0]
        entry = found[self.prefix]
        self._state_keys = {clean_name(f): v for f, v in entry["state"].items()}
        self._raw_fqn = {clean_name(f): f for f in entry["state"]}
        self._group_keys = entry["groups"]

    def fqns(self) -> list[str]:
        return list(self._state_keys)

    def entries(self) -> dict[str, list[tuple[str, str, int]]]:
        """``{fqn: [(DCP flat key, state name, ndim or -1 for a non-tensor), ...]}``."""
        return {f: list(v) for f, v in self._state_keys.items()}

    def per_element(self) -> set[str]:
        """State names stored as a positive-dim tensor for some param."""
        return {n for v in self._state_keys.values() for _, n, nd in v if nd > 0}

    def first_dtype(self) -> torch.dtype | None:
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        md = FileSystemReader(str(self.path)).read_metadata()
        for v in self._state_keys.values():
            for flat, _, nd in v:
                m = md.state_dict_metadata[flat]
                if nd > 0 and isinstance(m, TensorStorageMetadata) and m.properties.dtype.is_floating_point:
                    return m.properties.dtype
        return None

    def _load(self, keys: set[str]) -> dict:
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

        if not keys:
            return {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                sd = _load_state_dict_from_keys(keys, checkpoint_id=str(self.path))
            except Exception as e:  # noqa: BLE001
                raise UsageError(f"cannot read {sorted(keys)[:3]}...: {type(e).__name__}: {e}",
                                 path=self.path) from e
        for part in self.prefix:
            sd = sd[part]
        return sd

    def param_groups(self) -> list[dict]:
        groups = self._load(set(self._group_keys)).get("param_groups", [])
        if isinstance(groups, Mapping):  # a list saved with int keys
            groups = [groups[i] for i in sorted(groups)]
        out = []
        for g in groups:
            g2 = dict(g)
            if "params" in g2:
                g2["params"] = [clean_name(k) if isinstance(k, str) else k for k in g2["params"]]
            out.append(g2)
        return out

    def fetch(self, fqns: Sequence[str], skip: Collection[str] = ()) -> dict[str, dict]:
        """``{fqn: state}`` for those of ``fqns`` that have state, without the state names
        in ``skip`` (one DCP read)."""
        want = [f for f in fqns if f in self._state_keys]
        sd = self._load({flat for f in want for flat, n, _ in self._state_keys[f]
                         if n not in skip}).get("state", {})
        return {f: dict(sd[self._raw_fqn[f]]) for f in want if self._raw_fqn[f] in sd}


def _first_float_dtype(state: Mapping) -> torch.dtype | None:
    for st in state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0 and v.is_floating_point():
                return v.dtype
    return None


# ------------------------------------------------------------------------------------
# outputs
# ------------------------------------------------------------------------------------
def check_output_path(out: str | os.PathLike, inputs: Sequence[str | os.PathLike] = ()) -> Path:
    """``out`` as a Path; :class:`UsageError` if it exists (a dangling link included) or is
    an input. Its parent directory is created if missing."""
    out = Path(out)
    for inp in inputs:
        if Path(inp).resolve() == out.resolve():
            raise UsageError("refusing to write over the input", path=out)
    if os.path.lexists(out):
        raise UsageError("refusing to write over an existing path; choose a new one", path=out)
    return out


_RENAME_NOREPLACE = 1


def _rename_noreplace(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``, failing with FileExistsError if ``dst`` exists."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        fn = None
    if fn is not None:
        AT_FDCWD = -100
        rc = fn(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE)
        if rc == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(errno.EEXIST, "exists", str(dst))
        if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), str(dst))
    if os.path.lexists(dst):  # fallback: check, then rename (not race-free)
        raise FileExistsError(errno.EEXIST, "exists", str(dst))
    os.rename(src, dst)


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _save(obj: Any, path: Path) -> int:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    return path.stat().st_size


def write_rank_files(out_dir: str | os.PathLike, dicts: Sequence[Mapping], *,
                     pattern: str = DEFAULT_PATTERN, manifest: Mapping | None = None) -> int:
    """Writes ``dicts[r]`` to ``out_dir/pattern.format(rank=r)`` (plus ``manifest.json``),
    all or nothing; returns the bytes written. ``out_dir`` must not exist."""
    out_dir = check_output_path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        total = 0
        for r, d in enumerate(dicts):
            total += _save(d, tmp / pattern.format(rank=r))
        if manifest is not None:
            text = json.dumps(manifest, indent=2, default=str) + "\n"
            (tmp / "manifest.json").write_text(text)
            total += len(text.encode())
        _fsync_dir(tmp)
        try:
            _rename_noreplace(tmp, out_dir)
        except FileExistsError as e:
            raise UsageError("refusing to write over a path that appeared meanwhile", path=out_dir) from e
        _fsync_dir(out_dir.parent)
        return total
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_full_file(out_file: str | os.PathLike, full: Mapping) -> int:
    """``torch.save(full)`` to ``out_file`` (which must not exist), all or nothing; bytes."""
    out_file = check_output_path(out_file)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out_file.name}.tmp-", dir=out_file.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        n = _save(full, tmp)
        try:
            os.link(tmp, out_file)  # fails if out_file exists: no-replace
        except FileExistsError as e:
            raise UsageError("refusing to write over a path that appeared meanwhile", path=out_file) from e
        _fsync_dir(out_file.parent)
        return n
    finally:
        tmp.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------
# the conversion
# ------------------------------------------------------------------------------------
@dataclass
class ConvertResult:
    """What a conversion did (the CLI prints it)."""

    input: str
    input_kind: str
    output: str
    out_format: str
    src: str | None
    dst: str
    params: int = 0
    elements: int = 0
    bytes_written: int = 0
    seconds: float = 0.0
    files: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.input} ({self.input_kind}{', ' + self.src if self.src else ''})\n"
                f"  -> {self.output} ({self.out_format}, {self.dst})\n"
                f"  params {self.params:,}, elements {self.elements:,}, "
                f"bytes {self.bytes_written:,} ({self.bytes_written / 2**20:.1f} MiB), "
                f"time {self.seconds:.2f} s")


def _count(dicts: Sequence[Mapping], layout: ref.ModelLayout) -> tuple[int, int]:
    """(params with state, elements of positive-dim tensor state) over ``dicts``."""
    fqns: set[str] = set()
    elements = 0
    for d in dicts:
        for k, st in d["state"].items():
            u = layout.unit_by_key(k) if not layout.use_orig_params else None
            fqns.update(u.fqns if u is not None else [layout.canonical(k)] if layout.has(k) else [k])
            elements += sum(v.numel() for v in st.values()
                            if isinstance(v, torch.Tensor) and v.dim() > 0)
    return len(fqns), elements


def _mismatch(e: StateDictMismatch, files: Sequence[Path] | None, default: Path) -> CheckpointMismatch:
    path = files[e.rank] if files is not None and e.rank is not None and e.rank < len(files) else default
    return CheckpointMismatch(f"does not fit the layout: {e}", path=path, rank=e.rank,
                              param=e.param, key=e.key)


def convert(
    input_path: str | os.PathLike,
    output: str | os.PathLike,
    dst: LayoutSpec,
    *,
    src: LayoutSpec | None = None,
    kind: str = "auto",
    pattern: str = DEFAULT_PATTERN,
    out_format: str = "ranks",
    keys: str = "auto",
    dcp_key: str | None = None,
) -> ConvertResult:
    """Convert the checkpoint at ``input_path`` to ``dst`` and write it to ``output``.

    ``src`` (needed for per-rank input; ``world_size`` 0 or None: count the files) gives the
    source layout; a full dict or DCP checkpoint needs none. See the module docstring for
    the rules. Raises :class:`UsageError` / :class:`CheckpointMismatch`.
    """
    t0 = time.perf_counter()
    input_path = Path(input_path)
    if out_format not in ("ranks", "full"):
        raise UsageError(f"out_format must be 'ranks' or 'full', got {out_format!r}")
    if keys not in ("auto", "ids", "names"):
        raise UsageError(f"keys must be 'auto', 'ids' or 'names', got {keys!r}")
    kind = detect_input(input_path) if kind == "auto" else kind
    if kind not in ("full", "ranks", "dcp"):
        raise UsageError(f"input kind must be full, ranks or dcp, got {kind!r}")
    if not input_path.exists():
        raise UsageError("input does not exist", path=input_path)
    output = check_output_path(output, [input_path])
    files: list[Path] | None = None
    src_desc = None
    key_type: type | None = None

    if kind == "ranks":
        if src is None:
            raise UsageError("per-rank input needs the source layout (model, plan, world size)")
        if not input_path.is_dir():
            raise UsageError("per-rank input must be a directory", path=input_path)
        files = rank_files(input_path, pattern, src.world_size or None)
        if src.world_size != len(files):
            src = LayoutSpec(**{**asdict(src), "world_size": len(files)})
        dtype = src.dtype or dst.dtype
        if dtype is None and (src.use_orig_params or dst.use_orig_params):
            head = _clean_osd(_torch_load(files[0], 0), files[0], 0)
            dtype = _first_float_dtype(head["state"])
        src_layout = build_layout_for(src, dtype)
        dst_layout = build_layout_for(dst, dtype)
        src_desc = src.describe()
        load, info = rank_loader(files, src_layout)
        try:
            if out_format == "full":
                result = [ref.gather_full(src_layout, [load(r) for r in range(len(files))])]
            else:
                result = ref.reshard(src_layout, load, dst_layout)
        except StateDictMismatch as e:
            raise _mismatch(e, files, input_path) from e
        key_type = info["key_type"]
    else:
        if kind == "full":
            if not input_path.is_file():
                raise UsageError("a full-dict input must be a file", path=input_path)
            full = _clean_osd(_torch_load(input_path), input_path, None)
            if full["state"] and check_key_types(full["state"]) is int:
                raise UsageError("state is keyed by int ids: this is one rank's local dict, not a "
                                 "full dict; put the per-rank files in a directory (pattern "
                                 f"{pattern!r}) and pass the source layout", path=input_path)
            dtype = dst.dtype or _first_float_dtype(full["state"])
            dst_layout = build_layout_for(dst, dtype)
            try:
                state = check_full(dst_layout, full)
            except StateDictMismatch as e:
                raise _mismatch(e, None, input_path) from e
            per_element = per_element_names_from_full(state)
            groups = full.get("param_groups", [])

            def fetch(fqns: Sequence[str], skip: Collection[str] = ()) -> dict:
                return {f: {n: v for n, v in state[f].items() if n not in skip}
                        for f in fqns if f in state}
        else:
            dcp = DcpFull(input_path, dcp_key)
            dtype = dst.dtype or dcp.first_dtype()
            dst_layout = build_layout_for(dst, dtype)
            for f in dcp.fqns():
                if not dst_layout.has(f):
                    raise CheckpointMismatch(
                        "does not fit the layout: the checkpoint has state for a param the model "
                        f"{dst.model!r} does not have; known: {dst_layout.fqns()[:8]}",
                        path=input_path, param=f)
            canon = {dst_layout.canonical(f): f for f in dcp.fqns()}
            per_element = dcp.per_element()
            groups = dcp.param_groups()

            def fetch(fqns: Sequence[str], skip: Collection[str] = ()) -> dict:
                got = dcp.fetch([canon[f] for f in fqns if f in canon], skip)
                return {dst_layout.canonical(f): st for f, st in got.items()}
        try:
            if out_format == "full":
                part = fetch(dst_layout.fqns())
                result = [{"state": {f: part[f] for f in dst_layout.fqns() if f in part},
                           "param_groups": [dict(g) for g in groups]}]
            else:
                result = shard_full_per_unit(dst_layout, fetch, groups, per_element=per_element)
        except StateDictMismatch as e:
            raise _mismatch(e, None, input_path) from e

    if out_format == "full":
        n_params = len(result[0]["state"])
        elements = sum(v.numel() for st in result[0]["state"].values() for v in st.values()
                       if isinstance(v, torch.Tensor) and v.dim() > 0)
        written = write_full_file(output, result[0])
        out_files = [str(output)]
        dst_desc = "full FQN-keyed dict"
    else:
        n_params, elements = _count(result, dst_layout)
        as_ids = keys == "ids" or (keys == "auto" and key_type is not str)
        okeys = dst_layout.optimizer_keys()
        dicts = [ref.to_ids(d, okeys, rank=r) for r, d in enumerate(result)] if as_ids else result
        manifest = {
            "format": "fsdp-conformance/reshard/1",
            "source": {"path": str(input_path), "kind": kind, "layout": src_desc},
            "layout": {"model": dst.model, "plan": dst.plan if isinstance(dst.plan, str) else list(dst.plan),
                       "world_size": dst.world_size, "use_orig_params": dst.use_orig_params,
                       "strategy": dst.strategy, "shard_world_size": dst.shard_world_size},
            "keys": "ids" if as_ids else "names",
            "optimizer_keys": okeys,
            "pattern": pattern,
            "torch_version": torch.__version__,
        }
        written = write_rank_files(output, dicts, pattern=pattern, manifest=manifest)
        out_files = [str(output / pattern.format(rank=r)) for r in range(len(dicts))]
        dst_desc = dst.describe() + (", int ids" if as_ids else ", names")
    return ConvertResult(
        input=str(input_path), input_kind=kind, output=str(output), out_format=out_format,
        src=src_desc, dst=dst_desc, params=n_params, elements=elements, bytes_written=written,
        seconds=time.perf_counter() - t0, files=out_files,
    )


def load_rank_files(directory: str | os.PathLike, layout: ref.ModelLayout,
                    pattern: str = DEFAULT_PATTERN) -> list[dict]:
    """Every rank's neutral local dict from a directory written by :func:`convert`
    (or any per-rank files for ``layout``)."""
    files = rank_files(directory, pattern, layout.world_size)
    load, _ = rank_loader(files, layout)
    return [load(r) for r in range(len(files))]


__all__ = [
    "CheckpointMismatch", "ConvertError", "ConvertResult", "DcpFull", "LayoutSpec", "UsageError",
    "build_layout_for", "build_module", "check_output_path", "clean_name", "convert",
    "detect_input", "load_rank_files", "parse_plan", "rank_files", "rank_loader",
    "write_full_file", "write_rank_files",
]
