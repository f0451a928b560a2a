"""torch 2.13 and 2.15 (not 2.8): FSDP2 over tensor parallelism cannot load a full state dict
that every rank holds when a column-wise parameter's tp-local rows do not split evenly over
the dp ranks. ``set_model_state_dict`` and ``set_optimizer_state_dict`` with
``full_state_dict=True`` (no ``broadcast_from_rank0``) raise a bare ``AssertionError`` on every
rank. The same dicts load correctly with ``broadcast_from_rank0=True`` (rank 0's dict), and
a DCP sharded save/load of the same model works.

Run: python notes/repro/tp_uneven_full_load.py   (4 processes, gloo, CPU)
Prints, per variant, OK or the exception on each rank. Seen: 2.13.0 and 2.15.0 as above
(``AssertionError:`` with an empty message on ranks 0-3 for both calls without broadcast, OK
with it). 2.8.0 the other way round: OK without broadcast; with ``broadcast_from_rank0``
``set_model_state_dict`` raised ``AssertionError: found no DeviceMesh from dtensor args for
c10d.broadcast_.default!`` on rank 0 and the other ranks printed nothing more.

Mechanism (2.13): _distribute_state_dict (_state_dict_utils.py:721-725) calls
distribute_tensor with the local DTensor's placements; for ``(_StridedShard(0, sf=2),
Shard(0))`` that reaches _StridedShard._shard_tensor (placement_types.py:986-993), which splits
with padding and raises ``AssertionError`` when the padded pieces' shapes differ (its
docstring: it "requires the tensor dimension to be evenly divisible by the number of
chunks"). Here fc1 has 10 rows: 5 per tp rank, 3 + 2 per dp rank. The broadcast path builds
each rank's piece with DTensor.from_local instead. Related upstream: pytorch#136228 (the same
symptom in 2.5, fixed then), pytorch#168134 (open: gaps in uneven strided shards).
"""
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def build(mesh):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 6))
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def run(rank: int, world_size: int, port: int, tmp: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model, optim = build(mesh)
    model(torch.randn(4, 6)).sum().backward()
    optim.step()
    full = StateDictOptions(full_state_dict=True)
    msd = get_model_state_dict(model, options=full)  # collectives: every rank calls them
    osd = get_optimizer_state_dict(model, optim, options=full)
    msd = [msd if rank == 0 else None]
    osd = [osd if rank == 0 else None]
    dist.broadcast_object_list(msd)  # the full dicts on every rank, as a checkpoint read
    dist.broadcast_object_list(osd)  # by every rank gives them
    for bcast in (False, True):
        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=bcast)
        model2, optim2 = build(mesh)
        for what, call in (
                ("set_model_state_dict", lambda: set_model_state_dict(
                    model2, msd[0] if rank == 0 or not bcast else {}, options=opts)),
                ("set_optimizer_state_dict", lambda: set_optimizer_state_dict(
                    model2, optim2, osd[0] if rank == 0 or not bcast else {}, options=opts))):
            try:
                call()
                got = "OK"
            except Exception as exc:  # noqa: BLE001
                got = f"{type(exc).__name__}: {exc}"
            print(f"rank {rank} broadcast_from_rank0={bcast} {what}: {got}", flush=True)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    print("torch", torch.__version__)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(run, args=(4, 29631, tmp), nprocs=4)
