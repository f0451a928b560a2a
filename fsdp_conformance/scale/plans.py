"""DCP's own save and load plans of a simulated rank, checked against the reference.

Rules
- Save: the rank's ``DefaultSavePlanner.create_local_plan()``; each of its write items of a
  parameter must be the rank's reference box (offset and size); a rank whose box is empty
  writes nothing of that parameter, or only an empty piece.
- Load: the checkpoint's metadata is what a save at the save mesh writes once replicas are
  deduplicated: one chunk per shard rank of the first shard group, each the reference box
  (``saved_metadata``). The load rank's ``DefaultLoadPlanner.create_local_plan()`` against it
  must read exactly its new box: its read items' destination pieces tile the rank's local
  piece once (no element missing, none twice), and each reads inside the saved chunk it
  names.
"""
from __future__ import annotations

import math
import warnings

from ..reference.fsdp2_layout import fsdp2_layout
from .simulate import Mesh


def _box(layout, fqn: str, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    box = layout.param(fqn).box(rank)
    return tuple(a for a, _ in box), tuple(b - a for a, b in box)


def save_problems(sd: dict, shapes: dict, mesh: Mesh, rank: int) -> list[str]:
    """Where the rank's DCP save plan differs from its reference boxes (module rules)."""
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    planner = DefaultSavePlanner()
    with warnings.catch_warnings():  # the fake group's default device: not a finding
        warnings.simplefilter("ignore", UserWarning)
        planner.set_up_planner(sd, is_coordinator=False)
        plan = planner.create_local_plan()
    layout = fsdp2_layout(list(shapes.items()), mesh.world_size, shard_world_size=mesh.shard)
    written: dict[str, list] = {}
    for item in plan.items:
        chunk = item.tensor_data.chunk if item.tensor_data is not None else None
        if chunk is not None:
            written.setdefault(item.index.fqn, []).append((tuple(chunk.offsets),
                                                           tuple(chunk.sizes)))
    out = []
    for fqn in shapes:
        want = _box(layout, fqn, rank)
        got = [c for c in written.get(fqn, []) if math.prod(c[1])]
        if math.prod(want[1]) == 0:
            if got:
                out.append(f"rank {rank}: {fqn}: holds none of it, but its save plan writes {got}")
        elif got != [want]:
            out.append(f"rank {rank}: {fqn}: save plan writes {got or 'nothing'}, the "
                       f"reference piece is offset {want[0]} size {want[1]}")
    return out


def saved_metadata(shapes: dict, mesh: Mesh):
    """The checkpoint metadata of a save at ``mesh`` (module rules), float32 tensors."""
    import torch
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata,
                                                       TensorProperties, TensorStorageMetadata)

    layout = fsdp2_layout(list(shapes.items()), mesh.world_size, shard_world_size=mesh.shard)
    md = {}
    for fqn, shape in shapes.items():
        chunks = []
        for k in range(mesh.shard):
            off, size = _box(layout, fqn, k)
            if math.prod(size):
                chunks.append(ChunkStorageMetadata(offsets=torch.Size(off),
                                                   sizes=torch.Size(size)))
        md[fqn] = TensorStorageMetadata(properties=TensorProperties(dtype=torch.float32),
                                        size=torch.Size(shape), chunks=chunks)
    return Metadata(state_dict_metadata=md)


def load_problems(sd: dict, shapes: dict, metadata, mesh: Mesh, rank: int) -> list[str]:
    """Where the rank's DCP load plan does not read exactly its new piece (module rules)."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    planner = DefaultLoadPlanner()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        planner.set_up_planner(sd, metadata, is_coordinator=False)
        plan = planner.create_local_plan()
    layout = fsdp2_layout(list(shapes.items()), mesh.world_size, shard_world_size=mesh.shard)
    reads: dict[str, list] = {}
    for item in plan.items:
        reads.setdefault(item.dest_index.fqn, []).append(item)
    chunks = {fqn: {tuple(c.offsets): tuple(c.sizes) for c in m.chunks}
              for fqn, m in metadata.state_dict_metadata.items()}
    out = []
    for fqn in shapes:
        off, size = _box(layout, fqn, rank)
        need = math.prod(size)
        items = reads.get(fqn, [])
        got = sum(math.prod(i.lengths) for i in items)
        if got != need:
            out.append(f"rank {rank}: {fqn}: load plan reads {got} elements, its piece has "
                       f"{need} (offset {off}, size {size})")
            continue
        boxes = []
        for i in items:
            start = tuple(i.dest_offsets)
            end = tuple(a + n for a, n in zip(start, i.lengths))
            if any(e > s for e, s in zip(end, size)):
                out.append(f"rank {rank}: {fqn}: a read lands outside the local piece "
                           f"({start}..{end}, piece size {size})")
            src = chunks[fqn].get(tuple(i.storage_index.offset))
            if src is None or any(o + n > s for o, n, s in zip(i.storage_offsets, i.lengths,
                                                               src)):
                out.append(f"rank {rank}: {fqn}: a read outside the saved chunk at "
                           f"{tuple(i.storage_index.offset)}")
            boxes.append((start, end))
        for a in range(len(boxes)):
            for b in range(a + 1, len(boxes)):
                if all(max(x0, y0) < min(x1, y1) for x0, x1, y0, y1 in
                       zip(boxes[a][0], boxes[a][1], boxes[b][0], boxes[b][1])):
                    out.append(f"rank {rank}: {fqn}: two reads write the same elements")
    return out
