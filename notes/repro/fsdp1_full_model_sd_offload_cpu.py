"""Reproducer (plain torch 2.13, CPU, gloo, 2 ranks): FSDP1's FULL_STATE_DICT *model*
state_dict with offload_to_cpu=True (accelerate's default, what Accelerator.save_state
calls for FSDP1 FULL) breaks on rank 0 on CPU. FlatParamHandle.to_cpu (_flat_param.py:1750)
moves the unsharded flat param to CPU -- the same storage on CPU -- and then frees the
unsharded storage (:1751), so the "CPU copy" has storage of size 0:
  use_orig_params=False: RuntimeError "setStorage: ... out of bounds for storage of size 0"
    (_flat_param.py:1901, unflattening the views in _unshard_param_utils.py:226);
  use_orig_params=True: rank 0 dies of SIGSEGV (in _full_post_state_dict_hook,
    _state_dict_utils.py).
offload_to_cpu=False, or any non-zero rank (rank0_only=True), is fine.
Run: python notes/repro/fsdp1_full_model_sd_offload_cpu.py [use_orig_params: 0|1] [offload: 0|1]"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def rank_main(rank: int, use_orig_params: bool, offload: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29541")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    torch.manual_seed(0)
    model = FSDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)),
                 use_orig_params=use_orig_params, device_id=torch.device("cpu"))
    cfg = FullStateDictConfig(offload_to_cpu=offload, rank0_only=True)
    try:
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, cfg):
            sd = model.state_dict()
        print(f"rank {rank}: ok, {len(sd)} tensors", flush=True)
    except RuntimeError as exc:
        print(f"rank {rank}: RuntimeError: {exc}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    uop = sys.argv[1] == "1" if len(sys.argv) > 1 else False
    off = sys.argv[2] == "1" if len(sys.argv) > 2 else True
    print(f"torch {torch.__version__}, use_orig_params={uop}, offload_to_cpu={off}", flush=True)
    try:
        mp.start_processes(rank_main, args=(uop, off), nprocs=2, start_method="spawn")
    except mp.ProcessExitedException as exc:
        print(f"a rank died: {exc}")
