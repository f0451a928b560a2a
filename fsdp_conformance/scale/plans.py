"""DCP's own save and load plans of simulated ranks, checked by position against the
reference.

Rules
- What is planned is a trainer's checkpoint: ``{"model": params, "optim": Adam's state}``
  (the state from torch's ``get_optimizer_state_dict``, with DSD's flattening off or on:
  the state's DCP keys are the same, the param groups' differ). Every key of the flattened
  dict has a place (``key_table``): a sharded key's is its parameter's reference box on the
  rank (the parameter's own key ``model.<fqn>``, its state ``optim.state.<fqn>.<name>``); a
  plain tensor's (a param's ``step``, a param FSDP leaves to the ranks) is the whole tensor;
  anything else is bytes.
- Save, one rank (``save_problems``): the rank's ``DefaultSavePlanner.create_local_plan()``
  writes every key of the dict exactly once, no key the dict lacks: a tensor key as one
  write item whose chunk (offsets and sizes, global) is the key's place on the rank and
  whose index names that offset; a bytes key as bytes. A rank whose box is empty writes
  nothing of the key, or only an empty piece.
- Save, all ranks (``coordinate``): torch's coordinator, ``DefaultSavePlanner.
  create_global_plan`` (de-duplication, index hints, metadata, its own validation), over the
  plans of every rank of the mesh: each sampled rank's own torch plan, every other rank's
  the first sampled rank's plan with each sharded item's piece moved to that rank's
  reference box (the plain and bytes items as they are: every rank writes them, as replicas
  do). After it every sharded key's pieces tile the parameter exactly once and every other
  key of the dict has exactly one writer (none is a failure too); the metadata torch wrote
  must hold every key, each tensor's chunks the reference's pieces.
- Load, one rank (``load_problems``): the rank's ``DefaultLoadPlanner.create_local_plan()``
  against the save's metadata (torch's, from ``coordinate``) reads every key of the dict
  from the same key of the checkpoint, each read item by position: its source (the saved
  chunk's global offset plus its offset inside the chunk) is its destination (the rank's
  place of the key plus the item's offset inside it), element for element; inside the chunk
  it names, which the checkpoint holds, and inside the local piece; the reads of a key tile
  its place once (no element missing, none twice); a bytes key read once.
- ``saved_metadata`` is the reference's metadata of a save at a mesh (each distinct box once,
  a plain tensor whole, bytes for the rest): what torch's is compared with, and what a load
  is checked against when torch's coordinator refused the save.
"""
from __future__ import annotations

import collections
import dataclasses
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Key:
    """One key of a flattened checkpoint, as the checks place it (module rules)."""

    param: str | None
    """The parameter whose reference box a sharded key's piece is (None: not sharded)."""
    shape: tuple[int, ...] | None
    """The global shape of a tensor key (None: bytes)."""


BYTES = Key(param=None, shape=None)


def key_table(sd: dict, shapes: dict) -> tuple[dict[str, Key], list[str]]:
    """Every key of ``sd`` flattened as DCP flattens it, with its place (module rules), and
    the sharded keys no parameter of ``shapes`` explains (the check cannot place them:
    each a problem)."""
    import torch

    table, unplaced = {}, []
    for key, value in _flat(sd).items():
        if _sharded(value):
            fqn = param_of(key, shapes)
            if fqn is None:
                unplaced.append(f"{key}: a sharded tensor of no parameter the check knows")
                continue
            table[key] = Key(param=fqn, shape=tuple(shapes[fqn]))
        elif isinstance(value, torch.Tensor):
            table[key] = Key(param=None, shape=tuple(value.shape))
        else:
            table[key] = BYTES
    return table, unplaced


def place(key: Key, layout, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """``(global offset, size)`` of what ``rank`` holds of ``key`` (None: bytes)."""
    if key.shape is None:
        return None
    if key.param is not None:
        return reference_box(layout, key.param, rank)
    return (0,) * len(key.shape), key.shape


def local_save_plan(sd: dict):
    """The rank's own ``DefaultSavePlanner.create_local_plan()`` of ``sd`` (torch's)."""
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    planner = DefaultSavePlanner()
    return _quiet(lambda: (planner.set_up_planner(sd, is_coordinator=False),
                           planner.create_local_plan())[1])


def save_problems(sd: dict, shapes: dict, mesh: Mesh, rank: int, plan=None) -> list[str]:
    """Where the rank's DCP save plan of ``sd`` (``plan``: torch's, made here when not
    given) does not write every key once at its place (module rules)."""
    if plan is None:
        plan = local_save_plan(sd)
    table, unplaced = key_table(sd, shapes)
    layout = reference_layout(shapes, mesh)
    out = [f"rank {rank}: {u}" for u in unplaced]
    writes: collections.Counter = collections.Counter()
    for item in plan.items:
        key = item.index.fqn
        if key not in table:
            out.append(f"rank {rank}: its save plan writes {key!r}, which the state dict "
                       f"does not hold")
            continue
        want = place(table[key], layout, rank)
        if want is None or item.tensor_data is None:
            if (want is None) != (item.tensor_data is None):
                out.append(f"rank {rank}: {key}: written as "
                           f"{'bytes' if item.tensor_data is None else 'a tensor'}, the "
                           f"state dict holds {'bytes' if want is None else 'a tensor'}")
            writes[key] += 1
            continue
        c = item.tensor_data.chunk
        got = (tuple(c.offsets), tuple(c.sizes))
        if math.prod(got[1]) == 0 and math.prod(want[1]) == 0:
            continue  # an empty piece of a key the rank holds none of
        writes[key] += 1
        if got != want:
            out.append(f"rank {rank}: {key}: save plan writes offset {got[0]} size {got[1]}, "
                       f"the reference piece is offset {want[0]} size {want[1]}")
        elif tuple(item.index.offset or ()) != got[0]:
            out.append(f"rank {rank}: {key}: its write item's index names offset "
                       f"{tuple(item.index.offset or ())}, its chunk is at {got[0]}")
    for key, k in table.items():
        want = place(k, layout, rank)
        if want is not None and math.prod(want[1]) == 0:
            continue
        if writes[key] != 1:
            times = "nowhere" if not writes[key] else f"{writes[key]} times"
            out.append(f"rank {rank}: {key}: its save plan writes it {times}, expected once")
    return out


def saved_metadata(sd: dict, shapes: dict, mesh: Mesh):
    """The reference's metadata of a save of ``sd``'s keys at ``mesh`` (module rules)."""
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Coordinated:
    """What torch's save coordinator made of every rank's plan (``coordinate``)."""

    problems: tuple[str, ...]
    """Where the de-duplicated plans or torch's metadata are not the reference's."""
    metadata: object | None
    """The checkpoint metadata torch's coordinator wrote (None: it refused the plans)."""
    from_torch: int
    """Ranks whose plan is torch's own (the sampled ones)."""
    from_reference: int
    """Ranks whose plan was built from the reference (module rules)."""


def coordinate(plans: dict, table: dict[str, Key], shapes: dict, mesh: Mesh,
               reference_md) -> Coordinated:
    """Torch's coordinator (``DefaultSavePlanner.create_global_plan``) over the plans of all
    ``mesh.world_size`` ranks (module rules): ``plans`` ``{rank: torch's plan}`` of the
    sampled ranks; ``table`` the checkpoint's keys (``key_table``); ``reference_md`` the
    reference's metadata of the save (``saved_metadata``), which torch's must equal."""
    import torch
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    layout = reference_layout(shapes, mesh)
    template = plans[min(plans)]

    def param(item) -> str | None:
        return table.get(item.index.fqn, BYTES).param

    plain = [i for i in template.items if param(i) is None]
    sharded = [i for i in template.items if param(i) is not None]

    def plan_of(r: int):
        if r in plans:
            return plans[r]
        items = list(plain)
        for item in sharded:
            off, size = reference_box(layout, param(item), r)
            if math.prod(size):
                chunk = ChunkStorageMetadata(offsets=torch.Size(off), sizes=torch.Size(size))
                items.append(dataclasses.replace(
                    item, index=MetadataIndex(item.index.fqn, torch.Size(off)),
                    tensor_data=dataclasses.replace(item.tensor_data, chunk=chunk)))
        return dataclasses.replace(template, items=items)

    all_plans = [plan_of(r) for r in range(mesh.world_size)]
    planner = DefaultSavePlanner()
    out: list[str] = []
    try:
        global_plans, metadata = _quiet(lambda: planner.create_global_plan(all_plans))
    except Exception as exc:  # noqa: BLE001 (torch refusing the plans is the finding)
        first = (str(exc).strip().splitlines() or [""])[0]
        out.append(f"torch's coordinator (create_global_plan) refused the "
                   f"{mesh.world_size} ranks' plans: {type(exc).__name__}: {first}")
        global_plans, metadata = planner._dedup_save_plans(all_plans), None
    pieces: dict[str, list] = collections.defaultdict(list)
    writers = collections.Counter({k: 0 for k, v in table.items() if v.param is None})
    for p in global_plans:
        for item in p.items:
            if param(item) is not None:
                c = item.tensor_data.chunk
                if math.prod(c.sizes):
                    pieces[item.index.fqn].append((tuple(c.offsets), tuple(c.sizes)))
            else:
                writers[item.index.fqn] += 1
    out += [f"{key}: written by {n or 'no'} rank{'' if n == 1 else 's'} after "
            f"de-duplication, expected 1" for key, n in sorted(writers.items()) if n != 1]
    for key in sorted(k for k, v in table.items() if v.param is not None):
        gap = tiling_problem(table[key].shape, pieces[key])
        if gap is not None:
            out.append(f"{key}: {gap} after de-duplication")
    if metadata is not None:
        out += metadata_problems(metadata, reference_md)
    return Coordinated(problems=tuple(out), metadata=metadata, from_torch=len(plans),
                       from_reference=mesh.world_size - len(plans))


def _chunks(m) -> list | None:
    """A tensor's chunks, the empty ones left out (a rank holding none of a param may write
    an empty piece: it holds no element); None for bytes."""
    return None if not hasattr(m, "chunks") else sorted(
        (tuple(c.offsets), tuple(c.sizes)) for c in m.chunks if math.prod(c.sizes))


def metadata_problems(got, want) -> list[str]:
    """Where torch's checkpoint metadata ``got`` differs from the reference's ``want``: a key
    missing or extra, bytes for a tensor, another global size, other chunks."""
    g, w = got.state_dict_metadata, want.state_dict_metadata
    out = [f"{k}: in the metadata torch wrote, not in the checkpoint"
           for k in sorted(set(g) - set(w))]
    out += [f"{k}: missing from the metadata torch wrote" for k in sorted(set(w) - set(g))]
    for k in sorted(set(g) & set(w)):
        gc, wc = _chunks(g[k]), _chunks(w[k])
        if (gc is None) != (wc is None):
            out.append(f"{k}: torch's metadata holds {'bytes' if gc is None else 'a tensor'}, "
                       f"the checkpoint {'bytes' if wc is None else 'a tensor'}")
        elif gc is not None and tuple(g[k].size) != tuple(w[k].size):
            out.append(f"{k}: torch's metadata says size {tuple(g[k].size)}, the reference "
                       f"{tuple(w[k].size)}")
        elif gc != wc:
            extra = [c for c in gc if c not in wc][:3]
            lost = [c for c in wc if c not in gc][:3]
            out.append(f"{k}: torch's metadata chunks differ from the reference's pieces"
                       + (f"; not the reference's: {extra}" if extra else "")
                       + (f"; missing: {lost}" if lost else ""))
    return out


def saved_chunks(metadata) -> dict[str, dict[tuple, tuple]]:
    """``{key: {chunk offsets: chunk sizes}}`` of every tensor in a checkpoint's
    ``metadata``: what a read may name (built once per metadata: every load rank reads it)."""
    return {key: {tuple(c.offsets): tuple(c.sizes) for c in m.chunks}
            for key, m in metadata.state_dict_metadata.items() if hasattr(m, "chunks")}


def load_problems(sd: dict, shapes: dict, metadata, mesh: Mesh, rank: int,
                  chunks: dict | None = None) -> list[str]:
    """Where the rank's DCP load plan of ``sd`` against ``metadata`` does not read every key
    from itself, each element from its own position (module rules); ``chunks``:
    ``saved_chunks(metadata)`` where the caller has it."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    planner = DefaultLoadPlanner()
    plan = _quiet(lambda: (planner.set_up_planner(sd, metadata, is_coordinator=False),
                           planner.create_local_plan())[1])
    table, unplaced = key_table(sd, shapes)
    layout = reference_layout(shapes, mesh)
    if chunks is None:
        chunks = saved_chunks(metadata)
    out = [f"rank {rank}: {u}" for u in unplaced]
    reads: dict[str, list] = collections.defaultdict(list)
    for item in plan.items:
        key, src = item.dest_index.fqn, item.storage_index.fqn
        if key not in table:
            out.append(f"rank {rank}: its load plan reads into {key!r}, which the state "
                       f"dict does not hold")
            continue
        if src != key:
            out.append(f"rank {rank}: {key}: a read fills it from the saved {src!r}")
        mine = place(table[key], layout, rank)
        if mine is None:
            reads[key].append(None)
            continue
        off, size = mine
        start, length = tuple(item.dest_offsets), tuple(item.lengths)
        end = tuple(a + n for a, n in zip(start, length))
        if len(start) != len(size) or any(e > s for e, s in zip(end, size)):
            out.append(f"rank {rank}: {key}: a read lands outside the local piece "
                       f"({start}..{end}, piece size {size})")
        at = tuple(item.storage_index.offset or ())
        saved = chunks.get(src, {}).get(at)
        inside = tuple(item.storage_offsets)
        if saved is None:
            out.append(f"rank {rank}: {key}: a read names a saved chunk of {src!r} at {at}, "
                       f"which the checkpoint does not hold")
        elif any(o + n > s for o, n, s in zip(inside, length, saved)):
            out.append(f"rank {rank}: {key}: a read outside the saved chunk at {at} "
                       f"(offset {inside}, {length} elements, chunk size {saved})")
        else:
            source = tuple(a + b for a, b in zip(at, inside))
            dest = tuple(a + b for a, b in zip(off, start))
            if source != dest:
                out.append(f"rank {rank}: {key}: a read of {length} elements takes the saved "
                           f"elements at {source} (offset {inside} in the chunk at {at}) "
                           f"into {dest} (offset {start} in the piece at {off})")
        reads[key].append((start, end))
    for key, k in table.items():
        mine = place(k, layout, rank)
        got = reads.get(key, [])
        if mine is None:
            if len(got) != 1:
                times = "nowhere" if not got else f"{len(got)} times"
                out.append(f"rank {rank}: {key}: its load plan reads it {times}, expected once")
            continue
        off, size = mine
        need = math.prod(size)
        total = sum(math.prod(e - s for s, e in zip(*b)) for b in got)
        if total != need:
            out.append(f"rank {rank}: {key}: load plan reads {total} elements, its piece has "
                       f"{need} (offset {off}, size {size})")
            continue
        for a in range(len(got)):
            for b in range(a + 1, len(got)):
                if all(max(x0, y0) < min(x1, y1) for x0, x1, y0, y1 in
                       zip(got[a][0], got[a][1], got[b][0], got[b][1])):
                    out.append(f"rank {rank}: {key}: two reads write the same elements")
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
