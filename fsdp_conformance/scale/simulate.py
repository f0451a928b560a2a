"""One rank of a job of thousands, simulated in this process: torch's "fake" process group
(``torch.testing._internal.distributed.fake_pg``: collectives do nothing, every rank id is
accepted) and a model on the meta device, sharded with ``fully_shard`` as a trainer does;
what torch gives that rank is read off its DTensors.

Rules
- A mesh is written ``N`` (1-D FSDP over N ranks), ``RxS`` (HSDP: R replicas x S shards,
  placements ``(Replicate(), Shard(0))``), as the plugin writes world sizes, or ``DxTtp``
  (FSDP over D ranks x tensor parallelism of degree T: a ``("dp", "tp")`` mesh of D*T ranks;
  the model's tensor-parallel plan is applied on ``tp`` with ``parallelize_module``, then
  ``fully_shard`` on ``dp``, torchtitan's order).
- A rank's piece of a parameter is the local tensor ``fully_shard`` gave it (its shape) and
  its global offset as DCP computes it for its save and load plans
  (``compute_local_shape_and_global_offset``, the function DCP's planners call), on the
  mesh made for this rank.
- The process group is created for the one rank and destroyed afterwards; nothing is left
  initialised, so ranks are simulated one after another in one process.
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

from .models import ModelFn, units


@dataclass(frozen=True, kw_only=True)
class Mesh:
    """A save or load side's mesh."""

    world_size: int
    """All ranks."""
    shard: int
    """Ranks one shard group chunks a parameter over (the world size on a 1-D mesh, D on a
    ``DxTtp`` one)."""
    tp: int = 1
    """Tensor-parallel degree (1: none)."""
    tp_plan: tuple[tuple[str, str], ...] = ()
    """With ``tp`` > 1: ``(nn.Linear FQN, "colwise" | "rowwise")`` of the model's
    tensor-parallel plan (``reference.fsdp2_layout.TP_STYLES``)."""

    @property
    def replicas(self) -> int:
        return self.world_size // (self.shard * self.tp)

    @property
    def text(self) -> str:
        if self.tp > 1:
            return f"{self.shard}x{self.tp}tp"
        return str(self.world_size) if self.replicas == 1 else f"{self.replicas}x{self.shard}"

    @property
    def replica_ranks(self) -> range:
        """The ranks of the first replica: every distinct piece is on one of them."""
        return range(self.world_size // self.replicas)

    @classmethod
    def parse(cls, text: str) -> "Mesh":
        """``"1024"``, ``"64x16"`` or ``"128x8tp"`` (ValueError naming the text otherwise)."""
        raw = str(text).strip()
        tp = raw.endswith("tp")
        r, x, s = (raw[:-2] if tp else raw).partition("x")
        try:
            reps, shard = (int(r), int(s)) if x else (1, int(r))
        except ValueError:
            raise ValueError(f"a mesh is written N, RxS (R replicas x S shards) or DxTtp (D "
                             f"FSDP ranks x tensor parallelism T), e.g. 1024, 64x16 or "
                             f"128x8tp; got {text!r}") from None
        if tp and not x:
            raise ValueError(f"mesh {text!r}: tensor parallelism is written DxTtp, e.g. 128x8tp")
        if reps < 1 or shard < 1:
            raise ValueError(f"mesh {text!r}: sizes must be >= 1")
        if tp:
            return cls(world_size=reps * shard, shard=reps, tp=shard)
        return cls(world_size=reps * shard, shard=shard)

    def with_plan(self, plan) -> "Mesh":
        """This mesh with the model's tensor-parallel plan (``{FQN: style}``); ValueError
        when the mesh has tensor parallelism and the model no plan."""
        if self.tp > 1 and not plan:
            raise ValueError(f"mesh {self.text} has tensor parallelism, but the model has no "
                             f"tensor-parallel plan: give tp_plan={{'<nn.Linear FQN>': "
                             f"'colwise' | 'rowwise', ...}}")
        return dataclasses.replace(self, tp_plan=tuple(sorted(plan.items())) if self.tp > 1
                                   else ())


Piece = tuple[tuple[int, ...], tuple[int, ...]]
"""(local shape, global offset) of one parameter on one rank."""


@contextlib.contextmanager
def simulated_rank(model_fn: ModelFn, mesh: Mesh, rank: int, ignored: tuple[str, ...] = ()):
    """Inside the block, this process is ``rank`` of ``mesh`` (a fake process group) and
    holds the model ``fully_shard`` made there (its units one by one, then the root):
    yields ``(model, state_dict)``, the state dict torch's DSD gives a trainer
    (``get_model_state_dict``: every param, a tied one under each of its names, the
    persistent buffers), its DTensors on the mesh made for this rank
    (an equal mesh of an earlier simulated rank may be the one a DTensor keeps, cached by
    shape, with that rank's coordinate; in a real job each process is one rank and they
    are the same). ``ignored``: parameters (FQNs) ``fully_shard`` leaves to the ranks
    (``ignored_params``): plain tensors in the state dict. The process group is destroyed on
    leaving."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not 0 <= rank < mesh.world_size:
        raise ValueError(f"rank {rank} is not a rank of mesh {mesh.text}")
    dist.init_process_group("fake", rank=rank, world_size=mesh.world_size, store=FakeStore())
    try:
        model = model_fn()
        if mesh.tp > 1:
            from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                           parallelize_module)

            mesh2d = init_device_mesh("cpu", (mesh.shard, mesh.tp), mesh_dim_names=("dp", "tp"))
            styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
            parallelize_module(model, mesh2d["tp"],
                               {fqn: styles[style]() for fqn, style in mesh.tp_plan})
            device_mesh = mesh2d["dp"]
        elif mesh.replicas == 1:
            device_mesh = init_device_mesh("cpu", (mesh.world_size,))
        else:
            device_mesh = init_device_mesh("cpu", (mesh.replicas, mesh.shard),
                                           mesh_dim_names=("replicate", "shard"))
        left = {model.get_parameter(fqn) for fqn in ignored} or None
        for name in units(model):
            fully_shard(model.get_submodule(name), mesh=device_mesh, ignored_params=left)
        fully_shard(model, mesh=device_mesh, ignored_params=left)
        # this rank's meshes, by dimension (a DTensor may keep an equal mesh of an earlier
        # simulated rank): the 2-D (dp, tp) mesh of the tensor-parallel params, else the one
        # fully_shard used
        mine = {device_mesh.ndim: device_mesh}
        if mesh.tp > 1:
            mine[2] = mesh2d
        yield model, _remade(get_model_state_dict(model), mine)
    finally:
        dist.destroy_process_group()


def _remade(sd: dict, meshes: dict) -> dict:
    """``sd`` with every DTensor re-made on this rank's mesh of its dimension (``meshes``:
    ``{ndim: mesh}``; a DTensor may keep an equal mesh of an earlier simulated rank)."""
    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_map_only

    return tree_map_only(DTensor, lambda t: DTensor.from_local(
        t.to_local(), device_mesh=meshes[t.device_mesh.ndim], placements=t.placements,
        shape=t.shape, stride=t.stride(), run_check=False), sd)


def adam_state(model, params: dict, *, flatten: bool) -> dict:
    """torch's own ``get_optimizer_state_dict`` of an Adam over the simulated model (DSD's
    ``_init_optim_state`` gives every param its state: step, exp_avg, exp_avg_sq; on meta
    tensors nothing is computed), with DSD's ``flatten_optimizer_state_dict`` as given, its
    DTensors re-made on the rank's mesh (``params``: ``simulated_rank``'s state dict)."""
    import torch
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         get_optimizer_state_dict)
    from torch.distributed.tensor import DTensor

    meshes = {t.device_mesh.ndim: t.device_mesh for t in params.values()
              if isinstance(t, DTensor)}
    optim = torch.optim.Adam(model.parameters(), lr=1e-3)
    osd = get_optimizer_state_dict(model, optim, options=StateDictOptions(
        flatten_optimizer_state_dict=flatten))
    return _remade(osd, meshes)


def fsdp1_reach() -> str:
    """Why FSDP1 (``FullyShardedDataParallel``, flat parameters) is not simulated here, as
    this torch says it: FSDP1 wraps a small meta module on rank 1 of 16 under the fake
    process group, first as a trainer on this machine would (no ``device_id``), then with
    ``device_id=cpu``. The first raises on a machine without an accelerator; the second
    materialises the parameters on the CPU (allocated and initialised for real, unit by
    unit, before they are flattened): the real model's memory per unit and its
    initialisation time on every simulated rank, not meta tensors."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def wrap(device_id) -> str:
        with torch.device("meta"):
            module = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.Linear(48, 3))
        dist.init_process_group("fake", rank=1, world_size=16, store=FakeStore())
        try:
            flat = FSDP(module, device_id=device_id, use_orig_params=True)
            devices = sorted({str(p.device) for p in flat.parameters()})
            return f"wraps, its parameters on {', '.join(devices)}"
        except Exception as exc:  # noqa: BLE001 (what torch raises is the finding)
            return f"raises {type(exc).__name__}: {str(exc).splitlines()[0]}"
        finally:
            dist.destroy_process_group()

    return (f"FSDP1 on a meta module (fake process group, rank 1 of 16): without device_id "
            f"it {wrap(None)}; with device_id=cpu it {wrap(torch.device('cpu'))}: the "
            f"parameters are allocated and initialised for real before they are flattened, "
            f"so nothing is read off meta tensors. Not simulated at scale; the conformance "
            f"run checks FSDP1's flat layout at 1-4 real ranks.")


def aliases_of(model_fn: ModelFn) -> dict[str, str]:
    """``{second name: first name}`` of every tied parameter (one tensor under several
    FQNs: a trainer's state dict holds each name; ``shapes_of`` the first)."""
    first: dict[int, str] = {}
    out = {}
    for f, p in model_fn().named_parameters(remove_duplicate=False):
        if id(p) in first:
            out[f] = first[id(p)]
        else:
            first[id(p)] = f
    return out


def shapes_of(model_fn: ModelFn) -> dict[str, tuple[int, ...]]:
    """Every parameter's global shape, in ``named_parameters()`` order (meta: no memory)."""
    return {f: tuple(p.shape) for f, p in model_fn().named_parameters()}
