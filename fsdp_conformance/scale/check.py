"""``check_scale``: at the world sizes users run, does every rank get the piece of every
parameter the reference implementation says, on the save mesh and on the load mesh?

Rules
- The reference is ``reference.fsdp2_layout`` (``torch.chunk`` rows of dim 0 over a shard
  group): each rank's box of each parameter, for every rank (arithmetic, no torch).
- Exact cover: on each side, the boxes of one shard group hold every element of every
  parameter exactly once (``cover_problems``); so whatever a load rank's new box is, the
  saved pieces hold it.
- Torch against the reference: ranks are simulated one by one (scale/simulate.py) and each
  sampled rank's local shape and global offset must equal its box. Sampling is exact for the
  chunk rule: within a shard group a rank's box depends only on which of three classes it
  falls in (a full chunk at ``k*R``, the one short chunk, an empty one at ``d0``), so the
  sample takes, for every distinct dim-0 size, the ranks where the class changes (the last
  full, the short, the first empty rank) plus the first, second and last shard rank; on an
  HSDP mesh, those shard ranks in the first and the last replica. On a ``DxTtp`` mesh the
  rule is applied to the rows ``fully_shard`` chunks over the D ranks (a column-wise param's
  tensor-parallel chunk, every other param whole), on every tp coordinate where the chunk
  class changes plus the first, second and last one. The report lists them.
- What torch raises is a verdict. Where a known limitation (known/scale.py) concerns some
  parameter, the model is first sharded as it is and the entry judged against what torch
  raised ("known" only when exactly as modelled); every side is then checked with those
  parameters left to the ranks (the entry's workaround), so everything else is still
  checked. Anything torch raises on a sampled rank that no entry models is a failure naming
  the ranks and the error (``Side.raised``), and the next rank is simulated.
- Figures: ranks simulated per second, the wall time, and the process's peak resident
  memory (meta tensors: it stays small).
"""
from __future__ import annotations

import functools
import resource
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

from ..known.scale import applying
from ..reference.fsdp2_layout import chunk_range
from .models import build, tp_plan as built_in_plan
from .plans import reference_box, reference_layout, tiling_problem
from .simulate import Mesh, Piece, aliases_of, shapes_of, simulated_rank


@dataclass(frozen=True, kw_only=True)
class Side:
    """What one side (save or load mesh) showed."""

    mesh: str
    """The mesh as written (``1024``, ``64x16``)."""
    ranks: tuple[int, ...]
    """The ranks simulated (module rules: the sample)."""
    mismatches: tuple[str, ...]
    """Each parameter on each rank where torch's piece is not the reference's."""
    cover: tuple[str, ...]
    """Exact-cover problems of the reference boxes (none expected)."""
    plans: tuple[str, ...] = ()
    """Where DCP's own plans are not the reference's (scale/plans.py), by key and position:
    of the trainer's checkpoint, params and Adam's state with DSD's flattening off and on;
    on the save side each sampled rank's write items and torch's coordinator over every
    rank's plan (each key written once, its metadata the reference's); on the load side
    whether each read takes every element from its own position of the same key."""
    sources: tuple[str, ...] = ()
    """What each check compares and where each part comes from (torch's own, or built
    from the reference), as the report says it."""
    empty_params: int
    """Parameters some rank of this mesh holds no element of (dim 0 < shard group size, or
    fewer chunks than ranks)."""
    raised: tuple[str, ...] = ()
    """What was raised on a sampled rank while torch sharded or planned, no known limitation
    modelling it (module rules): a failure, naming the ranks and who raised it (torch, or
    fsdp-conformance itself: a bug of the check, not a finding in torch)."""
    seconds: float
    """Wall time of this side's simulated ranks."""


@dataclass(frozen=True, kw_only=True)
class ScaleResult:
    """``check_scale``'s answer."""

    model: str
    """The model's name."""
    params: int
    """Parameters of the model."""
    elements: int
    """Elements of all parameters."""
    sides: dict[str, Side] = field(default_factory=dict)
    """"save" and "load"."""
    peak_rss_mib: float = 0.0
    """This process's peak resident memory at the end."""
    unreached: dict[str, str] = field(default_factory=dict)
    """What the fake process group and meta tensors cannot reach here, by name, with what
    this torch said (``simulate.fsdp1_reach``): reported, never a pass."""
    known: tuple["KnownAtScale", ...] = ()
    """Each known torch limitation that concerns some parameter of the model, with its
    verdict (module rules)."""

    @property
    def ok(self) -> bool:
        return (all(not s.mismatches and not s.cover and not s.plans and not s.raised
                    for s in self.sides.values())
                and all(k.status == "known" for k in self.known))

    @property
    def ranks_per_second(self) -> float:
        n = sum(len(s.ranks) for s in self.sides.values())
        t = sum(s.seconds for s in self.sides.values())
        return n / t if t else 0.0


@dataclass(frozen=True, kw_only=True)
class KnownAtScale:
    """A known torch limitation (known/scale.py) met by the model, and its verdict."""

    key: str
    """The entry's key."""
    params: tuple[str, ...]
    """The parameters it concerns (its model's reading of the shapes)."""
    status: str
    """"known": torch did exactly what the entry models; "fail": it did not (why in
    ``detail``)."""
    detail: str
    """What torch raised, or how it differs from the model."""
    workaround: str
    """How the other parameters were still checked."""


def _class_changes(extents, n: int) -> set[int]:
    """The chunk indices of ``torch.chunk`` over ``n`` where the chunk class changes, for
    every extent, plus the first, second and last (module rules)."""
    out = {0, min(1, n - 1), n - 1}
    for d0 in set(extents):
        if d0 == 0:
            continue
        size = -(-d0 // n)
        last_full = d0 // size - 1  # the last rank holding a whole chunk
        out.update(k for k in (last_full, last_full + 1, last_full + 2) if 0 <= k < n)
    return out


def sample_ranks(shapes: dict[str, tuple[int, ...]], mesh: Mesh) -> list[int]:
    """The ranks to simulate on ``mesh`` (module rules), sorted."""
    s = mesh.shard
    if mesh.tp > 1:
        layout = reference_layout(shapes, mesh)  # its params know their tensor-parallel dim
        params = [layout.param(fqn) for fqn, shape in shapes.items() if shape]
        tp_ranks = _class_changes([p.shape[p.tp_dim] for p in params if p.tp_dim is not None],
                                  mesh.tp)
        # what fully_shard chunks over the dp ranks on each tp coordinate (rank t: dp 0, tp t)
        rows = {p.tp_local_shape(t)[0] for p in params for t in range(mesh.tp)}
        dp_ranks = _class_changes(rows, s)
        return sorted(d * mesh.tp + t for d in dp_ranks for t in tp_ranks)
    shard_ranks = _class_changes([shape[0] for shape in shapes.values() if shape], s)
    replicas = {0, mesh.replicas - 1}
    return sorted(r * s + k for r in replicas for k in shard_ranks)


def expected(shapes: dict[str, tuple[int, ...]], mesh: Mesh, rank: int) -> dict[str, Piece]:
    """The reference's piece of every parameter on ``rank`` (scale/plans.py's boxes)."""
    layout = reference_layout(shapes, mesh)
    out = {}
    for fqn in shapes:
        offset, size = reference_box(layout, fqn, rank)
        out[fqn] = (size, offset)
    return out


def cover_problems(shapes: dict[str, tuple[int, ...]], mesh: Mesh) -> list[str]:
    """Where one shard group's dim-0 ranges (on a ``DxTtp`` mesh: the reference boxes of
    every rank) do not tile a parameter exactly once."""
    out = []
    if mesh.tp > 1:
        layout = reference_layout(shapes, mesh)
        for fqn, shape in shapes.items():
            if not shape:
                out.append(f"{fqn}: a 0-dim parameter (fully_shard rejects it)")
                continue
            boxes = {reference_box(layout, fqn, r) for r in mesh.replica_ranks}
            gap = tiling_problem(shape, [b for b in boxes if all(b[1])])
            if gap is not None:
                out.append(f"{fqn}: {gap}")
        return out
    for fqn, shape in shapes.items():
        if not shape:
            out.append(f"{fqn}: a 0-dim parameter (fully_shard rejects it)")
            continue
        ranges = sorted(chunk_range(shape[0], mesh.shard, k) for k in range(mesh.shard))
        at = 0
        for a, b in ranges:
            if a != at and a != b:
                out.append(f"{fqn}: rows {at}..{a} held by no rank or twice")
                break
            at = max(at, b)
        if at != shape[0]:
            out.append(f"{fqn}: rows {at}..{shape[0]} held by no rank")
    return out


def _has_empty_rank(d0: int, shard: int) -> bool:
    """Whether ``torch.chunk`` of ``d0`` rows over ``shard`` ranks leaves a rank none."""
    size = -(-d0 // shard) if d0 else 0
    return d0 == 0 or -(-d0 // size) < shard


def torch_pieces_of(sd: dict) -> dict[str, Piece]:
    """What a simulated rank holds of each parameter (simulate.py ``simulated_rank``'s state
    dict): the local shape and DCP's global offset."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    return {fqn: (tuple(t.to_local().shape),
                  tuple(compute_local_shape_and_global_offset(t.shape, t.device_mesh,
                                                              t.placements)[1]))
            for fqn, t in sd.items() if isinstance(t, DTensor)}


def torch_padding_of(model) -> dict[str, tuple[tuple[int, ...], int]]:
    """What ``fully_shard`` pads each parameter's piece to on a simulated rank: ``{fqn:
    (padded shape, elements of its sharded storage)}`` (FSDP2's ``FSDPParam``
    ``padded_sharded_param_size`` and ``_sharded_param_data``, the flat storage the
    all-gather reads)."""
    names = {id(p): f for f, p in model.named_parameters()}
    out = {}
    for mod in model.modules():
        state = getattr(mod, "_get_fsdp_state", None)
        group = state()._fsdp_param_group if state is not None else None
        for fp in (group.fsdp_params if group is not None else ()):
            fqn = names.get(id(fp.sharded_param))
            if fqn is not None:
                out[fqn] = (tuple(fp.padded_sharded_param_size), fp._sharded_param_data.numel())
    return out


def padding_problems(model, shapes, mesh: Mesh, rank: int) -> list[str]:
    """Where FSDP2's padded piece of a parameter on ``rank`` is not the reference's
    (``Fsdp2Param.padded_local_shape``: chunk 0's shape of what it shards), or its storage
    does not hold exactly that many elements."""
    import math

    layout = reference_layout(shapes, mesh)
    got = torch_padding_of(model)
    out = []
    for fqn in shapes:
        if fqn not in got:
            continue  # not sharded by fully_shard (an ignored param): whole, no padding
        want = layout.param(fqn).padded_local_shape(rank)
        shape, numel = got[fqn]
        if shape != want:
            out.append(f"rank {rank}: {fqn}: torch pads its piece to {shape}, the reference "
                       f"to {want}")
        elif numel != math.prod(want):
            out.append(f"rank {rank}: {fqn}: its sharded storage holds {numel} elements, the "
                       f"padded piece {math.prod(want)}")
    return out


def _raised(exc: BaseException) -> str:
    """``"<Type>: <first line>"`` of what was raised."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _who_raised(exc: BaseException) -> str:
    """``"torch"`` when the innermost frame of the traceback is torch's own code, else
    ``"fsdp-conformance"`` (the check itself: a bug of the suite, not a finding in torch)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = frames[-1].filename.replace("\\", "/") if frames else ""
    return "torch" if "/torch/" in where else "fsdp-conformance"


def _side(name: str, model_fn: Callable, shapes, mesh: Mesh,
          on_rank: Callable[[str, int], None] | None, saved_at: Mesh | None = None,
          saved: dict | None = None, ignored: tuple[str, ...] = (),
          aliases: dict[str, str] | None = None) -> tuple[Side, dict]:
    """One side's sampled ranks: their pieces against the reference, and DCP's plans by
    position (scale/plans.py): on the save side each rank's save plan and torch's
    coordinator over every rank's plan; with ``saved_at`` (the save's mesh), each rank's
    load plan against the save's metadata, ``saved`` (``{flatten: metadata}``: torch's
    coordinator's; where it has none, the reference's metadata of a save at ``saved_at``). ``shapes``: the parameters checked; ``ignored``: those
    left to the ranks (a known limitation's workaround); ``aliases``: ``{second name: first
    name}`` of tied parameters, whose keys the state dict holds too. Each rank's padded
    pieces are checked with its pieces. What torch raises on a rank is
    recorded and the next rank simulated. Returns the side and, on the save side, the
    metadata the save wrote (torch's coordinator's; the reference's where it refused)."""
    from .plans import (checkpoint, coordinate, key_table, load_problems, local_save_plan,
                        save_problems, saved_chunks, saved_metadata)
    from .simulate import adam_state

    t0 = time.perf_counter()
    ranks = sample_ranks(shapes, mesh)
    # what is planned: every key of a trainer's state dict, a tied param under each name
    planned = {**shapes, **{a: shapes[f] for a, f in (aliases or {}).items() if f in shapes}}
    local: dict[bool, dict] = {False: {}, True: {}}
    tables: dict[bool, dict] = {}
    reference_md: dict[bool, object] = {}
    mismatches, plans, raised = [], [], {}
    saved = {} if saved is None else dict(saved)
    index = {flatten: saved_chunks(md) for flatten, md in saved.items()}  # once, every rank
    by_reference: set[bool] = set()
    for r in ranks:
        try:
            with simulated_rank(model_fn, mesh, r, ignored) as (model, sd):
                got, want = torch_pieces_of(sd), expected(shapes, mesh, r)
                padding = padding_problems(model, shapes, mesh, r)
                for flatten in (False, True):  # DSD's flattening off and on (its own keys)
                    ckpt = checkpoint(sd, adam_state(model, sd, flatten=flatten))
                    if saved_at is not None:
                        if flatten not in saved:  # torch wrote none: the reference's
                            saved[flatten] = saved_metadata(ckpt, planned, saved_at)
                            index[flatten] = saved_chunks(saved[flatten])
                            by_reference.add(flatten)
                        plans += load_problems(ckpt, planned, saved[flatten], mesh, r,
                                               index[flatten])
                        continue
                    plan = local_save_plan(ckpt)
                    plans += save_problems(ckpt, planned, mesh, r, plan)
                    local[flatten][r] = plan
                    if flatten not in tables:  # the same keys on every rank
                        tables[flatten] = key_table(ckpt, planned)[0]
                        reference_md[flatten] = saved_metadata(ckpt, planned, mesh)
        except Exception as exc:  # noqa: BLE001 (what torch raised is the finding)
            raised.setdefault(f"{_who_raised(exc)} raised {_raised(exc)}", []).append(r)
        else:
            mismatches += padding
            for fqn in shapes:
                g, w = got.get(fqn), want[fqn]
                if g is None:
                    mismatches.append(f"rank {r}: {fqn}: not a parameter of the sharded model")
                elif g[0] != w[0] or (w[0] and w[0][0] and g[1] != w[1]):
                    mismatches.append(f"rank {r}: {fqn}: torch holds shape {g[0]} at offset "
                                      f"{g[1]}, the reference {w[0]} at {w[1]}")
        if on_rank is not None:
            on_rank(name, r)
    written: dict[bool, object] = {}
    for flatten, mine in local.items():
        if not mine:
            continue
        c = coordinate(mine, tables[flatten], planned, mesh, reference_md[flatten])
        how = "on" if flatten else "off"
        plans += [f"coordinator (DSD flattening {how}): {p}" for p in c.problems]
        if c.metadata is not None:
            written[flatten] = c.metadata
    empty = sum(1 for s in shapes.values() if s and _has_empty_rank(s[0], mesh.shard))
    return Side(mesh=mesh.text, ranks=tuple(ranks), mismatches=tuple(mismatches),
                cover=tuple(cover_problems(shapes, mesh)), empty_params=empty,
                plans=tuple(plans), seconds=time.perf_counter() - t0,
                sources=_sources(mesh, len(ranks), saved_at is not None,
                                 bool(by_reference) or (saved_at is None and
                                                        len(written) < len(local))),
                raised=tuple(f"rank{'s' if len(rs) > 1 else ''} "
                             f"{rs if len(rs) > 1 else rs[0]}: {text}"
                             for text, rs in raised.items())), written


def _sources(mesh: Mesh, sampled: int, load: bool, by_reference: bool) -> tuple[str, ...]:
    """What each check of a side compares, and where each part comes from: torch or the
    reference (module rules); ``by_reference``: torch's coordinator wrote no metadata
    (refused the plans, or no save rank planned), the load is checked against the
    reference's."""
    out = [f"pieces: torch's DTensors on each of the {sampled} sampled ranks (their local "
           f"shapes and DCP's compute_local_shape_and_global_offset) and FSDP2's padded "
           f"pieces (padded_sharded_param_size, its sharded storage) against the "
           f"reference's boxes",
           "checkpoint: what torch's DSD gives a trainer (get_model_state_dict: every "
           "param, a tied one under each name, the persistent buffers; "
           "get_optimizer_state_dict of an Adam)"]
    if not load:
        out += ["save plans: torch's DefaultSavePlanner.create_local_plan on each sampled "
                "rank (the params and torch's Adam state, DSD flattening off and on), "
                "every write item by key and global position",
                f"coordinator: torch's DefaultSavePlanner.create_global_plan over all "
                f"{mesh.world_size} ranks' plans: {sampled} torch's own, "
                f"{mesh.world_size - sampled} built from the reference (the first sampled "
                f"rank's plan with each piece moved to the rank's reference box); every key "
                f"written once after de-duplication; the metadata torch wrote against the "
                f"reference's" + ("; torch wrote none, so the load side is checked against "
                                  "the reference's metadata" if by_reference else "")]
    else:
        what = ("the reference's metadata of the save (torch's coordinator wrote none)"
                if by_reference else "the metadata torch's coordinator wrote for the save")
        out += [f"load plans: torch's DefaultLoadPlanner.create_local_plan on each sampled "
                f"rank against {what}; every read item by key and position (its saved "
                f"source element is its destination element)",
                "load coordinator: none to check (torch's create_default_global_load_plan "
                "returns the ranks' plans unchanged)"]
    return tuple(out)


def _sharding_raises(model_fn: Callable, mesh: Mesh) -> str | None:
    """What torch raises when it shards the model as it is on rank 0 of ``mesh`` (None:
    nothing)."""
    try:
        with simulated_rank(model_fn, mesh, 0):
            return None
    except Exception as exc:  # noqa: BLE001 (what torch raised is the observation)
        return _raised(exc)


def known_at_scale(model_fn: Callable, shapes, mesh: Mesh) -> list[KnownAtScale]:
    """Each known limitation (known/scale.py) that concerns some parameter of ``shapes``,
    judged against what torch raises sharding the model as it is on ``mesh``."""
    found = applying(shapes)
    raised = _sharding_raises(model_fn, mesh) if found else None
    out = []
    for entry, params in found:
        status, detail = entry.judge(params, raised)
        out.append(KnownAtScale(key=entry.key, params=tuple(params), status=status,
                                detail=detail, workaround=entry.workaround))
    return out


def check_scale(model: str | Callable, save: str | int, load: str | int | None = None, *,
                tp_plan: dict[str, str] | None = None,
                on_rank: Callable[[str, int], None] | None = None) -> ScaleResult:
    """Check ``model`` (a built-in name, scale/models.py, or a factory the suite calls under
    ``torch.device("meta")``) sharded with ``fully_shard`` on the ``save`` mesh and on the
    ``load`` mesh (default: the save's) against the reference (module rules). A ``DxTtp``
    mesh applies ``tp_plan`` (``{nn.Linear FQN: "colwise" | "rowwise"}``; a built-in
    model's own by default, ``models.tp_plan``) before ``fully_shard``.
    ``on_rank(side, rank)`` is called after each simulated rank."""
    import torch

    if isinstance(model, str):
        name, model_fn = model, functools.partial(build, model)
    else:
        factory = model

        def model_fn():
            with torch.device("meta"):
                return factory()
        name = getattr(model, "__qualname__", repr(model))
    every = shapes_of(model_fn)
    save_mesh, load_mesh = Mesh.parse(save), Mesh.parse(load if load is not None else save)
    if save_mesh.tp > 1 or load_mesh.tp > 1:
        plan = tp_plan if tp_plan is not None else built_in_plan(model_fn())
        save_mesh, load_mesh = save_mesh.with_plan(plan), load_mesh.with_plan(plan)
    known = known_at_scale(model_fn, every, save_mesh)
    ignored = tuple(p for k in known for p in k.params)
    shapes = {fqn: s for fqn, s in every.items() if fqn not in ignored}
    sides = {}
    aliases = aliases_of(model_fn)
    sides["save"], written = _side("save", model_fn, shapes, save_mesh, on_rank,
                                   ignored=ignored, aliases=aliases)
    sides["load"], _ = _side("load", model_fn, shapes, load_mesh, on_rank,
                             saved_at=save_mesh, saved=written, ignored=ignored,
                             aliases=aliases)
    elements = sum(functools.reduce(lambda a, b: a * b, s, 1) for s in every.values())
    from .simulate import fsdp1_reach

    return ScaleResult(model=name, params=len(every), elements=elements, sides=sides,
                       peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                       unreached={"fsdp1": fsdp1_reach()}, known=tuple(known))
