"""torch 2.13: DSD on an FSDP1 model does not load through DCP when some rank holds no piece
of some param's optimizer state: dcp.load of the documented template (the fresh optimizer's
get_optimizer_state_dict) raises CheckpointException on every rank, holding the
  RuntimeError: Missing key in checkpoint state_dict: optim.param_groups.
that each rank without a piece raised while planning. The trigger is torch.chunk(dim 0, load world size) giving fewer pieces than ranks, not
dim 0 < world size: a 6-row Linear chunks into 2+2+2 at 4 ranks, so rank 3 has nothing and
fails, though 6 >= 4; a 5-row one chunks into 2+2+1 at 4 ranks (rank 3 fails); a 7-row one
into 2+2+2+1 at 4 ranks and loads. It is not a resharding bug: a 2-row Linear saved and loaded
at 3 ranks fails on rank 2. The save's world size does not matter (6 rows saved at 2 ranks:
3 ranks load, 4 ranks fail).

Run: python notes/repro/dsd_fsdp1_zero_local_shards.py          (the scenarios below, 2-4
     processes each, gloo, CPU; about a minute or two)
     python notes/repro/dsd_fsdp1_zero_local_shards.py SAVE_WS LOAD_WS ROWS USE_ORIG_PARAMS
                                                                   (one scenario, e.g. 2 4 6 1)
Model: FullyShardedDataParallel(nn.Linear(4, ROWS), use_orig_params=...), AdamW; save:
dcp.save({"optim": get_optimizer_state_dict(model, optim)}); load (fresh model and optimizer):
template = get_optimizer_state_dict(model, optim); dcp.load({"optim": template});
set_optimizer_state_dict(model, optim, template).

Output seen on torch 2.13.0+cpu (PYTHONWARNINGS=ignore; <M> stands for "RuntimeError:
Missing key in checkpoint state_dict: optim.param_groups."). Every rank raises
CheckpointException; the RuntimeError inside it is the one of the rank with no piece:
  torch 2.13.0+cpu
  Linear(4, 2) use_orig_params=True, saved at 3, loaded at 3 (torch.chunk gives 2 pieces):
    rank 0: 1 rows of exp_avg: CheckpointException (the ranks that raised it: [2]) ... <M>
    rank 1: 1 rows of exp_avg: CheckpointException (the ranks that raised it: [2]) ... <M>
    rank 2: 0 rows of exp_avg: CheckpointException (the ranks that raised it: [2]) ... <M>
  Linear(4, 2) use_orig_params=False, saved at 3, loaded at 3 (torch.chunk gives 2 pieces):
    rank 0: 1 rows of exp_avg: CheckpointException (the ranks that raised it: [2]) ... <M>
    rank 1: 1 rows of exp_avg: CheckpointException (the ranks that raised it: [2]) ... <M>
    rank 2: 0 rows of exp_avg: CheckpointException (the ranks that raised it: [2]) ... <M>
  Linear(4, 6) use_orig_params=True, saved at 2, loaded at 4 (torch.chunk gives 3 pieces):
    rank 0: 2 rows of exp_avg: CheckpointException (the ranks that raised it: [3]) ... <M>
    rank 1: 2 rows of exp_avg: CheckpointException (the ranks that raised it: [3]) ... <M>
    rank 2: 2 rows of exp_avg: CheckpointException (the ranks that raised it: [3]) ... <M>
    rank 3: 0 rows of exp_avg: CheckpointException (the ranks that raised it: [3]) ... <M>
  Linear(4, 6) use_orig_params=False, saved at 2, loaded at 4 (torch.chunk gives 3 pieces):
    rank 0: 2 rows of exp_avg: CheckpointException (the ranks that raised it: [3]) ... <M>
    rank 1: 2 rows of exp_avg: CheckpointException (the ranks that raised it: [3]) ... <M>
    rank 2: 2 rows of exp_avg: CheckpointException (the ranks that raised it: [3]) ... <M>
    rank 3: 0 rows of exp_avg: CheckpointException (the ranks that raised it: [3]) ... <M>
  Linear(4, 6) use_orig_params=True, saved at 2, loaded at 3 (torch.chunk gives 3 pieces):
    rank 0: 2 rows of exp_avg: loaded
    rank 1: 2 rows of exp_avg: loaded
    rank 2: 2 rows of exp_avg: loaded
  Linear(4, 7) use_orig_params=True, saved at 2, loaded at 4 (torch.chunk gives 4 pieces):
    rank 0: 2 rows of exp_avg: loaded
    rank 1: 2 rows of exp_avg: loaded
    rank 2: 2 rows of exp_avg: loaded
    rank 3: 1 rows of exp_avg: loaded
  Linear(4, 5) use_orig_params=True, saved at 4, loaded at 4 (torch.chunk gives 3 pieces):
    rank 0: 2 rows of exp_avg: CheckpointException (the ranks that raised it: [3]) ... <M>
    rank 1: 2 rows of exp_avg: CheckpointException (the ranks that raised it: [3]) ... <M>
    rank 2: 1 rows of exp_avg: CheckpointException (the ranks that raised it: [3]) ... <M>
    rank 3: 0 rows of exp_avg: CheckpointException (the ranks that raised it: [3]) ... <M>

Mechanism (2.13): FSDP1's sharded optimizer state is one ShardedTensor per state, chunked
along dim 0 over the world size (torch/distributed/fsdp/_shard_utils.py:41-48): a rank past
the last torch.chunk piece holds no local shard. The DCP load planner drops such a
ShardedTensor from the rank's keys (checkpoint/_sharded_tensor_utils.py:38-39), counts its
keys as missing and switches the rank to the pre-2.4 flattening
(checkpoint/default_planner.py:357-370), where param_groups is the single key
'optim.param_groups' that the checkpoint does not have (:495). pytorch PR #163480 describes
it (closed); related: pytorch#137327.
"""
import shutil
import socket
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
import torch.nn as nn


def build(rows, uop):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    torch.manual_seed(0)
    m = FSDP(nn.Linear(4, rows), device_id=torch.device("cpu"), use_orig_params=uop)
    return m, torch.optim.AdamW(m.parameters(), lr=1e-2)


def worker(rank, ws, port, d, rows, uop, save, q):
    from torch.distributed.checkpoint.state_dict import (get_optimizer_state_dict,
                                                         set_optimizer_state_dict)

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=ws, timeout=timedelta(seconds=60))
    try:
        m, o = build(rows, uop)
        if save:
            dcp.save({"optim": get_optimizer_state_dict(m, o)}, checkpoint_id=d)
            return
        t = get_optimizer_state_dict(m, o)
        v = t["state"]["weight"]["exp_avg"]
        rows_here = sum(s.tensor.shape[0] for s in v.local_shards())
        try:
            dcp.load({"optim": t}, checkpoint_id=d)
            set_optimizer_state_dict(m, o, t)
            q.put((rank, f"{rows_here} rows of exp_avg: loaded"))
        except BaseException as e:  # CheckpointException is not an Exception subclass
            lines = str(e).strip().splitlines()
            where = (f" (the ranks that raised it: {sorted(e.failures)})"
                     if hasattr(e, "failures") else "")
            q.put((rank, f"{rows_here} rows of exp_avg: {type(e).__name__}{where} ... "
                         f"{lines[-1]}"))
    finally:
        dist.destroy_process_group()


def spawn(ws, d, rows, uop, save):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(r, ws, port, d, rows, uop, save, q))
          for r in range(ws)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(timeout=180)
        if p.is_alive():
            p.kill()
            print("TIMEOUT")
    out = []
    while not q.empty():
        out.append(q.get())
    return [msg for _, msg in sorted(out)]


def scenario(save_ws, load_ws, rows, uop):
    d = tempfile.mkdtemp()
    try:
        spawn(save_ws, d, rows, uop, True)
        res = spawn(load_ws, d, rows, uop, False)
    finally:
        shutil.rmtree(d)
    pieces = len(torch.chunk(torch.empty(rows), load_ws))
    print(f"Linear(4, {rows}) use_orig_params={uop}, saved at {save_ws}, loaded at {load_ws} "
          f"(torch.chunk gives {pieces} pieces):", flush=True)
    for r, msg in enumerate(res):
        print(f"  rank {r}: {msg}", flush=True)


if __name__ == "__main__":
    print(f"torch {torch.__version__}")
    if len(sys.argv) > 1:
        save_ws, load_ws, rows = (int(a) for a in sys.argv[1:4])
        scenario(save_ws, load_ws, rows, (sys.argv[4] if len(sys.argv) > 4 else "1") == "1")
    else:
        for args in ((3, 3, 2, True), (3, 3, 2, False), (2, 4, 6, True), (2, 4, 6, False),
                     (2, 3, 6, True), (2, 4, 7, True), (4, 4, 5, True)):
            scenario(*args)
