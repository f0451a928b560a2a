"""A user's training code on Hugging Face accelerate with FSDP2 and FSDP1 (``fsdp_version`` 2
and 1), put under the suite by ``test_accelerate_trainer.py``. Checkpoints go through
accelerate's ``save_fsdp_optimizer`` / ``load_fsdp_optimizer`` (FULL and SHARDED state
dicts) or ``Accelerator.save_state`` / ``load_state`` (the whole training state).

- FSDP2: the model is sharded by accelerate's own ``fsdp2_prepare_model`` (what
  ``Accelerator.prepare`` runs on a model): ``shard_full`` / ``shard_sharded``.
- FSDP2, the trainer's own construction (``setup_fn=setup_full`` / ``setup_sharded``): the
  suite builds and shards, then ``accelerator.prepare(model, optimizer, scheduler)`` and
  ``register_for_checkpointing`` run as a trainer writes them, and ``save_prepared`` /
  ``load_prepared`` are ``Accelerator.save_state`` / ``load_state``. ``split_batches=True``:
  the suite splits one global batch between the ranks, and accelerate's prepared scheduler
  steps once per process per optimizer step without it (accelerate scheduler.py:69-82).
- FSDP1: the suite wraps the model in FSDP1 by the test's plan (its ``shard_fn`` is
  FSDP2-only), which is accelerate's "manual wrapping": ``prepare`` keeps a model that is
  already an FSDP module (accelerate 1.15.0 accelerator.py:1923-1931). The ``*_v1``
  functions build the FSDP1 Accelerator whose plugin they read, with accelerate's default
  configs (offload_to_cpu=True; rank0_only=True for FULL: utils/dataclasses.py:2059-2067).

CPU set-up, said plainly: accelerate enters its FSDP mode only for GPU-like devices
(``AcceleratorState`` takes the FSDP branch for ``MULTI_GPU`` and the like, accelerate
1.15.0 state.py:986-1013); with ``cpu=True`` it picks ``MULTI_CPU`` and ``prepare`` wraps the
model in DDP, without a warning. ``accelerator()`` below builds ``PartialState(cpu=True)``
(gloo, the pool's process group) and then records the run as ``MULTI_GPU``, so
``Accelerator`` takes its FSDP branch; everything after that is accelerate's own code.
Several Accelerators per process need ``AcceleratorState._reset_state(True)`` first (the
rank processes are reused), as accelerate's own test base class does. (When accelerate
wraps an FSDP1 model itself on CPU it also needs ``ACCELERATE_TORCH_DEVICE=cpu``: its
device ``cpu:0`` is refused by FSDP1 as "Inconsistent compute device and `device_id`",
torch _init_utils.py:1102; here the suite wraps, so it is not set.)
"""
import torch
from torch import nn

_CURRENT: dict = {}


def accelerator(state_dict_type: str, fsdp_version: int = 2, split_batches: bool = False):
    """A fresh FSDP ``Accelerator`` (``fsdp_version`` 1 or 2) on this CPU rank (module
    docstring); the training state prepared into the previous one is forgotten.
    ``split_batches``: accelerate's ``DataLoaderConfiguration(split_batches=True)``: the
    global batch is split between the ranks (the suite's data), so a prepared scheduler
    steps once per optimizer step (with False it steps once per process)."""
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.state import AcceleratorState, GradientState, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState(cpu=True)
    PartialState._shared_state["distributed_type"] = DistributedType.MULTI_GPU
    plugin = FullyShardedDataParallelPlugin(fsdp_version=fsdp_version,
                                            state_dict_type=state_dict_type)
    acc = Accelerator(cpu=True, fsdp_plugin=plugin, dataloader_config=DataLoaderConfiguration(
        split_batches=split_batches))
    if acc.distributed_type != DistributedType.FSDP or acc.is_fsdp2 != (fsdp_version == 2):
        raise RuntimeError(f"accelerate did not enter FSDP{fsdp_version}: "
                           f"{acc.distributed_type}, is_fsdp2={acc.is_fsdp2}")
    _CURRENT["acc"] = acc
    _CURRENT.pop("prepared", None)
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


def _setup(state, state_dict_type: str, split_batches: bool = True) -> None:
    """A trainer's own construction: ``model, optimizer, scheduler =
    accelerator.prepare(model, optimizer, scheduler)`` after building them (the suite has
    sharded the model on the case's mesh: ``prepare`` keeps an FSDP2 module), and the step
    registered for checkpointing."""
    acc = accelerator(state_dict_type, split_batches=split_batches)
    state.model, state.optimizer, state.scheduler = acc.prepare(state.model, state.optimizer,
                                                                state.scheduler)
    acc.register_for_checkpointing(Step(state))


def setup_full(state) -> None:
    """``setup_fn``: ``Accelerator.prepare`` with FULL state dicts."""
    _setup(state, "FULL_STATE_DICT")


def setup_sharded(state) -> None:
    """``setup_fn``: ``Accelerator.prepare`` with SHARDED state dicts (DCP)."""
    _setup(state, "SHARDED_STATE_DICT")


def save_prepared(state, directory: str) -> None:
    """``Accelerator.save_state`` of the accelerator ``setup_fn`` prepared the state into."""
    _CURRENT["acc"].save_state(directory)


def load_prepared(state, directory: str) -> None:
    """``Accelerator.load_state`` into the state ``setup_fn`` prepared."""
    _CURRENT["acc"].load_state(directory)


def load_prepared_lr_off(state, directory: str) -> None:
    """``load_prepared`` with a planted bug: every group's loaded lr 1% off (a test's
    second bug behind a known limitation)."""
    load_prepared(state, directory)
    for group in state.optimizer.param_groups:
        group["lr"] *= 1.01


def save_state(state, directory: str) -> None:
    _prepared(state).save_state(directory)


def load_state(state, directory: str) -> None:
    _prepared(state).load_state(directory)


# FSDP1: the suite has wrapped the model (module docstring); each function builds the
# FSDP1 Accelerator whose plugin accelerate's save/load read.

def save_optimizer_v1(state_dict_type: str, model, optimizer, directory: str) -> None:
    """``save_fsdp_optimizer`` under a fresh FSDP1 Accelerator (bind the state dict type
    with ``functools.partial``)."""
    accelerator(state_dict_type, fsdp_version=1)
    save_optimizer(model, optimizer, directory)


def load_optimizer_v1(state_dict_type: str, model, optimizer, directory: str) -> None:
    """``load_fsdp_optimizer`` under a fresh FSDP1 Accelerator."""
    accelerator(state_dict_type, fsdp_version=1)
    load_optimizer(model, optimizer, directory)


def save_state_v1(state_dict_type: str, state, directory: str) -> None:
    """``Accelerator.save_state`` of the training state prepared into a fresh FSDP1
    Accelerator."""
    accelerator(state_dict_type, fsdp_version=1)
    save_state(state, directory)


def load_state_v1(state_dict_type: str, state, directory: str) -> None:
    """``Accelerator.load_state`` into the training state prepared into a fresh FSDP1
    Accelerator."""
    accelerator(state_dict_type, fsdp_version=1)
    load_state(state, directory)


def prime(optimizer) -> None:
    """Give every param its optimizer state without moving it: one step on zero gradients
    at lr 0 (AdamW then changes no param, bit for bit); the load overwrites the state. This
    is what torch's ``get_optimizer_state_dict`` does first (``_init_optim_state``,
    torch/distributed/checkpoint/state_dict.py:629-660), so accelerate's FSDP2 SHARDED load
    (fsdp_utils.py:416) has a full target; its FSDP1 branch (:418, ``FSDP.optim_state_dict``)
    does not."""
    lrs = [g["lr"] for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        g["lr"] = 0.0
        for p in g["params"]:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    for g, lr in zip(optimizer.param_groups, lrs):
        g["lr"] = lr


def load_optimizer_v1_primed(state_dict_type: str, model, optimizer, directory: str) -> None:
    """``load_optimizer_v1`` into an optimizer that already has state (``prime``)."""
    prime(optimizer)
    load_optimizer_v1(state_dict_type, model, optimizer, directory)
