"""DCP's own save and load plans of a simulated rank, checked against the reference.

Rules
- What is planned is a trainer's checkpoint: ``{"model": params, "optim": Adam's state}``
  (the state from torch's ``get_optimizer_state_dict``, with DSD's flattening off or on:
  the state's DCP keys are the same, the param groups' differ). A key's reference piece is
  its parameter's box: the parameter's own key ``model.<fqn>``, its state
  ``optim.state.<fqn>.<name>``.
- Save: the rank's ``DefaultSavePlanner.create_local_plan()``; each write item of a sharded
  key must be the rank's reference box (offset and size), one per key; a rank whose box is
  empty writes nothing of that key, or only an empty piece.
- Save, all ranks: DCP's coordinator de-duplicates every rank's save plan
  (``global_save_problems``: torch's ``dedup_save_plans`` over all the mesh's ranks, the
  unsimulated ranks' plans being the simulated one's with their reference boxes); after it
  every sharded key's pieces tile the parameter once and every other key has one writer.
- Load: the checkpoint's metadata is what a save at the save mesh writes once replicas are
  deduplicated: one chunk per shard rank of the first shard group for every sharded key
  (``saved_metadata``), the whole tensor for a plain one (``step``), bytes for the rest. The
  load rank's ``DefaultLoadPlanner.create_local_plan()`` against it must read exactly its
  new piece of every sharded key: its read items' destination pieces tile the local piece
  once (no element missing, none twice), each inside the saved chunk it names.
"""
from __future__ import annotations

import math
import warnings

from ..reference.fsdp2_layout import fsdp2_layout
from .simulate import Mesh

PREFIXES = ("model.", "optim.state.")


def checkpoint(params: dict, optim: dict | None = None) -> dict:
    """The state dict a trainer hands DCP."""
    return {"model": params} if optim is None else {"model": params, "optim": optim}


def param_of(key: str, shapes: dict) -> str | None:
    """The parameter whose box a flat DCP key's piece is (module rules), or None."""
    for prefix in PREFIXES:
        if key.startswith(prefix):
            rest = key[len(prefix):]
            fqn = rest if prefix == "model." else rest.rsplit(".", 1)[0]
            return fqn if fqn in shapes else None
    return None


def _flat(sd: dict) -> dict:
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    return flatten_state_dict(sd)[0]


def reference_layout(shapes: dict, mesh: Mesh):
    """The reference layout of ``shapes`` on ``mesh``."""
    if mesh.tp > 1:
        return fsdp2_layout(list(shapes.items()), mesh.world_size, tp_size=mesh.tp,
                            tp_plan=dict(mesh.tp_plan))
    return fsdp2_layout(list(shapes.items()), mesh.world_size, shard_world_size=mesh.shard)


def reference_box(layout, fqn: str, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(offset, size)`` of ``fqn``'s piece on ``rank``."""
    box = layout.param(fqn).box(rank)
    return tuple(a for a, _ in box), tuple(b - a for a, b in box)


def _sharded(value) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def _quiet(fn):
    with warnings.catch_warnings():  # the fake group's default device: not a finding
        warnings.simplefilter("ignore", UserWarning)
        return fn()


def save_problems(sd: dict, shapes: dict, mesh: Mesh, rank: int) -> list[str]:
    """Where the rank's DCP save plan of ``sd`` differs from its reference boxes."""
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    planner = DefaultSavePlanner()
    plan = _quiet(lambda: (planner.set_up_planner(sd, is_coordinator=False),
                           planner.create_local_plan())[1])
    layout = reference_layout(shapes, mesh)
    written: dict[str, list] = {}
    for item in plan.items:
        chunk = item.tensor_data.chunk if item.tensor_data is not None else None
        if chunk is not None:
            written.setdefault(item.index.fqn, []).append((tuple(chunk.offsets),
                                                           tuple(chunk.sizes)))
    out = []
    for key, value in _flat(sd).items():
        fqn = param_of(key, shapes)
        if fqn is None or not _sharded(value):
            continue
        want = reference_box(layout, fqn, rank)
        got = [c for c in written.get(key, []) if math.prod(c[1])]
        if math.prod(want[1]) == 0:
            if got:
                out.append(f"rank {rank}: {key}: holds none of it, but its save plan writes {got}")
        elif got != [want]:
            out.append(f"rank {rank}: {key}: save plan writes {got or 'nothing'}, the "
                       f"reference piece is offset {want[0]} size {want[1]}")
    return out


def saved_metadata(sd: dict, shapes: dict, mesh: Mesh):
    """The metadata of a save of ``sd``'s keys at ``mesh`` (module rules)."""
    import torch
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata,
                                                       ChunkStorageMetadata, Metadata,
                                                       TensorProperties, TensorStorageMetadata)

    layout = reference_layout(shapes, mesh)
    # each distinct box once, as DCP's de-duplication of the ranks' plans writes it (the
    # tensor-parallel ranks of a param replicated over tp hold the same box)
    pieces = {fqn: [ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(s))
                    for o, s in sorted({reference_box(layout, fqn, k)
                                        for k in mesh.replica_ranks})
                    if math.prod(s)]
              for fqn in shapes}
    md = {}
    for key, value in _flat(sd).items():
        fqn = param_of(key, shapes)
        if _sharded(value) and fqn is not None:
            md[key] = TensorStorageMetadata(properties=TensorProperties(dtype=value.dtype),
                                            size=torch.Size(shapes[fqn]), chunks=pieces[fqn])
        elif isinstance(value, torch.Tensor):
            whole = torch.Size(value.shape)
            md[key] = TensorStorageMetadata(
                properties=TensorProperties(dtype=value.dtype), size=whole,
                chunks=[ChunkStorageMetadata(offsets=torch.Size([0] * len(whole)),
                                             sizes=whole)])
        else:
            md[key] = BytesStorageMetadata()
    return Metadata(state_dict_metadata=md)


def load_problems(sd: dict, shapes: dict, metadata, mesh: Mesh, rank: int) -> list[str]:
    """Where the rank's DCP load plan of ``sd`` does not read exactly its new pieces."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    planner = DefaultLoadPlanner()
    plan = _quiet(lambda: (planner.set_up_planner(sd, metadata, is_coordinator=False),
                           planner.create_local_plan())[1])
    layout = reference_layout(shapes, mesh)
    reads: dict[str, list] = {}
    for item in plan.items:
        reads.setdefault(item.dest_index.fqn, []).append(item)
    chunks = {key: {tuple(c.offsets): tuple(c.sizes) for c in m.chunks}
              for key, m in metadata.state_dict_metadata.items() if hasattr(m, "chunks")}
    out = []
    for key, value in _flat(sd).items():
        fqn = param_of(key, shapes)
        if fqn is None or not _sharded(value):
            continue
        off, size = reference_box(layout, fqn, rank)
        need = math.prod(size)
        items = reads.get(key, [])
        got = sum(math.prod(i.lengths) for i in items)
        if got != need:
            out.append(f"rank {rank}: {key}: load plan reads {got} elements, its piece has "
                       f"{need} (offset {off}, size {size})")
            continue
        boxes = []
        for i in items:
            start = tuple(i.dest_offsets)
            end = tuple(a + n for a, n in zip(start, i.lengths))
            if any(e > s for e, s in zip(end, size)):
                out.append(f"rank {rank}: {key}: a read lands outside the local piece "
                           f"({start}..{end}, piece size {size})")
            src = chunks[key].get(tuple(i.storage_index.offset))
            if src is None or any(o + n > s for o, n, s in zip(i.storage_offsets, i.lengths,
                                                               src)):
                out.append(f"rank {rank}: {key}: a read outside the saved chunk at "
                           f"{tuple(i.storage_index.offset)}")
            boxes.append((start, end))
        for a in range(len(boxes)):
            for b in range(a + 1, len(boxes)):
                if all(max(x0, y0) < min(x1, y1) for x0, x1, y0, y1 in
                       zip(boxes[a][0], boxes[a][1], boxes[b][0], boxes[b][1])):
                    out.append(f"rank {rank}: {key}: two reads write the same elements")
    return out


def global_save_problems(sd: dict, shapes: dict, mesh: Mesh, rank: int) -> list[str]:
    """DCP's coordinator over every rank's save plan: torch's ``dedup_save_plans`` (what
    ``DefaultSavePlanner.create_global_plan`` runs first) on the local plans of all
    ``mesh.world_size`` ranks, then every sharded key's pieces must tile its parameter
    exactly once and every other key be written by one rank. The simulated ``rank``'s own
    plan is torch's; every other rank's is the same plan with each sharded item's piece
    replaced by that rank's reference box (exact: ``save_problems`` holds each sampled
    rank's plan to its box, and the sample covers every class of box), the plain items (a
    param's ``step``, the param groups) as they are: every rank writes them, as replicas do."""
    import collections
    import dataclasses

    import torch
    from torch.distributed.checkpoint._dedup_save_plans import dedup_save_plans
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    planner = DefaultSavePlanner()
    plan = _quiet(lambda: (planner.set_up_planner(sd, is_coordinator=False),
                           planner.create_local_plan())[1])
    flat = _flat(sd)
    sharded = {k for k, v in flat.items() if _sharded(v) and param_of(k, shapes) is not None}
    layout = reference_layout(shapes, mesh)
    plain = [i for i in plan.items if i.index.fqn not in sharded]
    mine = {i.index.fqn: i for i in plan.items if i.index.fqn in sharded}

    def plan_of(r: int):
        if r == rank:
            return plan
        items = list(plain)
        for key, item in mine.items():
            off, size = reference_box(layout, param_of(key, shapes), r)
            if math.prod(size):
                chunk = ChunkStorageMetadata(offsets=torch.Size(off), sizes=torch.Size(size))
                items.append(dataclasses.replace(
                    item, index=MetadataIndex(key, torch.Size(off)),
                    tensor_data=dataclasses.replace(item.tensor_data, chunk=chunk)))
        return dataclasses.replace(plan, items=items)

    plans = dedup_save_plans([plan_of(r) for r in range(mesh.world_size)])
    pieces: dict[str, list] = collections.defaultdict(list)
    writers: collections.Counter = collections.Counter()
    for p in plans:
        for item in p.items:
            if item.index.fqn in sharded:
                c = item.tensor_data.chunk
                if math.prod(c.sizes):
                    pieces[item.index.fqn].append((tuple(c.offsets), tuple(c.sizes)))
            else:
                writers[item.index.fqn] += 1
    out = [f"{key}: written by {n} ranks after de-duplication, expected 1"
           for key, n in sorted(writers.items()) if n != 1]
    for key in sorted(sharded):
        gap = tiling_problem(shapes[param_of(key, shapes)], pieces[key])
        if gap is not None:
            out.append(f"{key}: {gap} after de-duplication")
    return out


def tiling_problem(shape: tuple[int, ...], pieces: list) -> str | None:
    """Whether the boxes ``pieces`` (``(offsets, sizes)``, empty ones left out) hold every
    element of ``shape`` exactly once, for the grids FSDP and tensor parallelism cut: the
    pieces with the same trailing box (``offsets[1:]``, ``sizes[1:]``: a column block of a
    row-wise split, or every trailing dim whole) must tile the rows, and those trailing
    boxes must tile the trailing dims without overlapping. None if they do; else what is
    wrong, naming the rows or the block."""
    groups: dict[tuple, list] = {}
    for o, s in pieces:
        groups.setdefault((tuple(o[1:]), tuple(s[1:])), []).append((o[0], o[0] + s[0]))
    blocks = list(groups)
    for (o, s), rows in sorted(groups.items()):
        at = 0
        for a, b in sorted(rows):
            if a != at:
                return (f"rows {min(a, at)}..{max(a, at)} of the block at {o} written "
                        f"{'twice' if a < at else 'by no rank'}")
            at = b
        if shape and at != shape[0]:
            return f"rows {at}..{shape[0]} of the block at {o} written by no rank"
    for i in range(len(blocks)):
        for j in range(i + 1, len(blocks)):
            (oa, sa), (ob, sb) = blocks[i], blocks[j]
            if all(max(x, y) < min(x + m, y + n) for x, m, y, n in zip(oa, sa, ob, sb)):
                return f"the blocks at {oa} and {ob} overlap"
    covered = sum(math.prod(s) for _, s in blocks)
    if covered != math.prod(shape[1:]):
        return (f"the blocks cover {covered} of the {math.prod(shape[1:])} elements of each "
                f"row ({len(blocks)} block(s))")
    return None
