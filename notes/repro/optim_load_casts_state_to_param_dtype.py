"""torch 2.13: Optimizer.load_state_dict casts every tensor state but 'step' to the dtype of
its param when the param is floating point: a float32 momentum buffer and an int64 counter of
a bfloat16 param both come back bfloat16 (the float32 values rounded). Through DCP
(FSDP2, dcp.save / dcp.load of get_optimizer_state_dict, then set_optimizer_state_dict) the
template get_optimizer_state_dict makes for the fresh optimizer is float32 and dcp.load keeps
float32: the one cast is the Optimizer.load_state_dict call at the end, the same as on the
full-dict path. Overriding the staticmethod that casts changes nothing; an overridden
load_state_dict, or a load_state_dict post-hook, that puts the given tensors back after the
cast keeps them float32 and bitwise equal to the saved ones, on the DCP and the full-dict
path alike.

Run: python notes/repro/optim_load_casts_state_to_param_dtype.py
     (part 1: one process, no process group; part 2: 2 processes, gloo, CPU, FSDP2)

Part 1 (nn.Linear in bfloat16, an optimizer keeping a float32 momentum buffer, a float32
'step' and an int64 'count' per param): the plain load; a subclass overriding the staticmethod
_process_value_according_to_param_policy; a subclass whose load_state_dict calls super() and
then puts the given tensors back; a pre-hook (register_load_state_dict_pre_hook) that keeps
the given dict and a post-hook (register_load_state_dict_post_hook) that puts its tensors
back. Part 2 (FSDP2, 2 ranks, the same optimizer): the dtype of momentum_buffer in the DCP
template before and after dcp.load and in the optimizer after set_optimizer_state_dict; then
the full-dict path (broadcast_from_rank0); each with the plain optimizer and the overriding
subclass.

Output seen on torch 2.13.0+cpu (PYTHONWARNINGS=ignore; the ranks' lines interleave):
  part 1 (one process)
  saved: {'momentum_buffer': 'float32', 'step': 'float32', 'count': 'int64'}
  Optimizer.load_state_dict: {'momentum_buffer': 'bfloat16', 'step': 'float32', 'count': 'bfloat16'}; momentum bitwise equal to saved: False
  staticmethod overridden: {'momentum_buffer': 'bfloat16', 'step': 'float32', 'count': 'bfloat16'}; momentum bitwise equal to saved: False
  load_state_dict overridden: {'momentum_buffer': 'float32', 'step': 'float32', 'count': 'int64'}; momentum bitwise equal to saved: True
  pre+post hooks: {'momentum_buffer': 'float32', 'step': 'float32', 'count': 'int64'}; momentum bitwise equal to saved: True
  part 2 (FSDP2, 2 ranks, dcp.save / dcp.load)
  rank 1 dcp FP32StateSGD (saved float32): template torch.float32, after dcp.load torch.float32, loaded torch.bfloat16; bitwise equal to saved: False
  rank 0 dcp FP32StateSGD (saved float32): template torch.float32, after dcp.load torch.float32, loaded torch.bfloat16; bitwise equal to saved: False
  rank 1 dcp RestoringLoad (saved float32): template torch.float32, after dcp.load torch.float32, loaded torch.float32; bitwise equal to saved: True
  rank 0 dcp RestoringLoad (saved float32): template torch.float32, after dcp.load torch.float32, loaded torch.float32; bitwise equal to saved: True
  rank 1 full broadcast_from_rank0 FP32StateSGD (saved float32): loaded torch.bfloat16; bitwise equal to saved: False
  rank 0 full broadcast_from_rank0 FP32StateSGD (saved float32): loaded torch.bfloat16; bitwise equal to saved: False
  rank 0 full broadcast_from_rank0 RestoringLoad (saved float32): loaded torch.float32; bitwise equal to saved: True
  rank 1 full broadcast_from_rank0 RestoringLoad (saved float32): loaded torch.float32; bitwise equal to saved: True

Mechanism (2.13): torch/optim/optimizer.py:800-801, in
_process_value_according_to_param_policy (:774), casts every tensor value whose key is not
'step' with value.to(dtype=param.dtype, device=param.device) when param.is_floating_point()
('step' is kept unless the group is fused or capturable, :794-798); _cast (:964) calls it as
Optimizer._process_value_according_to_param_policy (:967), so a subclass's override of it is
never called. The source comment (:781-782): "Floating-point types are a bit special here.
They are the only ones that are assumed to always match the type of params."
Optimizer.load_state_dict runs the post-hooks after setting the state (:1018-1020).
"""
import copy
import os

import torch
from torch import nn


class FP32StateSGD(torch.optim.Optimizer):
    """SGD with momentum whose state stays float32 whatever the param's dtype, with a float32
    'step' and an int64 'count' (as mixed-precision optimizers keep their state)."""

    def __init__(self, params, lr=0.05, momentum=0.9):
        super().__init__(params, {"lr": lr, "momentum": momentum})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.to(torch.float32)
                st = self.state[p]
                if "momentum_buffer" not in st:
                    st["momentum_buffer"] = grad.clone()
                    st["step"] = torch.tensor(0.0)
                    st["count"] = torch.zeros((), dtype=torch.int64)
                else:
                    st["momentum_buffer"].mul_(group["momentum"]).add_(grad)
                st["step"] += 1
                st["count"] += 1
                p.add_(st["momentum_buffer"].to(p.dtype), alpha=-group["lr"])


class NoCastPolicy(FP32StateSGD):
    @staticmethod
    def _process_value_according_to_param_policy(param, value, param_id, param_groups,
                                                 key=None):
        return value  # never called: Optimizer's own is


class RestoringLoad(FP32StateSGD):
    """load_state_dict, then put back the tensors it was given (in params order)."""

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for i, p in zip(saved_ids, params):
            for k, v in state_dict["state"].get(i, {}).items():
                if isinstance(v, torch.Tensor):
                    self.state[p][k] = v.detach().clone().to(self.state[p][k].device)


def restoring_hooks(optim):
    kept = {}

    def pre(opt, sd):
        kept["sd"] = sd

    def post(opt):
        sd = kept.pop("sd")
        saved_ids = [i for g in sd["param_groups"] for i in g["params"]]
        params = [p for g in opt.param_groups for p in g["params"]]
        for i, p in zip(saved_ids, params):
            for k, v in sd["state"].get(i, {}).items():
                if isinstance(v, torch.Tensor):
                    opt.state[p][k] = v.detach().clone()

    optim.register_load_state_dict_pre_hook(pre)
    optim.register_load_state_dict_post_hook(post)


def dtypes(st):
    return {k: str(v.dtype).replace("torch.", "") for k, v in st.items()}


def part1():
    def trained(cls=FP32StateSGD):
        torch.manual_seed(0)
        model = nn.Linear(4, 3).to(torch.bfloat16)
        optim = cls(model.parameters())
        for _ in range(2):
            model(torch.randn(5, 4, dtype=torch.bfloat16)).float().sum().backward()
            optim.step()
        return model, optim

    _, optim = trained()
    saved = copy.deepcopy(optim.state_dict())
    print(f"saved: {dtypes(saved['state'][0])}")
    for what, cls, hooks in (("Optimizer.load_state_dict", FP32StateSGD, False),
                             ("staticmethod overridden", NoCastPolicy, False),
                             ("load_state_dict overridden", RestoringLoad, False),
                             ("pre+post hooks", FP32StateSGD, True)):
        _, fresh = trained(cls)
        if hooks:
            restoring_hooks(fresh)
        fresh.load_state_dict(copy.deepcopy(saved))
        st = fresh.state[fresh.param_groups[0]["params"][0]]
        same = torch.equal(st["momentum_buffer"], saved["state"][0]["momentum_buffer"])
        print(f"{what}: {dtypes(st)}; momentum bitwise equal to saved: {same}")


def part2(rank, world_size, port, tmp):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_optimizer_state_dict,
                                                         set_optimizer_state_dict)
    from torch.distributed.fsdp import fully_shard

    def build(cls=FP32StateSGD):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2)).to(torch.bfloat16)
        fully_shard(model)
        return model, cls(model.parameters())

    model, optim = build()
    for _ in range(2):
        model(torch.randn(3, 4, dtype=torch.bfloat16)).float().sum().backward()
        optim.step()
    sd = get_optimizer_state_dict(model, optim)
    saved = sd["state"]["0.weight"]["momentum_buffer"].to_local().clone()
    dcp.save({"optim": sd}, checkpoint_id=tmp)
    for cls in (FP32StateSGD, RestoringLoad):
        model2, optim2 = build(cls)
        template = get_optimizer_state_dict(model2, optim2)
        before = template["state"]["0.weight"]["momentum_buffer"].dtype
        dcp.load({"optim": template}, checkpoint_id=tmp)
        after = template["state"]["0.weight"]["momentum_buffer"].dtype
        set_optimizer_state_dict(model2, optim2, template)
        mb = optim2.state[optim2.param_groups[0]["params"][0]]["momentum_buffer"]
        print(f"rank {rank} dcp {cls.__name__} (saved float32): template {before}, after "
              f"dcp.load {after}, loaded {mb.dtype}; bitwise equal to saved: "
              f"{torch.equal(mb.to_local(), saved)}", flush=True)
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    full = get_optimizer_state_dict(model, optim, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))
    for cls in (FP32StateSGD, RestoringLoad):
        model2, optim2 = build(cls)
        set_optimizer_state_dict(model2, optim2, full if rank == 0 else {},
                                 options=StateDictOptions(full_state_dict=True,
                                                          broadcast_from_rank0=True))
        mb = optim2.state[optim2.param_groups[0]["params"][0]]["momentum_buffer"]
        print(f"rank {rank} full broadcast_from_rank0 {cls.__name__} (saved float32): loaded "
              f"{mb.dtype}; bitwise equal to saved: {torch.equal(mb.to_local(), saved)}",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    import socket
    import tempfile

    import torch.multiprocessing as mp

    print(f"torch {torch.__version__}")
    print("part 1 (one process)")
    part1()
    print("part 2 (FSDP2, 2 ranks, dcp.save / dcp.load)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(part2, args=(2, port, tmp), nprocs=2)
