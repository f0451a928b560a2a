"""A user's training code on Hugging Face accelerate with FSDP2 (``fsdp_version=2``), put
under the suite by ``test_accelerate_trainer.py``: the model is sharded by accelerate's own
``fsdp2_prepare_model`` (what ``Accelerator.prepare`` runs on a model), and checkpoints go
through accelerate's ``save_fsdp_optimizer`` / ``load_fsdp_optimizer`` (FULL and SHARDED
state dicts) or ``Accelerator.save_state`` / ``load_state`` (the whole training state).

CPU set-up, said plainly: accelerate enters its FSDP mode only for GPU-like devices
(``AcceleratorState`` takes the FSDP branch for ``MULTI_GPU`` and the like, accelerate
1.15.0 state.py:986-1013); with ``cpu=True`` it picks ``MULTI_CPU`` and ``prepare`` wraps the
model in DDP, without a warning. ``accelerator()`` below builds ``PartialState(cpu=True)``
(gloo, the pool's process group) and then records the run as ``MULTI_GPU``, so
``Accelerator`` takes its FSDP branch; everything after that is accelerate's own code.
Several Accelerators per process need ``AcceleratorState._reset_state(True)`` first (the
rank processes are reused), as accelerate's own test base class does.
"""
import torch
from torch import nn

_CURRENT: dict = {}


def accelerator(state_dict_type: str):
    """A fresh FSDP2 ``Accelerator`` on this CPU rank (module docstring)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState(cpu=True)
    PartialState._shared_state["distributed_type"] = DistributedType.MULTI_GPU
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type=state_dict_type)
    acc = Accelerator(cpu=True, fsdp_plugin=plugin)
    if acc.distributed_type != DistributedType.FSDP or not acc.is_fsdp2:
        raise RuntimeError(f"accelerate did not enter FSDP2: {acc.distributed_type}")
    _CURRENT["acc"] = acc
    return acc


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


def _shard(model, state_dict_type: str):
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model

    return fsdp2_prepare_model(accelerator(state_dict_type), model)


def shard_full(model, mesh):
    """``shard_fn``: accelerate shards the model (its own 1-D mesh over the ranks); FULL
    state dicts."""
    return _shard(model, "FULL_STATE_DICT")


def shard_sharded(model, mesh):
    """``shard_fn``, SHARDED state dicts (DCP)."""
    return _shard(model, "SHARDED_STATE_DICT")


def save_optimizer(model, optimizer, directory: str) -> None:
    from accelerate.utils import save_fsdp_optimizer

    acc = _CURRENT["acc"]
    save_fsdp_optimizer(acc.state.fsdp_plugin, acc, optimizer, model, directory)


def load_optimizer(model, optimizer, directory: str) -> None:
    from accelerate.utils import load_fsdp_optimizer

    acc = _CURRENT["acc"]
    load_fsdp_optimizer(acc.state.fsdp_plugin, acc, optimizer, model, directory)


class Step:
    """The step counter, checkpointed with the state (``register_for_checkpointing``)."""

    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return {"step": self.state.step}

    def load_state_dict(self, sd):
        self.state.step = sd["step"]


def _prepared(state):
    """The Accelerator of this rank with the training state prepared into it, as a trainer's
    ``accelerator.prepare(model, optimizer, scheduler)`` leaves it (the model is already
    sharded: ``prepare`` keeps it)."""
    acc = _CURRENT["acc"]
    if _CURRENT.get("prepared") is not state:
        acc._models.clear()
        acc._optimizers.clear()
        acc._schedulers.clear()
        acc._custom_objects.clear()
        acc.prepare(state.model, state.optimizer, state.scheduler)
        acc.register_for_checkpointing(Step(state))
        _CURRENT["prepared"] = state
    return acc


def save_state(state, directory: str) -> None:
    _prepared(state).save_state(directory)


def load_state(state, directory: str) -> None:
    _prepared(state).load_state(directory)
