"""A user's training code on torchtitan 0.3.0's checkpointing, put under the suite by
``test_torchtitan_trainer.py``: the model is sharded torchtitan-style (``fully_shard`` per
transformer block, then the root), the optimizer and LR schedule are built by torchtitan's
``OptimizersContainer`` and ``LRSchedulersContainer`` (warm-up, then linear decay), and the
checkpoint is torchtitan's ``CheckpointManager``: ``save(step)`` / ``load()`` of the model,
optimizer, lr_scheduler and the train state (the step), as torchtitan's ``Trainer`` wires
it (torchtitan trainer.py:549-557 builds the containers, :590-602 the manager with
``states={"train_state": self}``, :1078-1083 is that train state).

How the pieces meet the suite, said plainly:

- The suite's optimizer factory gets ``(name, param)`` pairs, not model parts. torchtitan's
  ``OptimizersContainer`` reads a model part only through ``named_parameters()`` and
  ``parameters()`` (optimizer.py ``_build_param_groups``, ``_validate_params``), so
  ``make_optimizer`` hands it those pairs as one ``ModelPart``. The container is itself an
  ``Optimizer`` whose ``param_groups`` is one empty-hyperparameter group and whose
  ``state_dict()`` is torchtitan's flat FQN-keyed dict (optimizer.py ``_post_init``,
  ``state_dict``), so the suite trains and observes the ``torch.optim.AdamW`` the container
  built (``container.optimizers[0]``, the only one: every param group here is AdamW), and
  the container rides along on it (``container_of``) for the scheduler and the manager.
- The FSDP sharding is written out, not torchtitan's ``apply_fsdp_to_decoder``
  (distributed/fsdp.py): that one also calls ``disable_fsdp_gradient_division`` (torchtitan
  scales the loss by the global token count itself), so the suite's mean-over-rows loss
  would train differently from one process for a reason unrelated to checkpoints.
- Nothing of torchtitan is patched, and nothing needs a GPU: ``fully_shard`` on the pool's
  CPU mesh (gloo), ``implementation="for-loop"`` (torchtitan's default ``"fused"`` is
  CUDA-only), a synchronous ``CheckpointManager`` (``async_mode="disabled"``).
"""
from __future__ import annotations

from typing import Iterable, Iterator

import torch
from torch import nn
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.fsdp import fully_shard

DIM = 8
TOTAL_STEPS = 6
"""The schedule's length: the suite trains 2 steps, saves, and resumes for 2 more."""


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class TinyDecoder(nn.Module):
    """A decoder with torchtitan's module names: ``tok_embeddings``, ``layers`` (a
    ModuleDict of blocks), ``norm``, ``output``."""

    def __init__(self, dim: int = DIM, n_layers: int = 2):
        super().__init__()
        self.tok_embeddings = nn.Linear(5, dim)
        self.layers = nn.ModuleDict({str(i): Block(dim) for i in range(n_layers)})
        self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, 3)

    def forward(self, x):
        h = self.tok_embeddings(x)
        for block in self.layers.values():
            h = block(h)
        return self.output(self.norm(h))


class DecoderWithIdleHead(TinyDecoder):
    """``TinyDecoder`` with a trainable head its forward does not use (yet): an auxiliary or
    multi-token-prediction head switched on later in training. Its params get no gradient,
    so AdamW has no state for them at the save (the suite's P10 case)."""

    def __init__(self):
        super().__init__()
        self.aux_head = nn.Linear(DIM, 3)


def batch(step: int, n: int) -> torch.Tensor:
    return torch.randn(n, 5, dtype=torch.float64)


def shard(model: TinyDecoder, mesh) -> None:
    """``shard_fn``: torchtitan's order (distributed/fsdp.py ``apply_fsdp_to_decoder``): each
    transformer block, then the root. A 2-D mesh (the suite's "2x2") makes it HSDP."""
    for block in model.layers.values():
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


class ModelPart:
    """The ``(name, param)`` pairs the suite hands an optimizer factory, as the model part
    torchtitan's ``OptimizersContainer`` reads (only ``named_parameters`` / ``parameters``)."""

    def __init__(self, named_params: Iterable[tuple[str, nn.Parameter]]):
        self._named = list(named_params)

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        return iter(self._named)

    def parameters(self) -> Iterator[nn.Parameter]:
        return (p for _, p in self._named)


def optimizer_config():
    """AdamW in two param groups, torchtitan's way: norms and biases without weight decay
    (first match wins), everything else with it."""
    from torchtitan.components.optimizer import OptimizersContainer, ParamGroupConfig

    adamw = {"lr": 3e-3, "betas": (0.9, 0.95), "eps": 1e-8}
    return OptimizersContainer.Config(
        param_groups=[
            ParamGroupConfig(pattern=r"(norm|bias)", optimizer_name="AdamW",
                             optimizer_kwargs={**adamw, "weight_decay": 0.0}),
            ParamGroupConfig(pattern=r".*", optimizer_name="AdamW",
                             optimizer_kwargs={**adamw, "weight_decay": 0.1}),
        ],
        implementation="for-loop")


def make_optimizer(named_params) -> torch.optim.Optimizer:
    """``optimizer=``: torchtitan's ``OptimizersContainer`` over the params; the suite gets
    the ``AdamW`` it built (module docstring), carrying its container."""
    container = optimizer_config().build(model_parts=[ModelPart(named_params)])
    (inner,) = container.optimizers
    inner._torchtitan_container = container
    return inner


def container_of(optimizer: torch.optim.Optimizer):
    """The ``OptimizersContainer`` that built ``optimizer`` (``make_optimizer``)."""
    return optimizer._torchtitan_container


def make_scheduler(optimizer: torch.optim.Optimizer):
    """``scheduler=``: torchtitan's ``LRSchedulersContainer`` (a ``LambdaLR`` per optimizer):
    linear warm-up for 2 steps, then linear decay to 0.1 of the LR over ``TOTAL_STEPS``. Its
    ``state_dict()`` is ``{"last_epoch": n}`` (lr_scheduler.py:226-231); what the suite
    compares of it."""
    from torchtitan.components.optimizer import LRSchedulersContainer

    config = LRSchedulersContainer.Config(warmup_steps=2, decay_type="linear",
                                          min_lr_factor=0.1)
    return config.build(optimizers=container_of(optimizer), training_steps=TOTAL_STEPS)


class TrainProgress(Stateful):
    """The ``train_state`` torchtitan checkpoints (its ``Trainer`` is that Stateful:
    trainer.py:1078-1083), here just the step of the suite's ``TrainState``."""

    def __init__(self, state):
        self.state = state

    def state_dict(self) -> dict:
        return {"step": self.state.step}

    def load_state_dict(self, sd: dict) -> None:
        self.state.step = sd["step"]


def checkpointer(state, directory: str):
    """A ``CheckpointManager`` over the training state, checkpoints under ``directory``
    (``step-<n>`` folders). ``interval=1``: every ``save(step)`` writes; ``keep_latest_k=0``:
    no purge thread."""
    from torchtitan.components.checkpoint import TRAIN_STATE, CheckpointManager

    config = CheckpointManager.Config(enable=True, folder=directory, interval=1,
                                      keep_latest_k=0)
    return config.build(dataloader=None, model_parts=[state.model],
                        optimizers=container_of(state.optimizer),
                        lr_schedulers=state.scheduler,
                        states={TRAIN_STATE: TrainProgress(state)}, sd_adapter=None)


def save_checkpoint(state, directory: str) -> None:
    """``save_fn``: ``CheckpointManager.save(step)``, as the trainer's loop calls it
    (trainer.py:1044) at a step that is not the last (a last-step save is model-only by
    default: ``last_save_model_only``)."""
    ckpt = checkpointer(state, directory)
    try:
        if not ckpt.save(state.step):
            raise RuntimeError(f"CheckpointManager.save({state.step}) wrote nothing")
    finally:
        ckpt.close()


def load_checkpoint(state, directory: str) -> None:
    """``load_fn``: ``CheckpointManager.load()``: the latest ``step-<n>`` under
    ``directory`` (trainer.py:1018). False means no checkpoint was found: raised."""
    ckpt = checkpointer(state, directory)
    try:
        if not ckpt.load():
            raise RuntimeError(f"CheckpointManager.load() found no checkpoint in {directory}")
    finally:
        ckpt.close()


def load_after_reading_state(state, directory: str) -> None:
    """``load_checkpoint`` after code that reads the fresh optimizer's per-param state
    (``optimizer.state[p]``, as logging or a state-init hook might): torch's ``state`` is a
    defaultdict, so the read inserts empty entries, torchtitan's ``init_optim_state`` then
    takes the optimizer as initialised (optimizer/utils.py:40, ``if optim.state: return``)
    and ``load()`` restores no per-param state while returning True. Not what a trainer
    should do: the test shows the suite catches it."""
    optim = state.optimizer
    for group in optim.param_groups:
        for p in group["params"]:
            optim.state[p].get("step")
    load_checkpoint(state, directory)
