"""The conversion itself (``convert``): read the input, re-shard it with the reference
(``reference.reshard`` / ``reference.shard_full_per_unit``), write the output, so the
result is what FSDP must load at the destination. CPU only, no process group.

Rules
-----
Inputs (``inputs.detect_input``; ``kind`` forces one): a full dict (a file), a DCP
  directory, or a directory of per-rank files, which needs the source layout ``src``
  (``world_size`` 0 or None: count the files).
Outputs (``out_format``):
  * ``ranks``: a new directory with one file per destination rank (``pattern``), each a
    ``torch.save`` of the rank's local dict, keyed by int ids (``keys="ids"``, loadable with
    ``optim.load_state_dict`` on an optimizer over ``fsdp_model.parameters()``) or by names;
    ``keys="auto"``: like the input's per-rank files, ids for a full or DCP input. Plus
    ``manifest.json`` describing the destination layout.
  * ``full``: a new file, ``torch.save`` of the full FQN-keyed dict (the reference gather).
Errors: :class:`~.errors.UsageError` (bad arguments, unreadable or missing input, refused
  output; exit 2) and :class:`~.errors.CheckpointMismatch` (the checkpoint does not fit the
  layout; exit 1).
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Collection, Mapping, Sequence

import torch

from .. import reference as ref
from ..reference.errors import StateDictMismatch
from ..reference.keys import check_key_types, per_element_names_from_full
from ..reference.reshard import shard_full_per_unit
from ..reference.shard import check_full
from .dcp import DcpFull
from .errors import CheckpointMismatch, UsageError
from .inputs import (DEFAULT_PATTERN, clean_osd, detect_input, first_float_dtype, rank_files,
                     rank_loader, torch_load)
from .layout import LayoutSpec, build_layout_for
from .outputs import check_output_path, write_full_file, write_rank_files


@dataclass(frozen=True, kw_only=True)
class ConvertResult:
    """What a conversion did (the CLI prints :meth:`summary`)."""

    input: str
    """The input path."""
    input_kind: str
    """``"full"``, ``"ranks"`` or ``"dcp"``."""
    output: str
    """The output path."""
    out_format: str
    """``"ranks"`` or ``"full"``."""
    src: str | None
    """The source layout described (per-rank input), else None."""
    dst: str
    """The destination described."""
    params: int = 0
    """Params with state written."""
    elements: int = 0
    """Elements of positive-dim state tensors written."""
    bytes_written: int = 0
    """Bytes written (files and manifest)."""
    seconds: float = 0.0
    """Wall time of the conversion."""
    files: list[str] = field(default_factory=list)
    """The files written."""

    def summary(self) -> str:
        """Input, output, counts and time, on three lines."""
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
            head = clean_osd(torch_load(files[0], 0), files[0], 0)
            dtype = first_float_dtype(head["state"])
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
            full = clean_osd(torch_load(input_path), input_path, None)
            if full["state"] and check_key_types(full["state"]) is int:
                raise UsageError("state is keyed by int ids: this is one rank's local dict, not a "
                                 "full dict; put the per-rank files in a directory (pattern "
                                 f"{pattern!r}) and pass the source layout", path=input_path)
            dtype = dst.dtype or first_float_dtype(full["state"])
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


__all__ = ["ConvertResult", "convert"]
