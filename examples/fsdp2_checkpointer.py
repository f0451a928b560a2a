"""A user's FSDP2 checkpoint code in the shape many trainers write it (our own code, in the
patterns of the common FSDP2 examples): a small decoder computing in float32 whose forward
returns ``.float()``, sharded per layer with ``fully_shard``, and two ways to checkpoint
full (unsharded) model and optimizer state dicts with ``torch.save`` on rank 0:

- ``dsd_save`` / ``dsd_load``: torch's distributed state-dict API (``get_/set_*_state_dict``
  with ``full_state_dict=True``; the load reads on rank 0 and broadcasts).
- ``manual_save`` / ``manual_load``: hand-written ``full_tensor()`` / ``distribute_tensor``
  code. It has two classic bugs on purpose, for ``test_fsdp2_checkpointer.py`` to find: the
  save assumes every state-dict entry is a DTensor (a model with a plain buffer breaks it),
  and the model load uses ``load_state_dict(..., assign=True)``, which replaces the model's
  Parameter objects, so an optimizer built before the load no longer holds them.
"""
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

MODEL_FILE = "model.pt"
OPTIM_FILE = "optim.pt"


class Layer(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 3 * dim)
        self.down = nn.Linear(3 * dim, dim)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Decoder(nn.Module):
    """Embedding-free: ``x`` is already a batch of vectors. The output is cast to float32,
    as many models do before the loss."""

    def __init__(self, dim: int = 8, depth: int = 2):
        super().__init__()
        self.inp = nn.Linear(6, dim)
        self.layers = nn.ModuleList(Layer(dim) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, 4)

    def forward(self, x):
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return self.out(self.norm(h)).float()


def data(step: int, n: int) -> torch.Tensor:
    return torch.randn(n, 6)


def make_optimizer(named_params):
    return torch.optim.AdamW([p for _, p in named_params], lr=2e-3, betas=(0.85, 0.95),
                             weight_decay=0.05)


def shard(model: Decoder, mesh) -> None:
    """Each layer, then the root."""
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def shard_bf16(model: Decoder, mesh) -> None:
    """The same, computing in bfloat16 (parameters gathered in bf16, gradients reduced in
    float32), as a ``--mixed-precision`` flag of a trainer does."""
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)


FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
FULL_LOAD = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)


def dsd_save(model, optimizer, directory: str) -> None:
    model_sd = get_model_state_dict(model, options=FULL)
    optim_sd = get_optimizer_state_dict(model, optimizer, options=FULL)
    if dist.get_rank() == 0:
        torch.save(model_sd, f"{directory}/{MODEL_FILE}")
        torch.save(optim_sd, f"{directory}/{OPTIM_FILE}")


def dsd_load(model, optimizer, directory: str) -> None:
    model_sd, optim_sd = {}, {}
    if dist.get_rank() == 0:
        model_sd = torch.load(f"{directory}/{MODEL_FILE}", weights_only=True)
        optim_sd = torch.load(f"{directory}/{OPTIM_FILE}", weights_only=False)
    set_model_state_dict(model, model_sd, options=FULL_LOAD)
    set_optimizer_state_dict(model, optimizer, optim_sd, options=FULL_LOAD)


def _names(model, optimizer) -> list[str]:
    """The FQN of each of the optimizer's params, in the optimizer's order."""
    fqn = {id(p): n for n, p in model.named_parameters()}
    return [fqn[id(p)] for g in optimizer.param_groups for p in g["params"]]


def manual_save(model, optimizer, directory: str) -> None:
    """Every rank gathers every entry with ``full_tensor()``; rank 0 writes."""
    model_sd = {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}  # bug 1
    osd = optimizer.state_dict()
    names = _names(model, optimizer)
    state = {names[i]: {k: v.full_tensor().cpu() if isinstance(v, DTensor) else v
                        for k, v in s.items()} for i, s in osd["state"].items()}
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in osd["param_groups"]]
    if dist.get_rank() == 0:
        torch.save(model_sd, f"{directory}/{MODEL_FILE}")
        torch.save({"state": state, "param_groups": groups}, f"{directory}/{OPTIM_FILE}")
    # the checkpoint exists once rank 0 has written it: without this barrier another rank
    # returns first and may read a file still being written (P7 caught it, now that the
    # suite no longer loads the weights for a model load function, which synchronised them)
    dist.barrier()


def manual_load_model(model, directory: str) -> None:
    """Every rank reads the full model dict and cuts its own shard with
    ``distribute_tensor``; ``assign=True`` puts new Parameter objects into the model."""
    full = torch.load(f"{directory}/{MODEL_FILE}", weights_only=True)
    sharded = {k: nn.Parameter(distribute_tensor(full[k].to(v.dtype), v.device_mesh,
                                                 v.placements))
               for k, v in model.state_dict().items()}
    model.load_state_dict(sharded, assign=True)


def manual_load_optimizer(model, optimizer, directory: str, names=None) -> None:
    """The optimizer's part: each saved state cut to the rank's shard of its param
    (``names``: the FQN of each of the optimizer's params, in its order)."""
    names = names or _names(model, optimizer)
    saved = torch.load(f"{directory}/{OPTIM_FILE}", weights_only=False)
    params = dict(model.named_parameters())
    state = {}
    for i, name in enumerate(names):
        if name not in saved["state"]:
            continue
        like = params[name]
        state[i] = {k: distribute_tensor(v.to(like.dtype), like.device_mesh, like.placements)
                    if k != "step" else v for k, v in saved["state"][name].items()}
    ids = {n: i for i, n in enumerate(names)}
    groups = [{**g, "params": [ids[n] for n in g["params"]]} for g in saved["param_groups"]]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def manual_load(model, optimizer, directory: str) -> None:
    """Both parts, with the optimizer built before the load (bug 2: after
    ``manual_load_model`` it holds the old Parameter objects). Passing
    ``load_fn=(manual_load_model, manual_load_optimizer)`` instead builds the optimizer
    after the model's load, as a trainer that loads the model first does."""
    names = _names(model, optimizer)
    manual_load_model(model, directory)
    manual_load_optimizer(model, optimizer, directory, names)
