"""A user's training code on Lightning 2.6.6 Fabric with FSDP2 (``fsdp_version=2``), put under
the suite by ``test_lightning_trainer.py``: the model is sharded by Lightning's own
``ModelParallelStrategy`` (``fabric.setup_module`` calls the ``parallelize_fn`` below, which
``fully_shard``s on the strategy's device mesh), and checkpoints go through ``fabric.save`` /
``fabric.load`` with the model, the optimizer (``fabric.setup_optimizers``), the LR scheduler
and the step, as a distributed checkpoint (the strategy's default,
``save_distributed_checkpoint=True``: a DCP directory plus ``meta.pt``) or a full one (one
file written by rank 0).

CPU set-up, said plainly: Lightning's FSDP1 strategy (``strategy="fsdp"``, ``FSDPStrategy``)
refuses CPU in the connector: ``ValueError: You selected the FSDP strategy but FSDP is only
available on GPU. ...`` (lightning 2.6.6 fabric/connector.py:433-439); the test checks that
message. ``ModelParallelStrategy`` has no such check: ``Fabric(accelerator="cpu",
devices=<world size>, strategy=ModelParallelStrategy(parallelize, data_parallel_size=<world
size>, tensor_parallel_size=1))`` runs FSDP2 on gloo as it is, no patching. The ranks already
exist (the suite's pool: one process per rank, torchrun's variables set, the default gloo
process group initialised), so ``fabric()`` builds the Fabric the way each rank process
Lightning launches for itself builds it (fabric/strategies/launchers/subprocess_script.py:
115-121 sets MASTER_ADDR/PORT, NODE_RANK, LOCAL_RANK, WORLD_SIZE and re-runs the script):
Fabric picks ``LightningEnvironment`` (fabric/connector.py:380-392: TorchElastic is detected
only by ``TORCHELASTIC_RUN_ID``, which the pool does not set (under a real torchrun it would
pick ``TorchElasticEnvironment``, which reads the same RANK and WORLD_SIZE); no SLURM, LSF or
mpi4py), which
with ``LOCAL_RANK`` set ``creates_processes_externally`` (plugins/environments/lightning.py:
48-56), so the strategy has no launcher (model_parallel.py:158-161) and ``fabric.launch()``
starts no processes, it only runs the strategy's ``setup_environment``: global rank
``NODE_RANK * devices + LOCAL_RANK`` (model_parallel.py:314-317), ``_init_dist_connection``
returns at once because ``torch.distributed.is_initialized()``
(fabric/utilities/distributed.py:275-277), and a new 2-D mesh ``(data_parallel,
tensor_parallel) = (world size, 1)`` (model_parallel.py:164-173, 505-521). ``fabric()``
checks that rank and world size are the process group's. The suite's own mesh
(``shard_fn``'s second argument) is not used: Lightning shards on its mesh's
``data_parallel`` dimension, a 1-D mesh over the same ranks.

A new Fabric is built for every model the suite builds (the ranks are reused across cases);
the last one is kept in ``_CURRENT`` for the save and load functions, as a trainer keeps its
``fabric``.

What the suite finds (test_lightning_trainer.py): on a distributed checkpoint ``fabric.load``
does not restore a scheduler passed in its state dict (``load_checkpoint`` loads it from the
dict Lightning hands back; ``load_checkpoint_trusting_fabric`` does not, and fails P6/P11); a
full checkpoint of an optimizer with no per-parameter state (plain SGD) cannot be loaded
(``IndexError``); the full load inherits torch's ``dsd-full-load-tuple-to-list``.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

_CURRENT: dict = {}
CKPT_NAME = "lightning.ckpt"
"""``fabric.save``'s path inside the suite's directory: a full checkpoint is a file (the
strategy refuses an existing directory, model_parallel.py:356-357); a distributed one is a
directory of that name."""


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 12))
        self.head = nn.Linear(12, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.body(x)))


def batch(step: int, n: int) -> torch.Tensor:
    return torch.randn(n, 6, dtype=torch.float64)


def make_optimizer(named_params):
    return torch.optim.AdamW([p for _, p in named_params], lr=5e-3, weight_decay=0.05)


def make_sgd(named_params):
    """Plain SGD (no momentum): no per-parameter state at all."""
    return torch.optim.SGD([p for _, p in named_params], lr=5e-2)


def make_scheduler(optimizer):
    """Linear warm-up for 2 steps, then 1/step decay (its state is needed to resume)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / 2 if s < 2 else 2.0 / (s + 1))


def parallelize(model: Net, device_mesh) -> Net:
    """The ``parallelize_fn`` Lightning calls in ``setup_module``: FSDP2 over the mesh's
    data-parallel dimension, each ``Linear`` of the body, then the root."""
    from torch.distributed.fsdp import fully_shard

    mesh = device_mesh["data_parallel"]
    for layer in model.body:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def fabric(distributed_checkpoint: bool = True):
    """A launched Fabric with ``ModelParallelStrategy`` (FSDP2) on this CPU rank of an
    existing gloo process group (module docstring)."""
    from lightning.fabric import Fabric
    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.fabric.strategies import ModelParallelStrategy

    ws = dist.get_world_size()
    strategy = ModelParallelStrategy(parallelize, data_parallel_size=ws, tensor_parallel_size=1,
                                     save_distributed_checkpoint=distributed_checkpoint)
    f = Fabric(accelerator="cpu", devices=ws, strategy=strategy)
    f.launch()
    env = f._connector.cluster_environment
    if (not isinstance(env, LightningEnvironment) or not env.creates_processes_externally
            or f.global_rank != dist.get_rank() or f.world_size != ws):
        raise RuntimeError(f"Fabric did not attach to this rank: {type(env).__name__}, "
                           f"rank {f.global_rank}/{f.world_size}, process group "
                           f"{dist.get_rank()}/{ws}")
    return f


def _shard(model: nn.Module, distributed_checkpoint: bool) -> nn.Module:
    f = fabric(distributed_checkpoint)
    wrapped = f.setup_module(model)
    _CURRENT.clear()
    _CURRENT.update(fabric=f, module=wrapped)
    return wrapped.module


def shard_distributed(model, mesh):
    """``shard_fn``: Lightning shards the model; ``fabric.save`` writes a distributed
    checkpoint (the strategy's default)."""
    return _shard(model, distributed_checkpoint=True)


def shard_full(model, mesh):
    """``shard_fn``: Lightning shards the model; ``fabric.save`` writes one full checkpoint
    file (``save_distributed_checkpoint=False``)."""
    return _shard(model, distributed_checkpoint=False)


def _objects(state) -> dict:
    """What the trainer passes to ``fabric.save`` / ``fabric.load``: its ``_FabricModule``
    and ``_FabricOptimizer`` (set up once per training state), the scheduler and the step."""
    f, wrapped = _CURRENT["fabric"], _CURRENT["module"]
    if wrapped.module is not state.model:
        raise RuntimeError("the training state's model is not the one the last Fabric set up")
    if _CURRENT.get("optimizer_of") is not state.optimizer:
        _CURRENT["optimizer"] = f.setup_optimizers(state.optimizer)
        _CURRENT["optimizer_of"] = state.optimizer
    objs = {"model": wrapped, "optimizer": _CURRENT["optimizer"], "step": state.step}
    if state.scheduler is not None:
        objs["scheduler"] = state.scheduler
    return objs


def save_checkpoint(state, directory: str) -> None:
    """``fabric.save`` of model, optimizer, scheduler (Lightning stores its
    ``state_dict()``) and step."""
    _CURRENT["fabric"].save(os.path.join(directory, CKPT_NAME), _objects(state))


def load_checkpoint(state, directory: str) -> None:
    """``fabric.load`` into the same objects; the step comes back in the dict. The scheduler
    is restored by ``fabric.load`` on a full checkpoint only: on a distributed one Lightning
    puts the saved ``state_dict()`` in the dict instead (model_parallel.py:455-460, see
    ``load_checkpoint_trusting_fabric``), so it is loaded here."""
    objs = _objects(state)
    _CURRENT["fabric"].load(os.path.join(directory, CKPT_NAME), objs)
    state.step = objs["step"]
    if isinstance(objs.get("scheduler"), dict):
        state.scheduler.load_state_dict(objs["scheduler"])


def load_checkpoint_trusting_fabric(state, directory: str) -> None:
    """The load as Fabric's guide writes it ("Fabric will replace the state of your objects
    in-place"): ``fabric.load`` into the objects and nothing else for the scheduler."""
    objs = _objects(state)
    _CURRENT["fabric"].load(os.path.join(directory, CKPT_NAME), objs)
    state.step = objs["step"]
