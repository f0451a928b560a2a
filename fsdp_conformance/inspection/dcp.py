"""``inspect`` of a DCP directory (has ``.metadata``).

Rules
-----
Shapes, dtypes and chunk placement come from the metadata alone; only non-tensor and 0-dim
entries (``step``) and ``param_groups`` are read, and every tensor's values only with
``values=True``. Every data file the metadata names must exist. The saving world size is
``1 + the largest rank`` in the data file names (``__<rank>_<n>.distcp``), each chunk's
rank is the file that holds it.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Sequence

import torch

from ..reshard.dcp import DcpFull
from ..reshard.errors import UsageError
from .describe import (describe_value, dtype_name, group_index, group_infos, guess_optimizer,
                       in_group_order, key_type_of, step_of, total_bytes)
from .findings import few, findings_for
from .locate import location_str
from .summary import Chunk, ParamInfo, StateInfo, Summary

_DISTCP = re.compile(r"__(\d+)_\d+\.distcp$")


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
        raise UsageError(f"data files named by .metadata are missing: {few(missing, 4)}",
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


def _short(value) -> str:
    """A value beside the optimizer as one short text (a 0-dim tensor as its number)."""
    import torch

    if isinstance(value, torch.Tensor) and value.dim() == 0:
        value = value.item()
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def summarise_dcp(path: Path, key: str | None, values: bool) -> Summary:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    dcp = DcpFull(path, key, option="--key")
    md = dcp.metadata
    where, ranks = _dcp_ranks(path, md)
    world = max(ranks) + 1 if ranks else None
    entries = dcp.entries()
    read = dcp.fetch(list(entries), skip=() if values else dcp.per_element())
    groups = group_infos(dcp.param_groups())
    listed = group_index(groups)
    params, chunked, other = [], 0, []
    for fqn, ents in entries.items():
        infos, seen = [], set()
        for flat, name, ndim in ents:
            if name in seen:  # another element of a list or dict value
                continue
            seen.add(name)
            meta = md.state_dict_metadata[flat]
            got = describe_value(name, read[fqn][name]) if name in read.get(fqn, {}) else None
            if isinstance(meta, TensorStorageMetadata) and ndim >= 0:  # not a list's element
                shape = tuple(meta.size)
                dtype = meta.properties.dtype
                numel = math.prod(shape)
                chunks = tuple(Chunk(rank=where.get((flat, tuple(c.offsets))),
                                     offsets=tuple(c.offsets),
                                     sizes=tuple(c.sizes)) for c in meta.chunks)
                infos.append(StateInfo(name=name, kind="tensor" if shape else "scalar tensor",
                                       dtype=dtype_name(dtype),
                                       shape=shape, numel=numel, nbytes=numel * dtype.itemsize,
                                       value=None if got is None else got.value,
                                       nonfinite=None if got is None else got.nonfinite,
                                       chunks=chunks if shape else ()))
                if shape and world:
                    if _chunk_semantics(shape, chunks, world):
                        chunked += 1
                    else:
                        other.append(f"{fqn}[{name!r}]")
            else:
                infos.append(got if got is not None else StateInfo(name=name, kind="unread"))
        step, kind = step_of(infos)
        params.append(ParamInfo(key=fqn, groups=listed.get(fqn, ()), state=tuple(infos), step=step,
                                step_kind=kind))
    params += [ParamInfo(key=k, groups=gs, state=())
               for k, gs in listed.items() if k not in entries]
    params = in_group_order(params, groups)
    key_type = key_type_of([p.key for p in params])
    optimizer = guess_optimizer(groups)
    findings = findings_for(params, groups, key_type, optimizer)
    data_files = sorted(f.name for f in path.iterdir() if _DISTCP.search(f.name))
    layout = [f"saved by {_ranks(world)} (data files {few(data_files, 4)})" if world else
              "saving ranks unknown (no __<rank>_<n>.distcp data files)"]
    if chunked:
        layout.append(f"{chunked} state tensors stored as torch.chunk pieces of dim 0 over "
                      f"{_ranks(world)} (FSDP1 SHARDED / FSDP2 Shard(0))")
    if other:
        layout.append(f"{len(other)} state tensors placed otherwise: {few(other, 4)}")
    for holder, fields in dcp.beside().items():  # an app state's scheduler, step, ...
        shown = ", ".join(f"{k} {_short(v)}" for k, v in list(fields.items())[:8])
        more = f" (+{len(fields) - 8} more)" if len(fields) > 8 else ""
        layout.append(f"beside the optimizer, {holder or '<top level>'}: {shown}{more}")
    layout.append("DCP stores global tensors: loadable at any world size")
    layout.append("tensor values " + ("read" if values else "not read (only steps and param "
                                      "groups; --values reads them and checks for NaN/Inf)"))
    prefix = ".".join(map(str, dcp.prefix))
    desc = "DCP checkpoint" + (f", optimizer dict under {prefix!r}" if prefix else "")
    return Summary(path=str(path), format="dcp", description=desc,
                   location=location_str(dcp.prefix), key_type=key_type, optimizer=optimizer,
                   params=params, groups=groups, world_size=world, layout=tuple(layout),
                   state_bytes=total_bytes(params), values_read=values, unsafe_loaded=False,
                   files=tuple(str(path / f) for f in [".metadata"] + data_files),
                   findings=tuple(findings))
