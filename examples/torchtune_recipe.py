"""A fine-tuning trainer in torchtune's order and style, our own code: the checkpoint helpers
of ``torchtune/training/_distributed.py`` (torchtune 0.6.1: ``gather_cpu_state_dict``,
``get_full_optimizer_state_dict``, ``load_from_full_model_state_dict``,
``load_from_full_optimizer_state_dict``), its cosine-with-warmup ``LambdaLR``
(``training/lr_schedulers.py``) and the order of its ``full_finetune_distributed`` recipe.
torchtune itself is not installed: 0.6.1 requires ``torchdata==0.11.0``, ``datasets``,
``huggingface_hub``, ``kagglehub``, ``tiktoken``, ``sentencepiece`` and more (its wheel's
metadata), a data stack this suite does not need.

The recipe's order, which the plugin is told with ``load_fn=(load_model, load_state)`` and
``scheduler_after_load=True``:

1. the model is built on the meta device, sharded (``shard_model``: each layer, then the
   root) and loaded from the full state dict rank 0 wrote (``load_model``): torch's
   ``set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)``, which loads
   with ``assign=True`` because the model's tensors are on meta (torch 2.13
   ``distributed/checkpoint/state_dict.py:600-602``);
2. the optimizer is built on the loaded model's parameters and loaded from the full
   optimizer state dict (``load_state``), with the step it was saved at;
3. the LR scheduler is built after that, from the step (``lr_scheduler(optimizer, step)``,
   ``last_epoch=step - 1``): it is never checkpointed, so its ``_step_count`` restarts,
   which ``LambdaLR`` never reads (the suite judges a scheduler by what it does).

The save (``save_checkpoint``) gathers the full model and optimizer state dicts on rank 0 and
writes them with ``torch.save``, with the step, as the recipe's checkpointer does.

``Decoder`` (untied, float32) passes under the plugin's defaults; ``TiedDecoder`` ties its
output projection to its embedding (as torchtune's Llama 3.2 and Qwen2 models do), and the
recipe's load then gives the two their own ``nn.Parameter``: test_torchtune_recipe.py shows
what the plugin reports of it.
"""
from __future__ import annotations

import math
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.optim.lr_scheduler import LambdaLR

VOCAB, DIM, SEQ = 16, 8, 6
MODEL_FILE = "model.pt"
RECIPE_STATE = "recipe_state.pt"


class Layer(nn.Module):
    def __init__(self, dim: int = DIM):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.w1 = nn.Linear(dim, 2 * dim, bias=False)
        self.w2 = nn.Linear(2 * dim, dim, bias=False)

    def forward(self, h):
        return h + self.w2(torch.nn.functional.silu(self.w1(self.norm(h))))


class Decoder(nn.Module):
    """A token decoder: embedding, layers, norm, output projection; logits in float32."""

    def __init__(self, depth: int = 2):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Layer() for _ in range(depth))
        self.norm = nn.LayerNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h)).float()


class TiedDecoder(Decoder):
    """The same with the output projection tied to the embedding."""

    def __init__(self, depth: int = 2):
        super().__init__(depth)
        self.output.weight = self.tok_embeddings.weight


def data(step: int, n: int) -> torch.Tensor:
    """Token ids (stored as floats: the suite casts a batch to the case's dtype; ids below
    17 are exact in bfloat16)."""
    return torch.randint(0, VOCAB, (n, SEQ)).float()


def loss(model, x):
    """Next-token cross-entropy, a mean over the batch's rows (every row has SEQ-1 targets)."""
    tokens = x.long()
    logits = model(tokens[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def make_optimizer(named_params):
    """The recipe's AdamW (fused off on CPU)."""
    return torch.optim.AdamW([p for _, p in named_params], lr=2e-3, weight_decay=0.01)


def get_cosine_schedule_with_warmup(optimizer, num_warmup_steps: int,
                                    num_training_steps: int, num_cycles: float = 0.5,
                                    last_epoch: int = -1) -> LambdaLR:
    """torchtune's (training/lr_schedulers.py): linear warmup, then half a cosine."""

    def lr_lambda(current_step: int) -> float:
        if current_step < num_warmup_steps:
            return current_step / max(1, num_warmup_steps)
        progress = (current_step - num_warmup_steps) / max(
            1, num_training_steps - num_warmup_steps)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress)))

    return LambdaLR(optimizer, lr_lambda, last_epoch)


def lr_scheduler(optimizer, step: int) -> LambdaLR:
    """The recipe's ``_setup_lr_scheduler``: built from the step the run is at."""
    return get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=3,
                                           num_training_steps=20, last_epoch=step - 1)


def shard_model(model: nn.Module, mesh, mp_policy=None) -> None:
    """torchtune's ``shard_model``: each layer, then the root."""
    kw = {} if mp_policy is None else {"mp_policy": mp_policy}
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)


def shard_model_bf16(model: nn.Module, mesh) -> None:
    """The same with a bf16 ``MixedPrecisionPolicy`` (params gathered in bfloat16,
    gradients reduced in float32)."""
    shard_model(model, mesh, MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                  reduce_dtype=torch.float32))


def _rank0() -> bool:
    return dist.get_rank() == 0


def gather_cpu_state_dict(model) -> dict:
    """torchtune's: every DTensor of ``model.state_dict()`` gathered (``full_tensor``), kept
    on rank 0, on CPU."""
    out = {}
    for name, param in model.state_dict().items():
        if hasattr(param, "_local_tensor"):
            param = param.full_tensor()
        if _rank0():
            out[name] = param.cpu()
        dist.barrier()
    return out


def get_full_optimizer_state_dict(model, optimizer) -> dict:
    """torchtune's: DSD's full optimizer state dict, on rank 0 (``{}`` elsewhere)."""
    full = get_optimizer_state_dict(model=model, optimizers=optimizer, options=StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=True, cpu_offload=True))
    return full if _rank0() else {}


def save_checkpoint(state, directory: str) -> None:
    """The recipe's ``save_checkpoint``: the full model state dict and the recipe state
    (optimizer, step) written by rank 0."""
    model_sd = gather_cpu_state_dict(state.model)
    optim_sd = get_full_optimizer_state_dict(state.model, state.optimizer)
    if _rank0():
        torch.save(model_sd, os.path.join(directory, MODEL_FILE))
        torch.save({"optimizer": optim_sd, "steps_run": state.step},
                   os.path.join(directory, RECIPE_STATE))
    dist.barrier()


def _meta_twin(model: nn.Module) -> nn.Module:
    """The recipe's ``_setup_model`` up to the load: the same model class built on the meta
    device and sharded on the same mesh with the same policy."""
    param = next(model.parameters())
    mp = getattr(getattr(model, "_get_fsdp_state", lambda: None)(), "_mp_policy", None)
    default = torch.get_default_dtype()
    torch.set_default_dtype(param.dtype)  # the recipe's training.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            twin = type(model)()
    finally:
        torch.set_default_dtype(default)
    shard_model(twin, param.device_mesh, mp)
    return twin


def load_model(model: nn.Module, directory: str) -> nn.Module:
    """The recipe's model load (``load_from_full_model_state_dict``): a meta-initialised,
    sharded model filled from the full state dict with ``set_model_state_dict``
    (``full_state_dict``, ``broadcast_from_rank0``, strict), which assigns the loaded tensors
    as new parameters because the model is on meta."""
    twin = _meta_twin(model)
    full = torch.load(os.path.join(directory, MODEL_FILE), weights_only=True)  # every rank
    set_model_state_dict(twin, full, options=StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=True, strict=True))
    for buf_name, buf in twin.named_buffers():  # none in these models; the recipe inits them
        raise RuntimeError(f"buffer {buf_name} left on meta")
    return twin


def load_state(state, directory: str, strict: bool = True) -> None:
    """The recipe's optimizer load (``load_from_full_optimizer_state_dict``) and step; the
    scheduler is built after this, from the step (``scheduler_after_load=True``)."""
    recipe = torch.load(os.path.join(directory, RECIPE_STATE), weights_only=True)
    # every rank passes the dict it read, as the recipe does (its checkpointer loads on every
    # rank): with broadcast_from_rank0, a param-group key the fresh optimizer lacks (the
    # scheduler's initial_lr, which LambdaLR(last_epoch=step - 1) below requires) survives
    # only on ranks whose own dict holds it (the suite's known limitation
    # dsd-load-drops-group-keys-the-optimizer-lacks: ranks passing {} lose it)
    set_optimizer_state_dict(state.model, state.optimizer, recipe["optimizer"],
                             options=StateDictOptions(full_state_dict=True,
                                                      broadcast_from_rank0=True, strict=strict))
    state.step = recipe["steps_run"]


RECIPE = dict(optimizer=make_optimizer, loss=loss, scheduler=lr_scheduler,
              scheduler_after_load=True, save_fn=save_checkpoint,
              load_fn=(load_model, load_state), fsdp_version=2)
"""What ``fsdp_roundtrip`` is told about the recipe (with ``shard_fn``)."""


def load_state_lenient(state, directory: str) -> None:
    """``load_state`` with ``strict=False``, as torch's error for the tied model advises
    ("To load anyway, use StateDictOptions(strict=False)")."""
    load_state(state, directory, strict=False)


def load_model_retied(model: nn.Module, directory: str) -> nn.Module:
    """``load_model``, then the output projection tied to the embedding again (the fix the
    plugin names for ``TiedDecoder``: the assigning load gave each key its own Parameter)."""
    loaded = load_model(model, directory)
    loaded.output.weight = loaded.tok_embeddings.weight
    return loaded


class DecoderWithUnused(Decoder):
    """``Decoder`` with a projection its forward never uses (a head trained in another
    stage): it never gets a gradient, so the optimizer never makes state for it."""

    def __init__(self, depth: int = 2):
        super().__init__(depth)
        self.unused = nn.Linear(DIM, DIM, bias=False)
