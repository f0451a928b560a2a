"""Bugs a user's FSDP2 app-state checkpoint code can have, each one planted into the
example trainer's (examples/fsdp2_trainer.py) save/load: the plugin must fail each, naming
the property and the param or key."""
import torch
from torch import nn
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from examples.fsdp2_trainer import AppState


class DropsLr(AppState):
    """Saves the param groups without ``lr`` and loads them back filled from the fresh
    optimizer (what a hand-rolled 'hyperparameters come from the config' loader does)."""

    def state_dict(self):
        sd = super().state_dict()
        for g in sd["optim"]["param_groups"]:
            g.pop("lr", None)
        return sd

    def load_state_dict(self, sd):
        for g, fresh in zip(sd["optim"]["param_groups"], self.state.optimizer.param_groups):
            g.setdefault("lr", fresh["lr"])
        super().load_state_dict(sd)


class RoundsToBf16(AppState):
    """Saves the optimizer state rounded to bfloat16 (kept in its dtype), a 'save space'
    cast."""

    def state_dict(self):
        sd = super().state_dict()
        for st in sd["optim"]["state"].values():
            for k, v in list(st.items()):
                if k != "step" and torch.is_tensor(v) and v.is_floating_point():
                    st[k] = v.to(torch.bfloat16).to(v.dtype)
        return sd


class SkipsScheduler(AppState):
    """Forgets the LR scheduler: it restarts from its first step after a resume."""

    def state_dict(self):
        sd = super().state_dict()
        del sd["scheduler"]
        return sd

    def load_state_dict(self, sd):
        sd = {**sd, "scheduler": self.state.scheduler.state_dict()}
        super().load_state_dict(sd)


def save_drops_lr(state, directory):
    dcp.save({"app": DropsLr(state)}, checkpoint_id=directory)


def load_drops_lr(state, directory):
    dcp.load({"app": DropsLr(state)}, checkpoint_id=directory)


def save_rounds_bf16(state, directory):
    dcp.save({"app": RoundsToBf16(state)}, checkpoint_id=directory)


def save_skips_scheduler(state, directory):
    dcp.save({"app": SkipsScheduler(state)}, checkpoint_id=directory)


def load_skips_scheduler(state, directory):
    dcp.load({"app": SkipsScheduler(state)}, checkpoint_id=directory)


def save_async_unwaited(state, directory):
    """``dcp.async_save`` without waiting for its Future."""
    dcp.async_save({"app": AppState(state)}, checkpoint_id=directory)


def save_async_waited(state, directory):
    """``dcp.async_save``, then the Future's result: a correct asynchronous save."""
    dcp.async_save({"app": AppState(state)}, checkpoint_id=directory).result()


def _full_file(directory):
    import os
    return os.path.join(directory, "optim.pt")


def save_full_optim(model, optimizer, directory):
    """The optimizer's full dict through DSD, written by rank 0 (an FSDP2 trainer's 'full
    checkpoint' branch): it inherits the known torch limitation that full-dict loads turn
    tuple hyperparameters into lists."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         get_optimizer_state_dict)

    sd = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        torch.save(sd, _full_file(directory))
    dist.barrier()


def load_full_optim(model, optimizer, directory):
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         set_optimizer_state_dict)

    sd = torch.load(_full_file(directory), weights_only=True)
    set_optimizer_state_dict(model, optimizer, sd,
                             options=StateDictOptions(full_state_dict=True))


def load_full_optim_nudged(model, optimizer, directory):
    """The same load, and a second bug on top: one momentum element off by 1e-3."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         set_optimizer_state_dict)

    sd = torch.load(_full_file(directory), weights_only=True)
    st = sd["state"]["out.weight"]
    st["exp_avg"] = st["exp_avg"].clone()
    st["exp_avg"].view(-1)[0] += 1e-3
    set_optimizer_state_dict(model, optimizer, sd,
                             options=StateDictOptions(full_state_dict=True))


def load_raising_the_same_message(model, optimizer, directory):
    """Not torch: the user's own loader fails with the very message of a known torch
    limitation (dsd-stateless-full-load), raised from its own code."""
    raise AssertionError("Expected device to be set")


class SkipsStep(AppState):
    """Restores model, optimizer and scheduler but not the trainer's step counter."""

    def load_state_dict(self, sd):
        super().load_state_dict(sd)
        self.state.step = 0


def load_skips_step(state, directory):
    dcp.load({"app": SkipsStep(state)}, checkpoint_id=directory)


def load_full_optim_skipping(model, optimizer, directory):
    """A loader that keeps only the state whose key it finds under a new name (a refactor
    renamed ``out`` to ``head``; what does not match is skipped) and loads with
    ``strict=False``, so torch does not object: the head's params resume with no optimizer
    state."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         set_optimizer_state_dict)

    sd = torch.load(_full_file(directory), weights_only=True)
    renamed = {k.replace("out.", "head."): v for k, v in sd["state"].items()}
    sd["state"] = {k: v for k, v in renamed.items() if not k.startswith("head.")}
    set_optimizer_state_dict(model, optimizer, sd,
                             options=StateDictOptions(full_state_dict=True, strict=False))


class RebuildsScheduler(AppState):
    """torchtune's way (its full_finetune_distributed recipe): the checkpoint holds model,
    optimizer and step, not the LR scheduler; the load rebuilds the scheduler from the step
    (``last_epoch=step - 1 + shift``), so its ``_step_count`` restarts. ``shift`` -1 plants an
    lr off by one step."""

    shift = 0

    def state_dict(self):
        sd = super().state_dict()
        del sd["scheduler"]
        return sd

    def load_state_dict(self, sd):
        from examples.fsdp2_trainer import make_scheduler

        sd = {**sd, "scheduler": self.state.scheduler.state_dict()}  # loaded, then rebuilt
        super().load_state_dict(sd)
        fresh = make_scheduler(self.state.optimizer)
        self.state.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.state.optimizer, fresh.lr_lambdas[0], last_epoch=self.state.step - 1 + self.shift)


class RebuildsSchedulerOneShort(RebuildsScheduler):
    shift = -1


def save_rebuilds_scheduler(state, directory):
    dcp.save({"app": RebuildsScheduler(state)}, checkpoint_id=directory)


def load_rebuilds_scheduler(state, directory):
    dcp.load({"app": RebuildsScheduler(state)}, checkpoint_id=directory)


def load_rebuilds_scheduler_one_short(state, directory):
    dcp.load({"app": RebuildsSchedulerOneShort(state)}, checkpoint_id=directory)


class SkipsWeights(AppState):
    """Restores the optimizer, the scheduler and the step, never the model's weights (a
    resume that forgets the model part of its checkpoint). Its ``state_dict`` leaves the
    model out too: dcp.load fills the template's tensors in place, and the model's part of
    ``get_state_dict`` is the model's own parameters."""

    def state_dict(self):
        sd = super().state_dict()
        del sd["model"]
        return sd

    def load_state_dict(self, sd):
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.state.model, self.state.optimizer, sd["optim"])
        self.state.scheduler.load_state_dict(sd["scheduler"])
        self.state.step = sd["step"]


def load_skips_weights(state, directory):
    dcp.load({"app": SkipsWeights(state)}, checkpoint_id=directory)


class Scaled(nn.Module):
    """A small model with a persistent float buffer at its root (a scale kept as a buffer)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(5, 8)
        self.out = nn.Linear(8, 3)
        self.register_buffer("scale", torch.full((8,), 0.5, dtype=torch.float64))

    def forward(self, x):
        return self.out(torch.relu(self.inp(x)) * self.scale)


class BufferToParam(AppState):
    """Restores everything, then turns the persistent buffer into a trainable parameter and
    hands it to the optimizer (a 'make the scale learnable' loader): params +1, buffers -1."""

    def load_state_dict(self, sd):
        super().load_state_dict(sd)
        model = self.state.model
        scale = model._buffers.pop("scale")
        model.scale = nn.Parameter(scale.detach().clone())
        self.state.optimizer.param_groups[0]["params"].append(model.scale)


def load_buffer_to_param(state, directory):
    dcp.load({"app": BufferToParam(state)}, checkpoint_id=directory)


def _count_steps(optimizer) -> None:
    """A trainer's step counter that re-binds ``optimizer.step`` through its function
    (``__func__``): right on a plain optimizer; on one an LR scheduler already wraps (the
    wrapper is a plain function), it binds the wrapper to the optimizer, which the wrapper
    then passes on as the closure: ``TypeError: 'AdamW' object is not callable``."""
    import types

    fn = getattr(optimizer.step, "__func__", optimizer.step)

    def counted(self, *args, **kwargs):
        self.steps_counted = getattr(self, "steps_counted", 0) + 1
        return fn(self, *args, **kwargs)

    optimizer.step = types.MethodType(counted, optimizer)


class WithoutScheduler(AppState):
    """Model, optimizer and step; no LR scheduler (a trainer that rebuilds it)."""

    def state_dict(self):
        model_sd, optim_sd = get_state_dict(self.state.model, self.state.optimizer)
        return {"model": model_sd, "optim": optim_sd, "step": self.state.step}

    def load_state_dict(self, sd):
        set_state_dict(self.state.model, self.state.optimizer,
                       model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        self.state.step = sd["step"]


def load_rebuilds_scheduler_counting(state, directory):
    """Restores model, optimizer and step, counts the optimizer's steps (``_count_steps``),
    then builds its only scheduler from the step: a trainer that builds its scheduler after
    the load (``RebuildsScheduler``'s LambdaLR)."""
    from examples.fsdp2_trainer import make_scheduler

    dcp.load({"app": WithoutScheduler(state)}, checkpoint_id=directory)
    _count_steps(state.optimizer)
    fresh = make_scheduler(state.optimizer)
    state.scheduler = torch.optim.lr_scheduler.LambdaLR(
        state.optimizer, fresh.lr_lambdas[0], last_epoch=state.step - 1)


def shard_on_own_mesh(model, mesh):
    """A framework's sharding on a mesh of its own (accelerate builds a 1-D mesh where the
    case's side is HSDP with one replica): the same local pieces on another mesh shape."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if mesh.ndim == 2 and mesh.shape[0] == 1:
        mesh = init_device_mesh("cpu", (mesh.shape[1],))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def save_with_rng(state, directory):
    """The example trainer's save, and each rank's random-number states beside it (as
    accelerate's ``random_states_{rank}.pkl``)."""
    import os
    import random

    from examples.fsdp2_trainer import save_checkpoint

    save_checkpoint(state, directory)
    rank = torch.distributed.get_rank()
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate()},
               os.path.join(directory, f"random_states_{rank}.pt"))
    torch.distributed.barrier()


def load_with_rng(state, directory):
    """Its load: the checkpoint, then this rank's random-number states where the save had
    this rank."""
    import os
    import random

    from examples.fsdp2_trainer import load_checkpoint

    load_checkpoint(state, directory)
    path = os.path.join(directory, f"random_states_{torch.distributed.get_rank()}.pt")
    if os.path.exists(path):
        rng = torch.load(path, weights_only=False)
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])


def load_frozen_first(state, directory):
    """A staged trainer's load: it freezes the input layer for the next phase, then loads
    the checkpoint (DSD keeps saved state only for params that require grad)."""
    from examples.fsdp2_trainer import load_checkpoint

    state.model.inp.requires_grad_(False)
    load_checkpoint(state, directory)


class FrozenInput(nn.Module):
    """The example trainer's model with its input layer frozen from the start (a frozen
    embedding), under the user's own name: the known limitations see its trait."""

    def __init__(self):
        super().__init__()
        from examples.fsdp2_trainer import TinyTransformerish

        self.net = TinyTransformerish()
        self.net.inp.requires_grad_(False)
        self.blocks = self.net.blocks

    def forward(self, x):
        return self.net(x)
