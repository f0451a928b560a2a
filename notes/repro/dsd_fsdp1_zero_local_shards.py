# Minimal repro (torch 2.13.0, CPU, gloo): FSDP1 + DSD get_optimizer_state_dict + the
# documented DCP template load fails with
#   RuntimeError: Missing key in checkpoint state_dict: optim.param_groups.
# on every rank whose dim-0 chunk of some param's optimizer state is empty: FSDP1's sharded
# optimizer state is one ShardedTensor per state chunked along dim 0 over the world size
# (fsdp/_shard_utils.py:41-48: a rank past the last torch.chunk piece has no local shard);
# the DCP load planner drops such a ShardedTensor (_sharded_tensor_utils.py:38-39), counts
# its keys as missing and switches the rank to the pre-2.4 flattening
# (default_planner.py:357-370), where param_groups is the single key 'optim.param_groups'
# the checkpoint does not have (:495). pytorch PR #163480 describes it (closed); related:
# pytorch#137327. Found by fsdp-conformance's DSD-on-FSDP1 paths (branch wip/dsd-on-fsdp1).
# Usage: python dsd_fsdp1_zero_local_shards.py [world_size=2] [out_features=1] [use_orig_params=1]
#   2 1 1 -> fails on rank 1; 2 2 1 -> loads; 3 2 1 -> fails on rank 2.
import sys, socket, tempfile, shutil
from datetime import timedelta
import torch, torch.nn as nn, torch.distributed as dist, torch.multiprocessing as mp
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

def build(out_features, uop):
    torch.manual_seed(0)
    m = FSDP(nn.Linear(4, out_features), device_id=torch.device("cpu"), use_orig_params=uop)
    return m, torch.optim.AdamW(m.parameters(), lr=1e-2)

def worker(rank, ws, port, d, out_features, uop):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=ws, timeout=timedelta(seconds=60))
    try:
        m, o = build(out_features, uop)                    # save side (no training needed)
        dcp.save({"optim": get_optimizer_state_dict(m, o)}, checkpoint_id=d)
        m, o = build(out_features, uop)                    # load side: fresh model + optimizer
        t = get_optimizer_state_dict(m, o)
        v = t['state']['weight']['exp_avg']
        n = len(v.local_shards()) if hasattr(v, 'local_shards') else 'n/a'
        print(f"rank {rank}: state['weight']['exp_avg'] is {type(v).__name__}, local shards = {n}", flush=True)
        try:
            dcp.load({"optim": t}, checkpoint_id=d)
            set_optimizer_state_dict(m, o, t)
            print(f"rank {rank}: load OK", flush=True)
        except BaseException as e:  # CheckpointException is not an Exception subclass
            print(f"rank {rank}: {type(e).__name__}: {str(e).strip().splitlines()[0]} ... {str(e).strip().splitlines()[-1]}", flush=True)
    finally:
        dist.destroy_process_group()

if __name__ == "__main__":
    ws = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    out_features = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    uop = (sys.argv[3] if len(sys.argv) > 3 else "1") == "1"
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    d = tempfile.mkdtemp(dir="/tmp/dsdprobe")
    ctx = mp.get_context("spawn")
    ps = [ctx.Process(target=worker, args=(r, ws, port, d, out_features, uop)) for r in range(ws)]
    for p in ps: p.start()
    for p in ps:
        p.join(timeout=120)
        if p.is_alive(): p.kill(); print("TIMEOUT")
    shutil.rmtree(d)
