"""A per-parameter sharded state dict -> one rank's flat local dict.

Input forms (``per_param_sharded``): one dict or a sequence of dicts (typically every
rank's output of ``FSDP.sharded_optim_state_dict`` / ``optim_state_dict`` under
SHARDED, converted to the forms below), each ``{"state": {fqn: {name: value}},
"param_groups": [...]}``. A value is one of

* a neutral piece ``(global_shape, offset, local_1d)``: ``local_1d`` holds elements
  ``[offset, offset + numel)`` of the flattened (row-major) state tensor;
* a list of such pieces;
* a ShardedTensor-like object (``local_shards()`` giving shards with ``.tensor`` and
  ``.metadata.shard_offsets``; global shape from ``.size()`` or ``.metadata().size``):
  every local shard is placed as an N-d box;
* a DTensor-like object on a 1-D mesh (``to_local()``, ``placements``,
  ``device_mesh.get_coordinate()``, ``device_mesh.size()``) with placement
  ``Shard(0)`` (``torch.chunk`` rows) or ``Replicate()``;
* a plain tensor (the whole state) or a scalar (0-dim tensor / non-tensor; must
  agree across the dicts that carry it).

Rule: the pieces are assembled per param; every element the rank's output needs (its
flat range for ``use_orig_params=False``; its piece of each param for ``True``) must be
covered, else :class:`MissingKeyError` names param, key, rank and the first uncovered
element. The result is then exactly :func:`shard_full` of the assembled state.
``param_groups`` are taken from the first dict.
"""

from __future__ import annotations

import math
from typing import Any, Collection, Mapping, Sequence

import torch

from .errors import MissingKeyError, ShapeMismatch, StateDictMismatch
from .keys import category, values_equal
from .layout import ModelLayout
from .shard import check_full, shard_full


def _pieces(v: Any) -> tuple[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] | None:
    """Return (global_shape, [(flat_indices, values)]) or None for a non-sharded value."""
    if isinstance(v, tuple) and len(v) == 3 and isinstance(v[2], torch.Tensor) and not isinstance(v[1], torch.Tensor):
        shape, off, t = tuple(int(d) for d in v[0]), int(v[1]), v[2].reshape(-1)
        return shape, [(torch.arange(off, off + t.numel()), t)]
    if isinstance(v, list) and v and all(isinstance(x, tuple) and len(x) == 3 for x in v):
        shape = tuple(int(d) for d in v[0][0])
        out = []
        for s, off, t in v:
            if tuple(int(d) for d in s) != shape:
                raise ShapeMismatch("pieces disagree on the global shape", expected=shape, got=tuple(s))
            t = t.reshape(-1)
            out.append((torch.arange(int(off), int(off) + t.numel()), t))
        return shape, out
    if hasattr(v, "local_shards") and callable(v.local_shards):
        size = v.size() if callable(getattr(v, "size", None)) else v.metadata().size
        shape = tuple(int(d) for d in size)
        out = []
        for sh in v.local_shards():
            t = sh.tensor
            offs = list(sh.metadata.shard_offsets)
            idx = torch.arange(math.prod(shape)).view(shape) if shape else torch.arange(1).view(())
            for d, (o, n) in enumerate(zip(offs, t.shape)):
                idx = idx.narrow(d, o, n)
            out.append((idx.reshape(-1), t.reshape(-1)))
        return shape, out
    if hasattr(v, "to_local") and hasattr(v, "placements"):
        local = v.to_local()
        shape = tuple(int(d) for d in v.shape)
        pl = v.placements
        if len(pl) != 1:
            raise NotImplementedError("only 1-D device meshes are supported for DTensor input")
        p = pl[0]
        if p.is_replicate():
            return shape, [(torch.arange(math.prod(shape)), local.reshape(-1))]
        if not (p.is_shard() and getattr(p, "dim", 0) == 0):
            raise NotImplementedError(f"unsupported DTensor placement {p}")
        coord = v.device_mesh.get_coordinate()[0]
        w = v.device_mesh.size()
        rows = -(-shape[0] // w)
        row_numel = math.prod(shape[1:])
        start = min(coord * rows, shape[0]) * row_numel
        t = local.reshape(-1)
        return shape, [(torch.arange(start, start + t.numel()), t)]
    return None


def assemble(per_param_sharded: Mapping | Sequence[Mapping]) -> tuple[dict, dict]:
    """Merge sharded dicts into (full-shaped state, coverage masks ``{(fqn, name): bool mask}``)."""
    dicts = [per_param_sharded] if isinstance(per_param_sharded, Mapping) else list(per_param_sharded)
    state: dict[str, dict[str, Any]] = {}
    cover: dict[tuple[str, str], torch.Tensor] = {}
    for di, d in enumerate(dicts):
        for fqn, st in d.get("state", {}).items():
            dst = state.setdefault(fqn, {})
            for name, v in st.items():
                pc = _pieces(v)
                if pc is None and isinstance(v, torch.Tensor) and v.dim() > 0:
                    pc = (tuple(v.shape), [(torch.arange(v.numel()), v.reshape(-1))])
                if pc is None:
                    if name in dst and not values_equal(dst[name], v):
                        raise StateDictMismatch("scalar state differs between sharded dicts", param=fqn,
                                                key=name, rank=di, expected=dst[name], got=v)
                    dst.setdefault(name, v)
                    continue
                shape, parts = pc
                if name not in dst:
                    t0 = parts[0][1] if parts else torch.zeros(0, dtype=getattr(v, "dtype", torch.float32))
                    dst[name] = torch.zeros(math.prod(shape), dtype=t0.dtype, device=t0.device)
                    cover[(fqn, name)] = torch.zeros(math.prod(shape), dtype=torch.bool)
                    dst[name] = dst[name].view(shape) if shape else dst[name].view(())
                flat = dst[name].reshape(-1)
                if flat.numel() != math.prod(shape):
                    raise ShapeMismatch("sharded dicts disagree on the global shape", param=fqn, key=name,
                                        rank=di, expected=tuple(dst[name].shape), got=shape)
                for idx, vals in parts:
                    if idx.numel() and (int(idx.max()) >= flat.numel() or int(idx.min()) < 0):
                        raise ShapeMismatch("piece lies outside the global tensor", param=fqn, key=name,
                                            rank=di, expected=f"indices < {flat.numel()}",
                                            got=f"[{int(idx.min())}, {int(idx.max())}]")
                    flat[idx] = vals.to(flat.dtype).to(flat.device)
                    cover[(fqn, name)][idx] = True
    return state, cover


def flatten_sharded(
    layout: ModelLayout,
    per_param_sharded: Mapping | Sequence[Mapping],
    rank: int,
    *,
    per_element: Collection[str] | None = None,
    device: Any = None,
) -> dict:
    """The neutral local dict of ``rank`` from per-param sharded state (module docstring)."""
    dicts = [per_param_sharded] if isinstance(per_param_sharded, Mapping) else list(per_param_sharded)
    if not dicts:
        raise MissingKeyError("no sharded dict given", rank=rank)
    state, cover = assemble(dicts)
    full = {"state": state, "param_groups": dicts[0].get("param_groups", [])}
    canon = check_full(layout, full)
    sr = layout.shard_rank(rank)
    for unit in layout.units:
        if layout.use_orig_params:
            need = {pc.fqn: [(pc.start_in_param, pc.end_in_param)] for pc in unit.param_pieces(sr)} \
                if unit.sharded else {p.fqn: [(0, p.numel)] for p in unit.params}
        else:
            if not any(p.fqn in canon for p in unit.params):
                continue
            need = {pc.fqn: [(pc.start_in_param, pc.end_in_param)] for pc in unit.param_pieces(sr)}
        for fqn, ranges in need.items():
            for name in canon.get(fqn, {}):
                key = next(((f, name) for f in (fqn, *layout.find(fqn)[1].aliases) if (f, name) in cover), None)
                if key is None:
                    continue
                mask = cover[key]
                for a, b in ranges:
                    miss = (~mask[a:b]).nonzero()
                    if miss.numel():
                        first = a + int(miss[0])
                        raise MissingKeyError(
                            "sharded input does not cover an element this rank needs", param=fqn, key=name,
                            rank=rank, expected=f"elements [{a}, {b}) of the flattened state",
                            got=f"element {first} missing ({miss.numel()} missing)",
                        )
    return shard_full(layout, full, rank, per_element=per_element, device=device)
