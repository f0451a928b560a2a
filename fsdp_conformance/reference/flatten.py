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
* a DTensor-like object (duck-typed: ``to_local()``, ``placements``, ``device_mesh``
  with ``get_coordinate()`` and ``shape`` -- or ``size()`` for a 1-D mesh -- and the
  global ``shape``) whose placements are ``Shard(d)`` or ``Replicate()`` on any number
  of mesh dims (FSDP: ``(Shard(0),)``; HSDP: ``(Replicate(), Shard(0))``). Mesh dims
  are applied in order, each ``Shard(d)`` taking chunk ``coordinate[i]`` of the current
  extent of dim ``d`` with ``torch.chunk`` semantics (chunk ``ceil(L / n)``, trailing
  chunks short or empty); the local tensor must have the resulting shape. A strided
  shard (``_StridedShard(d, split_factor=f)``, FSDP2's dp placement over a tensor-parallel
  split of dim ``d``) is applied after the later mesh dims that shard ``d`` (sizes
  multiplying to ``f``): FSDP2 chunks the tp-local tensor. ``Partial`` and unknown
  placements raise ``NotImplementedError``;
* a plain tensor (the whole state) or a scalar (0-dim tensor / non-tensor; must
  agree across the dicts that carry it).

:func:`to_pieces` / :func:`sharded_to_pieces` turn any of these (on the rank that holds a
live DTensor, say) into the picklable neutral form: a list of pieces, one per contiguous
run of the flattened state.

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
from .fsdp2_layout import chunk_range
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
            out.append((_box_indices(shape, list(sh.metadata.shard_offsets), t.shape), t.reshape(-1)))
        return shape, out
    if hasattr(v, "to_local") and hasattr(v, "placements") and hasattr(v, "device_mesh"):
        local = v.to_local()
        shape = tuple(int(d) for d in v.shape)
        offsets, local_shape = dtensor_box(shape, v.device_mesh, v.placements)
        if tuple(local.shape) != local_shape:
            raise ShapeMismatch("DTensor's local tensor does not have the shape its placements give",
                                expected=local_shape, got=tuple(local.shape))
        return shape, [(_box_indices(shape, offsets, local_shape), local.reshape(-1))]
    return None


def _box_indices(shape: tuple[int, ...], offsets: Sequence[int], sizes: Sequence[int]) -> torch.Tensor:
    """Flat (row-major) indices of the N-d box ``offsets + [0, sizes)`` of a tensor of ``shape``."""
    idx = torch.arange(math.prod(shape)).view(shape) if shape else torch.arange(1).view(())
    for d, (o, n) in enumerate(zip(offsets, sizes)):
        idx = idx.narrow(d, int(o), int(n))
    return idx.reshape(-1)


def dtensor_box(shape: Sequence[int], mesh: Any,
                placements: Sequence[Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(global offsets, local shape)`` of this rank's piece of a DTensor (module docstring).

    ``mesh``: DeviceMesh-like (``get_coordinate()``, ``shape`` or ``size()``); placements:
    objects with ``is_shard()`` / ``is_replicate()`` (and ``dim`` for shards).
    """
    shape = tuple(int(d) for d in shape)
    coord = mesh.get_coordinate()
    if coord is None:
        raise NotImplementedError("this rank is not part of the DTensor's device mesh")
    mesh_shape = tuple(int(d) for d in mesh.shape) if hasattr(mesh, "shape") else (int(mesh.size()),)
    if len(placements) != len(mesh_shape) or len(coord) != len(mesh_shape):
        raise ShapeMismatch("DTensor placements do not match its mesh", expected=mesh_shape,
                            got=f"{len(placements)} placements, coordinate {tuple(coord)}")
    offsets, local = [0] * len(shape), list(shape)
    for i in _application_order(placements, mesh_shape, len(shape)):
        p = placements[i]
        if p.is_replicate():
            continue
        d = int(p.dim) % max(1, len(shape))
        start, stop = chunk_range(local[d], mesh_shape[i], int(coord[i]))
        offsets[d] += start
        local[d] = stop - start
    return tuple(offsets), tuple(local)


def _application_order(placements: Sequence[Any], mesh_shape: Sequence[int],
                       ndim: int) -> list[int]:
    """The order the mesh dims split the tensor in: mesh order, except that a strided shard
    (``_StridedShard(d, split_factor=f)``) comes after the later mesh dims that shard dim
    ``d``, whose sizes must multiply to ``f``: FSDP2 over tensor parallelism chunks the
    tp-local tensor (module docstring). Anything else but ``Shard`` / ``Replicate`` raises
    ``NotImplementedError``."""
    order: list[int] = []
    deferred: dict[int, list[int]] = {}  # mesh dim -> strided dims applied right after it

    def plain_shard(q: Any) -> bool:
        return q.is_shard() and not hasattr(q, "split_factor")

    for i, p in enumerate(placements):
        if p.is_replicate():
            order.append(i)
            continue
        if plain_shard(p):
            order.append(i)
            order += deferred.pop(i, [])
            continue
        if not hasattr(p, "split_factor"):  # torch 2.13's _StridedShard is no is_shard()
            raise NotImplementedError(f"unsupported DTensor placement {p!r}")
        d = int(p.dim) % max(1, ndim)
        later = [j for j in range(i + 1, len(placements)) if plain_shard(placements[j])
                 and int(placements[j].dim) % max(1, ndim) == d]
        if not later or math.prod(mesh_shape[j] for j in later) != int(p.split_factor):
            raise NotImplementedError(f"unsupported DTensor placement {p!r}: no later mesh dims "
                                      f"shard dim {d} into {p.split_factor} pieces")
        deferred.setdefault(later[-1], []).append(i)  # later[-1] > i: popped when reached
    return order


def to_pieces(v: Any) -> list[tuple[tuple[int, ...], int, torch.Tensor]] | None:
    """A sharded value (any input form above) as neutral pieces ``(global_shape, offset,
    1-D tensor)``, one per contiguous run of the flattened state (tensors cloned, on their
    device); None for a value that is not sharded (plain tensor, scalar)."""
    pc = _pieces(v)
    if pc is None:
        return None
    shape, parts = pc
    out = []
    for idx, vals in parts:
        vals = vals.detach().reshape(-1)
        if idx.numel() == 0:
            continue
        breaks = ((idx[1:] - idx[:-1]) != 1).nonzero().reshape(-1) + 1
        bounds = [0, *breaks.tolist(), idx.numel()]
        for a, b in zip(bounds[:-1], bounds[1:]):
            out.append((shape, int(idx[a]), vals[a:b].clone()))
    return out


def sharded_to_pieces(sharded: Mapping) -> dict:
    """A per-param sharded dict with every sharded value (DTensor, ShardedTensor, pieces)
    as :func:`to_pieces` lists; a value whose pieces are all empty (a rank holding no rows)
    is left out; other values are kept as they are."""
    state = {}
    for fqn, st in sharded.get("state", {}).items():
        conv = {}
        for n, v in st.items():
            pcs = to_pieces(v)
            if pcs is None:
                conv[n] = v
            elif pcs:
                conv[n] = pcs
        state[fqn] = conv
    return {"state": state, "param_groups": list(sharded.get("param_groups", []))}


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
